// CUDA max and average pooling (NCHW or channels-last, each in its own memory order), hand-written rather than cuDNN so that windows, ties, NaNs,
// divisors and the i64 argmax indices are exactly the CPU backend's (kernels/cpu/pool.cpp).
// Both backwards gather (each input element sums, in output order, the outputs whose window covers
// it), so they are deterministic without atomics and max backward equals the CPU's bit for bit.
#include <atomic>
#include <initializer_list>
#include <type_traits>

#include "kernels/common/checks.h"
#include "kernels/cuda/context.cuh"
#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/device/common.cuh"
#include "kernels/cuda/device/fast_div.h"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/runtime.h"

namespace minidl::cuda {
namespace {

using Geom = common::PoolGeom;

std::atomic<bool> g_pool_wide{false};
std::atomic<bool> g_pool_vector{true};   // set_vector_pool(false): tests compare the two paths

__host__ __device__ __forceinline__ int64_t imin(int64_t a, int64_t b) { return a < b ? a : b; }
__host__ __device__ __forceinline__ int64_t imax(int64_t a, int64_t b) { return a > b ? a : b; }

// Where thread i works: element i of the walked tensor (the output in the forwards, the input
// gradient in the backwards, rows x cols spatially) in memory order, as its row and column, and
// the offsets of its (n, c) plane and of one row and one column step in the input-sized and the
// output-sized tensors. NCHW planes are H*W apart; channels-last ones interleave with stride C.
struct Pos {
  int64_t row, col, in_base, in_rs, in_cs, out_base, out_rs, out_cs;
};

// The divisors of a launch's index arithmetic: the walked tensor's rows and columns, the channels
// (channels-last) and the strides. `fast` (every index and every value divided below 2^31, which
// pool_divs checks on the host) divides with FastDiv; otherwise with 64-bit '/'.
struct PoolDivs {
  bool fast = false;
  FastDiv rows, cols, channels, sh, sw;
};
PoolDivs pool_divs(const Geom& g, int64_t rows, int64_t cols) {
  PoolDivs d;
  const int64_t limit = FastDiv::kLimit / 2;   // room for the window arithmetic beside the indices
  d.fast = !pool_wide_index() && g.planes * g.h * g.w < limit && g.planes * g.oh * g.ow < limit &&
           g.h + g.ph + g.sh < limit && g.w + g.pw + g.sw < limit && g.channels < limit;
  if (d.fast) {
    d.rows = FastDiv(rows);
    d.cols = FastDiv(cols);
    d.channels = FastDiv(g.channels);
    d.sh = FastDiv(g.sh);
    d.sw = FastDiv(g.sw);
  }
  return d;
}

// n / d, with FastDiv when the launch allows it.
__device__ __forceinline__ int64_t divide(const PoolDivs& dv, const FastDiv& f, int64_t n, int64_t d) {
  return dv.fast ? static_cast<int64_t>(f.div(static_cast<uint32_t>(n))) : n / d;
}

__device__ __forceinline__ Pos locate(const Geom& g, const PoolDivs& dv, int64_t i, int64_t rows, int64_t cols) {
  Pos p;
  int64_t q = i, c = 0;
  if (g.nhwc) {
    const int64_t q1 = divide(dv, dv.channels, q, g.channels);
    c = q - q1 * g.channels;
    q = q1;
  }
  const int64_t q2 = divide(dv, dv.cols, q, cols);
  p.col = q - q2 * cols;
  const int64_t outer = divide(dv, dv.rows, q2, rows);   // the (n, c) plane, or n channels-last
  p.row = q2 - outer * rows;
  if (!g.nhwc) {
    p.in_base = outer * g.h * g.w;
    p.out_base = outer * g.oh * g.ow;
    p.in_rs = g.w;
    p.out_rs = g.ow;
    p.in_cs = p.out_cs = 1;
  } else {
    p.in_base = outer * g.h * g.w * g.channels + c;
    p.out_base = outer * g.oh * g.ow * g.channels + c;
    p.in_rs = g.w * g.channels;
    p.out_rs = g.ow * g.channels;
    p.in_cs = p.out_cs = g.channels;
  }
  return p;
}

// PyTorch's separable divisor (see kernels/cpu/pool.cpp).
__device__ __forceinline__ int64_t window_count(int64_t o, int64_t s, int64_t p, int64_t k, int64_t in, bool inc) {
  const int64_t start = o * s - p;
  const int64_t end = imin(start + k, in + p);
  return inc ? end - start : imin(end, in) - imax(start, 0);
}

// Max forward, V channels a thread: V = 1 for any layout, V = vec_width<T>() (16-byte loads and
// stores) for channels-last with the channels a multiple of V. `gv` is the geometry in vectors
// (channels and planes divided by V, vector_geom), so locate() gives offsets in vectors; each lane
// keeps the same rules and order, so the bits and indices are those of V = 1. One channel a thread
// read 2-byte values, 64 bytes a warp, with the index arithmetic repeated for every channel:
// ResNet-50's channels-last stem pool took 1.30 ms at batch 256 on an H100, 0.85 ms in NCHW
// (lab/results/bench/gpu_check_2026-11-26_d10cebe.md).
// Padding acts as -inf; an all -inf window reports its first real element, as the CPU does; the
// first maximum wins and NaN propagates. The index is flat into the H*W plane in either format.
template <typename T, int V>
__global__ void max_fwd_kernel(const T* x, Geom gv, PoolDivs dv, T* y, int64_t* idx) {
  using C = typename Compute<T>::type;
  const int64_t total = gv.planes * gv.oh * gv.ow;
  MINIDL_GRID_STRIDE(i, total) {
    const Pos p = locate(gv, dv, i, gv.oh, gv.ow);
    const int64_t c = p.col, r = p.row;
    const Vec<T, V>* xp = reinterpret_cast<const Vec<T, V>*>(x) + p.in_base;
    const int64_t h0 = imax(r * gv.sh - gv.ph, 0), h1 = imin(r * gv.sh - gv.ph + gv.kh, gv.h);
    const int64_t w0 = imax(c * gv.sw - gv.pw, 0), w1 = imin(c * gv.sw - gv.pw + gv.kw, gv.w);
    C best[V];
    int64_t arg[V];
#pragma unroll
    for (int k = 0; k < V; ++k) {
      best[k] = -INFINITY;
      arg[k] = h0 * gv.w + w0;
    }
    for (int64_t ih = h0; ih < h1; ++ih) {
      for (int64_t iw = w0; iw < w1; ++iw) {
        const Vec<T, V> v = xp[ih * p.in_rs + iw * p.in_cs];
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const C e = cvt<C>(v.v[k]);
          if (e > best[k] || e != e) {
            best[k] = e;
            arg[k] = ih * gv.w + iw;
          }
        }
      }
    }
    Vec<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) {
      out.v[k] = cvt<T>(best[k]);
      idx[i * V + k] = arg[k];
    }
    reinterpret_cast<Vec<T, V>*>(y)[i] = out;
  }
}

template <typename T>
__global__ void avg_fwd_kernel(const T* x, Geom g, PoolDivs dv, T* y) {
  using C = typename Compute<T>::type;
  const int64_t total = g.planes * g.oh * g.ow;
  MINIDL_GRID_STRIDE(i, total) {
    const Pos p = locate(g, dv, i, g.oh, g.ow);
    const int64_t c = p.col, r = p.row;
    const T* xp = x + p.in_base;
    const int64_t h0 = imax(r * g.sh - g.ph, 0), h1 = imin(r * g.sh - g.ph + g.kh, g.h);
    const int64_t w0 = imax(c * g.sw - g.pw, 0), w1 = imin(c * g.sw - g.pw + g.kw, g.w);
    C acc = 0;
    for (int64_t ih = h0; ih < h1; ++ih)
      for (int64_t iw = w0; iw < w1; ++iw) acc += cvt<C>(xp[ih * p.in_rs + iw * p.in_cs]);
    const int64_t div = window_count(r, g.sh, g.ph, g.kh, g.h, g.include_pad) *
                        window_count(c, g.sw, g.pw, g.kw, g.w, g.include_pad);
    y[i] = cvt<T>(acc / static_cast<C>(div));
  }
}

// Output rows (or columns) whose window covers input position `in`: [lo, hi). sd is s's FastDiv.
__device__ __forceinline__ void covering(const PoolDivs& dv, const FastDiv& sd, int64_t in, int64_t s, int64_t p,
                                         int64_t k, int64_t out_size, int64_t& lo, int64_t& hi) {
  // o*s - p <= in < o*s - p + k  <=>  (in + p - k) / s < o <= (in + p) / s
  const int64_t a = in + p - k + 1;   // o*s >= a
  lo = a <= 0 ? 0 : divide(dv, sd, a + s - 1, s);
  hi = imin(divide(dv, sd, in + p, s) + 1, out_size);
  if (hi < lo) hi = lo;
}

// Max backward as a gather: input element (ih, iw) visits the outputs whose window covers it, in
// row-major order, and adds the gradient of those whose saved index is itself. That is the CPU's
// order of addition (it scatters outputs in order into a zeroed plane), so f32/f64 results are the
// CPU's bit for bit and every run gives the same bits (overlapping windows included); f16 adds in
// f32 and rounds once, as the CPU's widened path does. V channels a thread as max_fwd_kernel: each
// lane visits the same outputs in the same order, so V changes no bit.
template <typename T, int V>
__global__ void max_bwd_gather_kernel(const T* gy, const int64_t* idx, Geom gv, PoolDivs dv, T* gx) {
  using C = typename Compute<T>::type;
  const int64_t total = gv.planes * gv.h * gv.w;
  const Vec<T, V>* gyv = reinterpret_cast<const Vec<T, V>*>(gy);
  MINIDL_GRID_STRIDE(i, total) {
    const Pos p = locate(gv, dv, i, gv.h, gv.w);
    const int64_t iw = p.col, ih = p.row;
    int64_t r0, r1, c0, c1;
    covering(dv, dv.sh, ih, gv.sh, gv.ph, gv.kh, gv.oh, r0, r1);
    covering(dv, dv.sw, iw, gv.sw, gv.pw, gv.kw, gv.ow, c0, c1);
    const int64_t self = ih * gv.w + iw;
    C acc[V];
#pragma unroll
    for (int k = 0; k < V; ++k) acc[k] = 0;
    for (int64_t r = r0; r < r1; ++r) {
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t o = p.out_base + r * p.out_rs + c * p.out_cs;
        const Vec<T, V> g = gyv[o];
#pragma unroll
        for (int k = 0; k < V; ++k)
          if (idx[o * V + k] == self) acc[k] += cvt<C>(g.v[k]);
      }
    }
    Vec<T, V> out;
#pragma unroll
    for (int k = 0; k < V; ++k) out.v[k] = cvt<T>(acc[k]);
    reinterpret_cast<Vec<T, V>*>(gx)[i] = out;
  }
}

// Calls f(integral_constant V, the geometry in vectors of V channels) with V = vec_width<T>() when
// a channels-last launch can take V channels a thread (channels a multiple of V, every operand
// 16-byte aligned, set_vector_pool on), else with V = 1 and g itself.
template <typename T, typename F>
void with_pool_width(const Geom& g, std::initializer_list<const void*> ptrs, F&& f) {
  constexpr int V = vec_width<T>();
  bool ok = g.nhwc && V > 1 && g.channels % V == 0 && g_pool_vector;
  for (const void* q : ptrs) ok = ok && aligned16(q);
  if (!ok) return f(std::integral_constant<int, 1>{}, g);
  Geom gv = g;
  gv.channels = g.channels / V;
  gv.planes = g.planes / V;
  f(std::integral_constant<int, V>{}, gv);
}

template <typename T>
__global__ void avg_bwd_kernel(const T* gy, Geom g, PoolDivs dv, T* gx) {
  using C = typename Compute<T>::type;
  const int64_t total = g.planes * g.h * g.w;
  MINIDL_GRID_STRIDE(i, total) {
    const Pos p = locate(g, dv, i, g.h, g.w);
    const int64_t iw = p.col, ih = p.row;
    int64_t r0, r1, c0, c1;
    covering(dv, dv.sh, ih, g.sh, g.ph, g.kh, g.oh, r0, r1);
    covering(dv, dv.sw, iw, g.sw, g.pw, g.kw, g.ow, c0, c1);
    C acc = 0;
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t hc = window_count(r, g.sh, g.ph, g.kh, g.h, g.include_pad);
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t div = hc * window_count(c, g.sw, g.pw, g.kw, g.w, g.include_pad);
        acc += cvt<C>(gy[p.out_base + r * p.out_rs + c * p.out_cs]) / static_cast<C>(div);
      }
    }
    gx[i] = cvt<T>(acc);
  }
}

}  // namespace

void set_pool_wide_index(bool on) { g_pool_wide = on; }
bool pool_wide_index() { return g_pool_wide; }
void set_vector_pool(bool on) { g_pool_vector = on; }
bool vector_pool() { return g_pool_vector; }

void CudaBackend::max_pool2d_forward(const Tensor& x, const Pool2dOptions& o, const Tensor& y, const Tensor& indices) {
  check_cuda("max_pool2d_forward", {&x, &y, &indices});
  const bool cl = check_memory_format("max_pool2d_forward", {&x, &y, &indices});
  MINIDL_CHECK(indices.dtype() == DType::i64 && indices.shape() == y.shape() && y.dtype() == x.dtype(),
               "max_pool2d_forward (cuda): indices must be i64 with the output's shape ", shape_str(y.shape()),
               ", got ", indices.meta());
  const Geom g = common::pool_geom("cuda", x.shape(), y.shape(), o, "max_pool2d_forward", cl);
  const int64_t n = y.numel();
  if (n == 0) return;
  DeviceContext& ctx = context_of(x);
  dispatch_floating(x.dtype(), "max_pool2d_forward", [&](auto tag) {
    using T = decltype(tag);
    with_pool_width<T>(g, {x.data_ptr(), y.data_ptr(), indices.data_ptr()}, [&](auto vtag, const Geom& gv) {
      constexpr int V = decltype(vtag)::value;
      // The launch's text names the width (MINIDL_LAUNCH would write <T, V> for both).
      launch_kernel("max_pool2d_forward", V == 1 ? "(max_fwd_kernel<T, 1>)" : "(max_fwd_kernel<T, V>)",
                    max_fwd_kernel<T, V>, grid_for(n / V), kThreads, 0, ctx.stream(),
                    static_cast<const T*>(x.data_ptr()), gv, pool_divs(gv, gv.oh, gv.ow),
                    static_cast<T*>(y.data_ptr()), static_cast<int64_t*>(indices.data_ptr()));
    });
  });
}

void CudaBackend::max_pool2d_backward(const Tensor& gy, const Tensor& indices, const Pool2dOptions& o,
                                      const Tensor& gx) {
  check_cuda("max_pool2d_backward", {&gy, &indices, &gx});
  const bool cl = check_memory_format("max_pool2d_backward", {&gy, &indices, &gx});
  MINIDL_CHECK(gy.dim() == 4 && gx.dim() == 4 && indices.shape() == gy.shape() && indices.dtype() == DType::i64 &&
                   gy.size(0) == gx.size(0) && gy.size(1) == gx.size(1) && gy.dtype() == gx.dtype(),
               "max_pool2d_backward (cuda): inconsistent tensors: grad ", gy.meta(), ", indices ", indices.meta(),
               ", input grad ", gx.meta());
  const Geom g = common::pool_geom("cuda", gx.shape(), gy.shape(), o, "max_pool2d_backward", cl);
  const int64_t n = gx.numel();
  if (n == 0) return;
  DeviceContext& ctx = context_of(gy);
  dispatch_floating(gy.dtype(), "max_pool2d_backward", [&](auto tag) {
    using T = decltype(tag);
    with_pool_width<T>(g, {gy.data_ptr(), gx.data_ptr(), indices.data_ptr()}, [&](auto vtag, const Geom& gv) {
      constexpr int V = decltype(vtag)::value;
      launch_kernel("max_pool2d_backward", V == 1 ? "(max_bwd_gather_kernel<T, 1>)" : "(max_bwd_gather_kernel<T, V>)",
                    max_bwd_gather_kernel<T, V>, grid_for(n / V), kThreads, 0, ctx.stream(),
                    static_cast<const T*>(gy.data_ptr()), static_cast<const int64_t*>(indices.data_ptr()), gv,
                    pool_divs(gv, gv.h, gv.w), static_cast<T*>(gx.data_ptr()));
    });
  });
}

void CudaBackend::avg_pool2d_forward(const Tensor& x, const Pool2dOptions& o, const Tensor& y) {
  check_cuda("avg_pool2d_forward", {&x, &y});
  const bool cl = check_memory_format("avg_pool2d_forward", {&x, &y});
  const Geom g = common::pool_geom("cuda", x.shape(), y.shape(), o, "avg_pool2d_forward", cl);
  const int64_t n = y.numel();
  if (n == 0) return;
  DeviceContext& ctx = context_of(x);
  dispatch_floating(x.dtype(), "avg_pool2d_forward", [&](auto tag) {
    using T = decltype(tag);
    MINIDL_LAUNCH_NOWAIT("avg_pool2d_forward", (avg_fwd_kernel<T>), grid_for(n), kThreads, 0, ctx.stream(),
                         static_cast<const T*>(x.data_ptr()), g, pool_divs(g, g.oh, g.ow),
                         static_cast<T*>(y.data_ptr()));
  });
}

void CudaBackend::avg_pool2d_backward(const Tensor& gy, const Pool2dOptions& o, const Tensor& gx) {
  check_cuda("avg_pool2d_backward", {&gy, &gx});
  const bool cl = check_memory_format("avg_pool2d_backward", {&gy, &gx});
  const Geom g = common::pool_geom("cuda", gx.shape(), gy.shape(), o, "avg_pool2d_backward", cl);
  const int64_t n = gx.numel();
  if (n == 0) return;
  DeviceContext& ctx = context_of(gy);
  dispatch_floating(gy.dtype(), "avg_pool2d_backward", [&](auto tag) {
    using T = decltype(tag);
    MINIDL_LAUNCH_NOWAIT("avg_pool2d_backward", (avg_bwd_kernel<T>), grid_for(n), kThreads, 0, ctx.stream(),
                         static_cast<const T*>(gy.data_ptr()), g, pool_divs(g, g.h, g.w),
                         static_cast<T*>(gx.data_ptr()));
  });
}

}  // namespace minidl::cuda
