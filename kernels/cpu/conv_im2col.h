// im2col / col2im for the CPU convolution (kernels/cpu/conv.cpp), split out to keep that file about
// its GEMM planning: the generic row-band copies and the padded-plane versions that the small planes
// of deep ResNet stages need to keep the copies cheaper than the GEMMs they feed.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "kernels/cpu/avx512.h"

namespace minidl::cpu::conv_detail {

struct ConvGeom {
  int64_t n, c, h, w;     // input
  int64_t o, kh, kw;      // weight
  int64_t oh, ow;         // output
  int64_t sh, sw, ph, pw, dh, dw;

  int64_t k() const { return c * kh * kw; }  // GEMM inner dimension (rows of the column matrix)
  int64_t p() const { return oh * ow; }      // output pixels per sample
  int64_t in_size() const { return c * h * w; }
  // Input and output pixels coincide: the input plane is the column matrix itself.
  bool pointwise() const { return kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0; }
};

// Valid output columns [lo, hi) for kernel column offset `off` (input column = j * s + off).
inline void valid_range(int64_t off, int64_t s, int64_t in, int64_t out, int64_t& lo, int64_t& hi) {
  lo = off >= 0 ? 0 : (-off + s - 1) / s;
  hi = in - off <= 0 ? 0 : (in - off + s - 1) / s;
  lo = std::min(lo, out);
  hi = std::clamp(hi, lo, out);
}

// Output rows [r0, r1) of channel c of one sample's input [C, H, W] -> the column rows of that
// channel (kH*kW of them, starting at col) x [(r1-r0)*oW], row stride ld.
template <typename T>
void im2col(const T* x, const ConvGeom& g, int64_t c, int64_t r0, int64_t r1, T* col, int64_t ld) {
  const T* xc = x + c * g.h * g.w;
  if (g.pointwise()) {
    std::memcpy(col, xc + r0 * g.ow, sizeof(T) * (r1 - r0) * g.ow);
    return;
  }
  for (int64_t ki = 0; ki < g.kh; ++ki) {
    for (int64_t kj = 0; kj < g.kw; ++kj) {
      T* dst = col + (ki * g.kw + kj) * ld;
      const int64_t off_w = kj * g.dw - g.pw;
      int64_t lo, hi;
      valid_range(off_w, g.sw, g.w, g.ow, lo, hi);
      for (int64_t r = r0; r < r1; ++r) {
        T* d = dst + (r - r0) * g.ow;
        const int64_t ih = r * g.sh - g.ph + ki * g.dh;
        if (ih < 0 || ih >= g.h) {
          std::fill(d, d + g.ow, T(0));
          continue;
        }
        std::fill(d, d + lo, T(0));
        const T* src = xc + ih * g.w;
        if (g.sw == 1) {
          if (hi > lo) std::memcpy(d + lo, src + lo + off_w, sizeof(T) * (hi - lo));
        } else {
          for (int64_t j = lo; j < hi; ++j) d[j] = src[j * g.sw + off_w];
        }
        std::fill(d + hi, d + g.ow, T(0));
      }
    }
  }
}

// The adjoint of im2col: adds the column rows of channel c for output rows [r0, r1) into that
// channel's plane of one sample's gradient [C, H, W].
template <typename T>
void col2im(const T* col, int64_t ld, const ConvGeom& g, int64_t c, int64_t r0, int64_t r1, T* gx) {
  T* gc = gx + c * g.h * g.w;
  if (g.pointwise()) {
    T* d = gc + r0 * g.ow;
    const int64_t n = (r1 - r0) * g.ow;
    for (int64_t j = 0; j < n; ++j) d[j] += col[j];
    return;
  }
  for (int64_t ki = 0; ki < g.kh; ++ki) {
    for (int64_t kj = 0; kj < g.kw; ++kj) {
      const T* src = col + (ki * g.kw + kj) * ld;
      const int64_t off_w = kj * g.dw - g.pw;
      int64_t lo, hi;
      valid_range(off_w, g.sw, g.w, g.ow, lo, hi);
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t ih = r * g.sh - g.ph + ki * g.dh;
        if (ih < 0 || ih >= g.h) continue;
        const T* s = src + (r - r0) * g.ow;
        T* d = gc + ih * g.w;
        if (g.sw == 1) {
          for (int64_t j = lo; j < hi; ++j) d[j + off_w] += s[j];
        } else {
          for (int64_t j = lo; j < hi; ++j) d[j * g.sw + off_w] += s[j];
        }
      }
    }
  }
}

// Bands of whole output rows are the common case, and for the small planes of deep ResNet stages
// rows are only 2-16 values wide: per-row memcpy/fill calls and border tests cost more than the
// copies. These versions first zero-pad the input rows a band reads into a stack buffer, so every
// tap is a branch-free strided copy, with the width and stride compile-time constants for the
// usual shapes (fully unrolled vector moves).
constexpr int64_t kPadPlaneMax = 72 * 72;  // padded input elements kept on the stack

// Padded input rows [pr0, pr1) read by output rows [r0, r1).
inline int64_t band_first(const ConvGeom& g, int64_t r0) { return r0 * g.sh; }
inline int64_t band_end(const ConvGeom& g, int64_t r1) { return (r1 - 1) * g.sh + (g.kh - 1) * g.dh + 1; }

// 1x1 kernels read each input value at most once: padding first would only add a copy.
inline bool pad_band_ok(const ConvGeom& g, int64_t rows) {
  const int64_t wp = g.w + 2 * g.pw;
  return g.kh * g.kw > 1 && (band_end(g, rows) - band_first(g, 0)) * wp <= kPadPlaneMax &&
         (g.ow - 1) * g.sw + (g.kw - 1) * g.dw < wp;
}

// Width and stride of one output row: template constants when OW > 0, otherwise the runtime values.
template <int OW, int SW>
struct RowShape {
  static int64_t ow(const ConvGeom& g) { return OW > 0 ? OW : g.ow; }
  static int64_t sw(const ConvGeom& g) { return OW > 0 ? SW : g.sw; }
};

// Padded rows [pr0, pr1) of one input channel plane into pad ([pr1 - pr0, W + 2 pW]).
template <typename T>
void pad_rows(const T* xc, const ConvGeom& g, int64_t pr0, int64_t pr1, T* pad) {
  const int64_t wp = g.w + 2 * g.pw;
  for (int64_t pr = pr0; pr < pr1; ++pr) {
    T* d = pad + (pr - pr0) * wp;
    const int64_t i = pr - g.ph;
    if (i < 0 || i >= g.h) {
      std::fill(d, d + wp, T(0));
      continue;
    }
    for (int64_t j = 0; j < g.pw; ++j) d[j] = T(0);
    for (int64_t j = 0; j < g.w; ++j) d[g.pw + j] = xc[i * g.w + j];
    for (int64_t j = g.pw + g.w; j < wp; ++j) d[j] = T(0);
  }
}

#if defined(__AVX512F__)
// d[j] = s[2 j] for j < n (f32): a stride-2 read does not vectorise as written in the loop below
// (the stems of the ResNets: 7x7, stride 2), so 32 consecutive values are loaded and the even ones
// kept. The last vector of a row stops at s[2 n - 2], the last value it needs (masked; the padded
// rows are on the stack, hot in cache).
inline void copy_even(const float* s, float* d, int64_t n) {
  int64_t j = 0;
  for (; j + 16 < n; j += 16) {  // s[2 j + 31] is still inside the row's values
    _mm512_storeu_ps(d + j, avx512::even_lanes(_mm512_loadu_ps(s + 2 * j), _mm512_loadu_ps(s + 2 * j + 16)));
  }
  const int64_t need = 2 * (n - j) - 1;  // values s[2 j .. 2 n - 2]
  const __m512 a = _mm512_maskz_loadu_ps(avx512::lanes(need), s + 2 * j);
  const __m512 b = _mm512_maskz_loadu_ps(avx512::lanes(need - 16), s + 2 * j + 16);
  _mm512_mask_storeu_ps(d + j, avx512::lanes(n - j), avx512::even_lanes(a, b));
}
#endif

template <typename T, int OW, int SW>
void im2col_plane_impl(const T* pad, const ConvGeom& g, int64_t nrows, T* col, int64_t ld) {
  const int64_t wp = g.w + 2 * g.pw, ow = RowShape<OW, SW>::ow(g), sw = RowShape<OW, SW>::sw(g);
  for (int64_t ki = 0; ki < g.kh; ++ki) {
    for (int64_t kj = 0; kj < g.kw; ++kj) {
      T* dst = col + (ki * g.kw + kj) * ld;
      const T* src = pad + ki * g.dh * wp + kj * g.dw;
      for (int64_t r = 0; r < nrows; ++r) {
        const T* s = src + r * g.sh * wp;
        T* d = dst + r * ow;
#if defined(__AVX512F__)
        if constexpr (std::is_same_v<T, float>) {
          if (sw == 2 && ow >= 8) {
            copy_even(s, d, ow);
            continue;
          }
        }
#endif
        for (int64_t j = 0; j < ow; ++j) d[j] = s[j * sw];
      }
    }
  }
}
template <typename T, int OW, int SW>
void col2im_plane_impl(const T* col, int64_t ld, const ConvGeom& g, T* acc) {
  const int64_t wp = g.w + 2 * g.pw, ow = RowShape<OW, SW>::ow(g), sw = RowShape<OW, SW>::sw(g);
  for (int64_t ki = 0; ki < g.kh; ++ki) {
    for (int64_t kj = 0; kj < g.kw; ++kj) {
      const T* src = col + (ki * g.kw + kj) * ld;
      T* dst = acc + ki * g.dh * wp + kj * g.dw;
      for (int64_t r = 0; r < g.oh; ++r) {
        T* d = dst + r * g.sh * wp;
        const T* s = src + r * ow;
        for (int64_t j = 0; j < ow; ++j) d[j * sw] += s[j];
      }
    }
  }
}

// Calls f.template operator()<OW, SW>() when ow is one of the common ResNet row widths; false
// when it is not.
template <int SW, typename F>
bool dispatch_row_width(int64_t ow, F& f) {
  switch (ow) {
    case 2: f.template operator()<2, SW>(); return true;
    case 4: f.template operator()<4, SW>(); return true;
    case 8: f.template operator()<8, SW>(); return true;
    case 16: f.template operator()<16, SW>(); return true;
    case 32: f.template operator()<32, SW>(); return true;
    default: return false;
  }
}

// Calls f.template operator()<OW, SW>() with constants for the common ResNet row shapes
// (strides 1 and 2), and f.template operator()<0, 0>() for any other.
template <typename F>
void dispatch_row_shape(const ConvGeom& g, F&& f) {
  if (g.sw == 1 && dispatch_row_width<1>(g.ow, f)) return;
  if (g.sw == 2 && dispatch_row_width<2>(g.ow, f)) return;
  f.template operator()<0, 0>();
}

// Output rows [r0, r1) of channel c of one sample's input -> that channel's kH*kW column rows.
template <typename T>
void im2col_band(const T* x, const ConvGeom& g, int64_t c, int64_t r0, int64_t r1, T* col, int64_t ld) {
  T pad[kPadPlaneMax];
  pad_rows(x + c * g.h * g.w, g, band_first(g, r0), band_end(g, r1), pad);
  dispatch_row_shape(g, [&]<int OW, int SW>() { im2col_plane_impl<T, OW, SW>(pad, g, r1 - r0, col, ld); });
}

// The adjoint for all output rows: overwrites channel c of one sample's gradient (no zeroing pass).
template <typename T>
void col2im_plane(const T* col, int64_t ld, const ConvGeom& g, int64_t c, T* gx) {
  T acc[kPadPlaneMax];
  // Padded rows past band_end are read by no output row (stride leftovers): their gradient is 0.
  const int64_t wp = g.w + 2 * g.pw, rows = band_end(g, g.oh);
  std::fill(acc, acc + rows * wp, T(0));
  dispatch_row_shape(g, [&]<int OW, int SW>() { col2im_plane_impl<T, OW, SW>(col, ld, g, acc); });
  T* gc = gx + c * g.h * g.w;
  for (int64_t i = 0; i < g.h; ++i) {
    T* d = gc + i * g.w;
    if (i + g.ph >= rows) {
      std::fill(d, d + g.w, T(0));
      continue;
    }
    const T* s = acc + (i + g.ph) * wp + g.pw;
    for (int64_t j = 0; j < g.w; ++j) d[j] = s[j];
  }
}

}  // namespace minidl::cpu::conv_detail
