// Separable resampling as PIL's ImagingResample does it: per output pixel a window of source
// pixels with normalised filter weights (triangle or Keys cubic, support scaled by the reduction
// factor, so downscaling averages instead of aliasing), weights in 22-bit fixed point, a
// horizontal pass into an 8-bit buffer over the rows the vertical pass needs, then the vertical
// pass.
#include "data/resize.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "core/error.h"

namespace minidl::data {

namespace {

constexpr int kPrecision = 22;  // 8-bit pixels x 22-bit weights x a few taps fit in int32 (PIL's choice)

struct Coeffs {
  int64_t taps = 0;                 // weights per output pixel (padded with zeros)
  std::vector<int64_t> first;       // first source index per output pixel
  std::vector<int64_t> count;       // used taps per output pixel
  std::vector<int32_t> weights;     // out_size * taps
};

// PIL's filters (Resample.c): the triangle of BILINEAR (support 1) and the Keys cubic with
// a = -0.5 of BICUBIC (support 2).
double filter_weight(ResampleFilter f, double x) {
  x = std::abs(x);
  if (f == ResampleFilter::Bilinear) return x < 1.0 ? 1.0 - x : 0.0;
  constexpr double a = -0.5;
  if (x < 1.0) return ((a + 2.0) * x - (a + 3.0)) * x * x + 1;
  if (x < 2.0) return (((x - 5) * x + 8) * x - 4) * a;
  return 0.0;
}

Coeffs coefficients(int64_t in_size, int64_t out_size, ResampleFilter f) {
  const double scale = static_cast<double>(in_size) / static_cast<double>(out_size);
  const double filter_scale = std::max(scale, 1.0);
  const double support = (f == ResampleFilter::Bilinear ? 1.0 : 2.0) * filter_scale;
  Coeffs c;
  c.taps = static_cast<int64_t>(std::ceil(support)) * 2 + 1;
  c.first.resize(static_cast<size_t>(out_size));
  c.count.resize(static_cast<size_t>(out_size));
  c.weights.assign(static_cast<size_t>(out_size * c.taps), 0);
  std::vector<double> k(static_cast<size_t>(c.taps));
  const double ss = 1.0 / filter_scale;  // PIL multiplies by the reciprocal (not the same rounding as dividing)
  for (int64_t x = 0; x < out_size; ++x) {
    const double center = (static_cast<double>(x) + 0.5) * scale;
    const auto lo = std::max<int64_t>(static_cast<int64_t>(center - support + 0.5), 0);
    const auto hi = std::min<int64_t>(static_cast<int64_t>(center + support + 0.5), in_size);
    const int64_t n = std::min(hi - lo, c.taps);
    double total = 0;
    for (int64_t j = 0; j < n; ++j) {
      const double w = filter_weight(f, (static_cast<double>(j + lo) - center + 0.5) * ss);
      k[static_cast<size_t>(j)] = w;
      total += w;
    }
    for (int64_t j = 0; j < n; ++j) {
      // PIL divides only by a non-zero sum, then rounds as (int)(w * 2^22 +- 0.5), the sign of the
      // 0.5 following w's (the cubic's lobes are negative).
      const double w = total != 0 ? k[static_cast<size_t>(j)] / total : k[static_cast<size_t>(j)];
      const double scaled = w * (1 << kPrecision);
      c.weights[static_cast<size_t>(x * c.taps + j)] = static_cast<int32_t>(w < 0 ? -0.5 + scaled : 0.5 + scaled);
    }
    c.first[static_cast<size_t>(x)] = lo;
    c.count[static_cast<size_t>(x)] = n;
  }
  return c;
}

// The cubic's negative lobes can take a sum below 0 or above 255 << kPrecision: clamp.
inline uint8_t clip8(int32_t v) {
  v >>= kPrecision;
  return static_cast<uint8_t>(v < 0 ? 0 : v > 255 ? 255 : v);
}

}  // namespace

void resize_rgb(const uint8_t* src, int64_t w, int64_t h, int64_t stride, uint8_t* dst, int64_t out_w, int64_t out_h,
                ResampleFilter filter) {
  MINIDL_CHECK(w > 0 && h > 0 && out_w > 0 && out_h > 0, "resize_rgb: empty image ", w, "x", h, " -> ", out_w, "x", out_h);
  const Coeffs cx = coefficients(w, out_w, filter), cy = coefficients(h, out_h, filter);
  const int32_t half = 1 << (kPrecision - 1);
  const int64_t row_bytes = out_w * 3;
  // Only the source rows some output row reads. A pass whose size does not change is skipped,
  // as PIL does (its weights would be exactly 1 anyway).
  const int64_t row0 = cy.first.front();
  const int64_t row1 = cy.first.back() + cy.count.back();
  const uint8_t* mid = src + row0 * stride;
  int64_t mid_stride = stride;
  std::vector<uint8_t> mid_buf;
  if (out_w != w) {
    // Horizontal: the three channels of a pixel as one 4-lane vector, one multiply-add per tap.
    using V4 = int32_t __attribute__((vector_size(16)));
    mid_buf.resize(static_cast<size_t>((row1 - row0) * row_bytes));
    for (int64_t y = row0; y < row1; ++y) {
      const uint8_t* in = src + y * stride;
      uint8_t* o = mid_buf.data() + (y - row0) * row_bytes;
      for (int64_t x = 0; x < out_w; ++x) {
        const int32_t* k = cx.weights.data() + x * cx.taps;
        const uint8_t* p = in + cx.first[static_cast<size_t>(x)] * 3;
        V4 acc = {half, half, half, 0};
        for (int64_t j = 0, n = cx.count[static_cast<size_t>(x)]; j < n; ++j, p += 3) {
          const V4 px = {p[0], p[1], p[2], 0};
          acc += px * k[j];
        }
        o[3 * x] = clip8(acc[0]);
        o[3 * x + 1] = clip8(acc[1]);
        o[3 * x + 2] = clip8(acc[2]);
      }
    }
    mid = mid_buf.data();
    mid_stride = row_bytes;
  }
  if (out_h == h) {
    for (int64_t y = 0; y < out_h; ++y) std::memcpy(dst + y * row_bytes, mid + y * mid_stride, static_cast<size_t>(row_bytes));
    return;
  }
  // Vertical: whole rows at a time into an int32 accumulator row (vectorises).
  std::vector<int32_t> acc(static_cast<size_t>(row_bytes));
  for (int64_t y = 0; y < out_h; ++y) {
    const int32_t* k = cy.weights.data() + y * cy.taps;
    const uint8_t* col = mid + (cy.first[static_cast<size_t>(y)] - row0) * mid_stride;
    const int64_t n = cy.count[static_cast<size_t>(y)];
    std::fill(acc.begin(), acc.end(), half);
    for (int64_t j = 0; j < n; ++j) {
      const uint8_t* r = col + j * mid_stride;
      const int32_t kj = k[j];
      for (int64_t x = 0; x < row_bytes; ++x) acc[static_cast<size_t>(x)] += r[x] * kj;
    }
    uint8_t* o = dst + y * row_bytes;
    for (int64_t x = 0; x < row_bytes; ++x) o[x] = clip8(acc[static_cast<size_t>(x)]);
  }
}

namespace {

// PIL's pretabulated source positions: COORD(x0 + k * step) accumulated, x0 = step / 2.
std::vector<int64_t> nearest_positions(int64_t in_size, int64_t out_size) {
  const double step = static_cast<double>(in_size) / static_cast<double>(out_size);
  std::vector<int64_t> pos(static_cast<size_t>(out_size));
  double at = step * 0.5;
  for (auto& p : pos) {
    p = std::clamp<int64_t>(static_cast<int64_t>(at), 0, in_size - 1);
    at += step;
  }
  return pos;
}

}  // namespace

void resize_rgb_nearest(const uint8_t* src, int64_t w, int64_t h, int64_t stride, uint8_t* dst, int64_t out_w,
                        int64_t out_h) {
  MINIDL_CHECK(w > 0 && h > 0 && out_w > 0 && out_h > 0, "resize_rgb_nearest: empty image ", w, "x", h, " -> ", out_w,
               "x", out_h);
  const std::vector<int64_t> xs = nearest_positions(w, out_w), ys = nearest_positions(h, out_h);
  for (int64_t y = 0; y < out_h; ++y) {
    const uint8_t* row = src + ys[static_cast<size_t>(y)] * stride;
    uint8_t* o = dst + y * out_w * 3;
    for (int64_t x = 0; x < out_w; ++x) std::memcpy(o + 3 * x, row + 3 * xs[static_cast<size_t>(x)], 3);
  }
}

}  // namespace minidl::data
