// CPU max and average pooling (NCHW) with PyTorch's exact window, tie and divisor rules, so the
// CPU results can serve as the reference for the cuDNN path. Planes (n, c) are independent, which
// makes them the unit of OpenMP work in both directions without any atomics.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>


#include "core/tensor.h"
#include "kernels/cpu/avx512.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/half.h"
#include "kernels/common/checks.h"

namespace minidl::cpu {

namespace {

using common::PoolGeom;

// Below this many element visits a parallel region costs more than it saves.
constexpr int64_t kParallelWork = 32768;

// Output columns [lo, hi) within [c0, c1) whose window column kj lands inside the input
// (input column = c * sw + off).
inline void valid_cols(const PoolGeom& g, int64_t kj, int64_t c0, int64_t c1, int64_t& lo, int64_t& hi,
                       int64_t& off) {
  off = kj - g.pw;
  lo = off >= 0 ? 0 : (-off + g.sw - 1) / g.sw;
  hi = g.w - off <= 0 ? 0 : (g.w - off + g.sw - 1) / g.sw;
  lo = std::max(lo, c0);
  hi = std::clamp(hi, lo, c1);
  lo = std::min(lo, hi);
}

// The kernels sweep one output row at a time in chunks of kChunk columns, window element by window
// element, with the output column innermost: independent, branch-free lanes the compiler
// vectorises, kept in small local arrays so nothing aliases them. Each output still visits its
// window in PyTorch's row-major order, so ties and NaNs resolve as in PyTorch.
constexpr int64_t kChunk = 256;

// PyTorch's divisor is separable: (window rows) x (window cols), each clipped to the padded input,
// or to the real input when padding is not counted.
inline int64_t window_count(int64_t o, int64_t s, int64_t p, int64_t k, int64_t in, bool include_pad) {
  const int64_t start = o * s - p;
  const int64_t end = std::min(start + k, in + p);
  return include_pad ? end - start : std::min(end, in) - std::max<int64_t>(start, 0);
}

// SW: the column stride when known at compile time (1, 2: the common cases), 0 for g.sw.
template <typename T, int SW>
void max_forward(const T* x, const PoolGeom& g, T* y, int64_t* idx) {
  const int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
  const int64_t stride = SW > 0 ? SW : g.sw;
#pragma omp parallel for schedule(static) if (g.planes > 1 && g.planes * out_plane * g.kh * g.kw > kParallelWork)
  for (int64_t pl = 0; pl < g.planes; ++pl) {
    alignas(64) T best[kChunk];
    alignas(64) int32_t arg[kChunk];
    const T* xp = x + pl * in_plane;
    for (int64_t r = 0; r < g.oh; ++r) {
      const int64_t h0 = std::max<int64_t>(r * g.sh - g.ph, 0);
      const int64_t h1 = std::min(r * g.sh - g.ph + g.kh, g.h);
      for (int64_t c0 = 0; c0 < g.ow; c0 += kChunk) {
        const int64_t c1 = std::min(g.ow, c0 + kChunk);
        // Padding acts as -inf; an all -inf window reports its first real element, as PyTorch does.
        for (int64_t c = c0; c < c1; ++c) {
          best[c - c0] = -std::numeric_limits<T>::infinity();
          arg[c - c0] = static_cast<int32_t>(h0 * g.w + std::max<int64_t>(c * g.sw - g.pw, 0));
        }
        for (int64_t ih = h0; ih < h1; ++ih) {
          const T* row = xp + ih * g.w;
          for (int64_t kj = 0; kj < g.kw; ++kj) {
            int64_t lo, hi, off;
            valid_cols(g, kj, c0, c1, lo, hi, off);
            const T* src = row + off;  // src[c * sw] for c in [lo, hi) is inside the row
            const int32_t base = static_cast<int32_t>(ih * g.w + off + c0 * stride);
            const int32_t sw = static_cast<int32_t>(stride);
            const T* s0 = src + c0 * stride;
            for (int32_t c = static_cast<int32_t>(lo - c0); c < static_cast<int32_t>(hi - c0); ++c) {
              const T v = s0[c * stride];
              const bool take = (v > best[c]) | (v != v);  // first maximum wins; NaN propagates
              best[c] = take ? v : best[c];
              arg[c] = take ? base + c * sw : arg[c];
            }
          }
        }
        T* yo = y + pl * out_plane + r * g.ow;
        int64_t* io = idx + pl * out_plane + r * g.ow;
        for (int64_t c = c0; c < c1; ++c) {
          yo[c] = best[c - c0];
          io[c] = arg[c - c0];
        }
      }
    }
  }
}

#if defined(__AVX512F__)
// f32 with a column stride of 2 (ResNet's stem pool, 3x3; the small CNN's, 2x2), 16 outputs of a
// row at a time: a stride-2 read does not vectorise as written above, so each tap loads 32
// consecutive columns (masked: columns outside the row read as -inf, never taken, the same as
// skipping them) and keeps the even ones. Taps run in the same order with the same comparison, so
// values, ties and NaNs come out as from the loop above; the pool tests run both (f32 and f64).
void max_forward_f32_s2(const float* x, const PoolGeom& g, float* y, int64_t* idx) {
  const int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
  const __m512i lane2 = _mm512_slli_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0), 1);
  const __m512 ninf = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  // The 16 columns from p (row column `first`, of which the first n are wanted), -inf outside the
  // row. Masked loads only at a row's edges: on the Zen 5 machine a masked load was slow whenever
  // its 64 bytes crossed a page (about one load in 64 here; 30% of the small CNN's step went to them).
  auto load16 = [&](const float* p, int64_t first, int64_t n) {
    const __mmask16 m = avx512::lanes(std::max<int64_t>(-first, 0), std::min(n, g.w - first));
    if (m == 0xFFFF) return _mm512_loadu_ps(p);
    return m == 0 ? ninf : _mm512_mask_loadu_ps(ninf, m, p);
  };
#pragma omp parallel for schedule(static) if (g.planes > 1 && g.planes * out_plane * g.kh * g.kw > kParallelWork)
  for (int64_t pl = 0; pl < g.planes; ++pl) {
    const float* xp = x + pl * in_plane;
    for (int64_t r = 0; r < g.oh; ++r) {
      const int64_t h0 = std::max<int64_t>(r * g.sh - g.ph, 0);
      const int64_t h1 = std::min(r * g.sh - g.ph + g.kh, g.h);
      // Chunks of up to kChunk outputs, their row's window rows and taps outermost (the loop above's
      // order): each input row is read front to back, and the outputs are stored after the loads.
      for (int64_t k0 = 0; k0 < g.ow; k0 += kChunk) {
        const int64_t groups = (std::min(g.ow, k0 + kChunk) - k0 + 15) / 16;
        __m512 best[kChunk / 16];
        __m512i arg[kChunk / 16];
        for (int64_t q = 0; q < groups; ++q) {
          // An all -inf window reports its first real element, as the loop above does.
          const __m512i first_col = _mm512_max_epi32(
              _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(2 * (k0 + 16 * q) - g.pw)), lane2),
              _mm512_setzero_si512());
          arg[q] = _mm512_add_epi32(first_col, _mm512_set1_epi32(static_cast<int32_t>(h0 * g.w)));
          best[q] = ninf;
        }
        for (int64_t ih = h0; ih < h1; ++ih) {
          const float* row = xp + ih * g.w;
          for (int64_t kj = 0; kj < g.kw; ++kj) {
            for (int64_t q = 0; q < groups; ++q) {
              const int64_t c0 = k0 + 16 * q, n = std::min<int64_t>(16, g.ow - c0);
              const int64_t first = 2 * c0 - g.pw + kj;  // the input column of this tap for output c0
              const __m512 v = avx512::even_lanes(load16(row + first, first, 2 * n),
                                                  load16(row + first + 16, first + 16, 2 * n - 16));
              const __mmask16 take =
                  _mm512_cmp_ps_mask(v, best[q], _CMP_GT_OQ) | _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
              best[q] = _mm512_mask_mov_ps(best[q], take, v);
              const __m512i at = _mm512_add_epi32(_mm512_set1_epi32(static_cast<int32_t>(ih * g.w + first)), lane2);
              arg[q] = _mm512_mask_mov_epi32(arg[q], take, at);
            }
          }
        }
        for (int64_t q = 0; q < groups; ++q) {
          const int64_t c0 = k0 + 16 * q, n = std::min<int64_t>(16, g.ow - c0);
          const int64_t o = pl * out_plane + r * g.ow + c0;
          const __m512i lo = _mm512_cvtepi32_epi64(_mm512_castsi512_si256(arg[q]));
          const __m512i hi = _mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(arg[q], 1));
          if (n == 16) {
            _mm512_storeu_ps(y + o, best[q]);
            _mm512_storeu_si512(idx + o, lo);
            _mm512_storeu_si512(idx + o + 8, hi);
          } else {
            const __mmask16 out = static_cast<__mmask16>((1u << n) - 1);
            _mm512_mask_storeu_ps(y + o, out, best[q]);
            _mm512_mask_storeu_epi64(idx + o, static_cast<__mmask8>(out), lo);
            _mm512_mask_storeu_epi64(idx + o + 8, static_cast<__mmask8>(out >> 8), hi);
          }
        }
      }
    }
  }
}
#endif

template <typename T>
void max_forward(const T* x, const PoolGeom& g, T* y, int64_t* idx) {
  // Offsets inside one plane are tracked in 32 bits, which vectorise alongside f32 values.
  MINIDL_CHECK(g.h * g.w <= std::numeric_limits<int32_t>::max(), "max_pool2d_forward (cpu): input plane of ",
               g.h * g.w, " elements is too large (at most 2^31 - 1)");
  if (g.sw == 1) return max_forward<T, 1>(x, g, y, idx);
#if defined(__AVX512F__)
  if constexpr (std::is_same_v<T, float>) {
    if (g.sw == 2) return max_forward_f32_s2(x, g, y, idx);
  }
#endif
  if (g.sw == 2) return max_forward<T, 2>(x, g, y, idx);
  max_forward<T, 0>(x, g, y, idx);
}

template <typename T>
void max_backward(const T* gy, const int64_t* idx, int64_t planes, int64_t out_plane, int64_t in_plane, T* gx) {
#pragma omp parallel for schedule(static) if (planes > 1 && planes * (in_plane + out_plane) > kParallelWork)
  for (int64_t pl = 0; pl < planes; ++pl) {
    T* gp = gx + pl * in_plane;
    std::fill(gp, gp + in_plane, T(0));
    const T* gyp = gy + pl * out_plane;
    const int64_t* ip = idx + pl * out_plane;
    for (int64_t i = 0; i < out_plane; ++i) gp[ip[i]] += gyp[i];
  }
}

template <typename T>
void avg_forward(const T* x, const PoolGeom& g, bool include_pad, T* y) {
  const int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
#pragma omp parallel for schedule(static) if (g.planes > 1 && g.planes * out_plane * g.kh * g.kw > kParallelWork)
  for (int64_t pl = 0; pl < g.planes; ++pl) {
    alignas(64) T acc[kChunk];
    const T* xp = x + pl * in_plane;
    for (int64_t r = 0; r < g.oh; ++r) {
      const int64_t h0 = std::max<int64_t>(r * g.sh - g.ph, 0);
      const int64_t h1 = std::min(r * g.sh - g.ph + g.kh, g.h);
      const int64_t hc = window_count(r, g.sh, g.ph, g.kh, g.h, include_pad);
      for (int64_t c0 = 0; c0 < g.ow; c0 += kChunk) {
        const int64_t c1 = std::min(g.ow, c0 + kChunk);
        std::fill(acc, acc + (c1 - c0), T(0));
        for (int64_t ih = h0; ih < h1; ++ih) {
          const T* row = xp + ih * g.w;
          for (int64_t kj = 0; kj < g.kw; ++kj) {
            int64_t lo, hi, off;
            valid_cols(g, kj, c0, c1, lo, hi, off);
            const T* src = row + off;
            for (int64_t c = lo; c < hi; ++c) acc[c - c0] += src[c * g.sw];
          }
        }
        T* yo = y + pl * out_plane + r * g.ow;
        for (int64_t c = c0; c < c1; ++c) {
          yo[c] = acc[c - c0] / static_cast<T>(hc * window_count(c, g.sw, g.pw, g.kw, g.w, include_pad));
        }
      }
    }
  }
}

template <typename T>
void avg_backward(const T* gy, const PoolGeom& g, bool include_pad, T* gx) {
  const int64_t in_plane = g.h * g.w, out_plane = g.oh * g.ow;
#pragma omp parallel for schedule(static) \
    if (g.planes > 1 && g.planes * (in_plane + out_plane * g.kh * g.kw) > kParallelWork)
  for (int64_t pl = 0; pl < g.planes; ++pl) {
    alignas(64) T scaled[kChunk];
    T* gp = gx + pl * in_plane;
    std::fill(gp, gp + in_plane, T(0));
    for (int64_t r = 0; r < g.oh; ++r) {
      const T* grow = gy + pl * out_plane + r * g.ow;
      const int64_t hc = window_count(r, g.sh, g.ph, g.kh, g.h, include_pad);
      const int64_t h0 = std::max<int64_t>(r * g.sh - g.ph, 0);
      const int64_t h1 = std::min(r * g.sh - g.ph + g.kh, g.h);
      for (int64_t c0 = 0; c0 < g.ow; c0 += kChunk) {
        const int64_t c1 = std::min(g.ow, c0 + kChunk);
        for (int64_t c = c0; c < c1; ++c) {
          scaled[c - c0] = grow[c] / static_cast<T>(hc * window_count(c, g.sw, g.pw, g.kw, g.w, include_pad));
        }
        for (int64_t ih = h0; ih < h1; ++ih) {
          T* dst = gp + ih * g.w;
          for (int64_t kj = 0; kj < g.kw; ++kj) {
            int64_t lo, hi, off;
            valid_cols(g, kj, c0, c1, lo, hi, off);
            T* d = dst + off;
            for (int64_t c = lo; c < hi; ++c) d[c * g.sw] += scaled[c - c0];
          }
        }
      }
    }
  }
}

}  // namespace

void CpuBackend::max_pool2d_forward(const Tensor& x, const Pool2dOptions& o, const Tensor& y, const Tensor& indices) {
  if (any_channels_last({&x, &y, &indices})) {
    const Tensor yc = empty(y.shape(), y.options()), ic = empty(indices.shape(), indices.options());
    max_pool2d_forward(x.contiguous(), o, yc, ic);
    copy(yc, y);
    return copy(ic, indices);
  }
  common::check_contiguous("cpu", "max_pool2d_forward", {&x, &y, &indices});
  MINIDL_CHECK(indices.dtype() == DType::i64 && indices.shape() == y.shape(),
               "max_pool2d_forward (cpu): indices must be i64 with the output's shape ", shape_str(y.shape()),
               ", got ", indices.meta());
  const PoolGeom g = common::pool_geom("cpu", x.shape(), y.shape(), o, "max_pool2d_forward");
  if (is_half(x) || is_half(y)) {  // f16, bf16: the f32 kernel on widened copies (max is exact)
    return in_f32(y, [&](const Tensor& yf) { max_pool2d_forward(widen_half(x), o, yf, indices); });
  }
  dispatch_wide(x.dtype(), "max_pool2d_forward", [&](auto t) {
    using T = decltype(t);
    max_forward(x.data<T>(), g, y.data<T>(), indices.data<int64_t>());
  });
}

// The CPU scatters each plane's outputs in order (deterministic as it is); o is not needed.
void CpuBackend::max_pool2d_backward(const Tensor& gy, const Tensor& indices, const Pool2dOptions& o,
                                     const Tensor& gx) {
  if (any_channels_last({&gy, &indices, &gx})) {
    return in_nchw(gx, [&](const Tensor& gxc) { max_pool2d_backward(gy.contiguous(), indices.contiguous(), o, gxc); });
  }
  common::check_contiguous("cpu", "max_pool2d_backward", {&gy, &indices, &gx});
  MINIDL_CHECK(gy.dim() == 4 && gx.dim() == 4 && indices.shape() == gy.shape() && indices.dtype() == DType::i64 &&
                   gy.size(0) == gx.size(0) && gy.size(1) == gx.size(1),
               "max_pool2d_backward (cpu): inconsistent tensors: grad ", gy.meta(), ", indices ", indices.meta(),
               ", input grad ", gx.meta());
  if (is_half(gy) || is_half(gx)) {
    return in_f32(gx, [&](const Tensor& gxf) { max_pool2d_backward(widen_half(gy), indices, o, gxf); });
  }
  const int64_t planes = gy.size(0) * gy.size(1);
  const int64_t out_plane = gy.size(2) * gy.size(3), in_plane = gx.size(2) * gx.size(3);
  dispatch_wide(gy.dtype(), "max_pool2d_backward", [&](auto t) {
    using T = decltype(t);
    max_backward(gy.data<T>(), indices.data<int64_t>(), planes, out_plane, in_plane, gx.data<T>());
  });
}

void CpuBackend::avg_pool2d_forward(const Tensor& x, const Pool2dOptions& o, const Tensor& y) {
  if (any_channels_last({&x, &y})) {
    return in_nchw(y, [&](const Tensor& yc) { avg_pool2d_forward(x.contiguous(), o, yc); });
  }
  common::check_contiguous("cpu", "avg_pool2d_forward", {&x, &y});
  const PoolGeom g = common::pool_geom("cpu", x.shape(), y.shape(), o, "avg_pool2d_forward");
  if (is_half(x) || is_half(y)) {
    return in_f32(y, [&](const Tensor& yf) { avg_pool2d_forward(widen_half(x), o, yf); });
  }
  dispatch_wide(x.dtype(), "avg_pool2d_forward", [&](auto t) {
    using T = decltype(t);
    avg_forward(x.data<T>(), g, o.count_include_pad, y.data<T>());
  });
}

void CpuBackend::avg_pool2d_backward(const Tensor& gy, const Pool2dOptions& o, const Tensor& gx) {
  if (any_channels_last({&gy, &gx})) {
    return in_nchw(gx, [&](const Tensor& gxc) { avg_pool2d_backward(gy.contiguous(), o, gxc); });
  }
  common::check_contiguous("cpu", "avg_pool2d_backward", {&gy, &gx});
  const PoolGeom g = common::pool_geom("cpu", gx.shape(), gy.shape(), o, "avg_pool2d_backward");
  if (is_half(gy) || is_half(gx)) {
    return in_f32(gx, [&](const Tensor& gxf) { avg_pool2d_backward(widen_half(gy), o, gxf); });
  }
  dispatch_wide(gy.dtype(), "avg_pool2d_backward", [&](auto t) {
    using T = decltype(t);
    avg_backward(gy.data<T>(), g, o.count_include_pad, gx.data<T>());
  });
}

}  // namespace minidl::cpu
