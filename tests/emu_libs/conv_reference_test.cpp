// The emulated cuDNN's reference convolutions (cuda_emu/conv_reference.h) against the order their
// header promises, bit for bit: a walk over each output pixel and filter tap, written out here,
// adds every element's terms in that order with one fused multiply-add each. The references run
// a tap at a time over rows of pixels instead; any term out of order or left out changes the
// bits (the inputs span many magnitudes, so the order of additions shows), and so does a row
// range that lets a tap read past the input's edge.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <vector>

#include "cuda_emu/conv_reference.h"

namespace {

using minidl::cuda::emu::detail::ConvGeometry;

// Calls f(x index, w index, y index) for every product term, outputs in [n][k][oh][ow] order and
// each output's terms in (c, r, s) order.
template <class F>
void walk(const ConvGeometry& g, F&& f) {
  const int64_t cg = g.c / g.groups, kg = g.k / g.groups;
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t k = 0; k < g.k; ++k)
      for (int64_t oh = 0; oh < g.oh; ++oh)
        for (int64_t ow = 0; ow < g.ow; ++ow)
          for (int64_t c = 0; c < cg; ++c)
            for (int64_t r = 0; r < g.r; ++r) {
              const int64_t ih = oh * g.stride_h - g.pad_h + r * g.dil_h;
              if (ih < 0 || ih >= g.h) continue;
              for (int64_t s = 0; s < g.s; ++s) {
                const int64_t iw = ow * g.stride_w - g.pad_w + s * g.dil_w;
                if (iw < 0 || iw >= g.w) continue;
                const int64_t fr = g.flip ? g.r - 1 - r : r, fs = g.flip ? g.s - 1 - s : s;
                f(((n * g.c + k / kg * cg + c) * g.h + ih) * g.w + iw, ((k * cg + c) * g.r + fr) * g.s + fs,
                  ((n * g.k + k) * g.oh + oh) * g.ow + ow);
              }
            }
}

// Values from 1e-6 to 1e6 of both signs: the order of their additions shows in the last bits.
std::vector<double> values(int64_t count, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> mant(-1.0, 1.0), expo(-6.0, 6.0);
  std::vector<double> v(static_cast<size_t>(count));
  for (double& e : v) e = mant(rng) * std::pow(10.0, expo(rng));
  return v;
}

ConvGeometry geometry(int64_t n, int64_t c, int64_t h, int64_t w, int64_t k, int64_t r, int64_t s, int64_t groups,
                      int64_t pad, int64_t stride, int64_t dil, bool flip) {
  ConvGeometry g;
  g.n = n, g.c = c, g.h = h, g.w = w, g.k = k, g.r = r, g.s = s, g.groups = groups;
  g.pad_h = pad, g.pad_w = pad + 1, g.stride_h = stride, g.stride_w = stride == 1 ? 2 : stride;
  g.dil_h = dil, g.dil_w = dil;
  g.flip = flip;
  g.oh = (h + 2 * g.pad_h - dil * (r - 1) - 1) / g.stride_h + 1;
  g.ow = (w + 2 * g.pad_w - dil * (s - 1) - 1) / g.stride_w + 1;
  return g;
}

void expect_same_bits(const std::vector<double>& got, const std::vector<double>& want, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::memcmp(&got[i], &want[i], sizeof(double)) != 0) {
      ADD_FAILURE() << what << "[" << i << "] is " << got[i] << ", the walk gives " << want[i];
      return;
    }
  }
}

TEST(ConvReference, EachDirectionAddsItsTermsInThePromisedOrder) {
  const ConvGeometry cases[] = {
      geometry(2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1, false),  // padding on both sides (pad_w 2, stride_w 2)
      geometry(2, 4, 9, 8, 6, 3, 2, 2, 0, 2, 1, true),   // groups, a flipped filter, stride 2
      geometry(1, 3, 11, 10, 2, 3, 3, 1, 2, 3, 2, false),  // dilation 2 with stride 3
      geometry(3, 2, 5, 5, 3, 1, 1, 1, 0, 1, 1, false),  // 1x1
      geometry(1, 2, 4, 4, 2, 5, 5, 1, 3, 1, 1, true),   // a filter larger than the input
  };
  uint64_t seed = 1;
  for (const ConvGeometry& g : cases) {
    SCOPED_TRACE(testing::Message() << "x " << g.n << "x" << g.c << "x" << g.h << "x" << g.w << ", w " << g.k << "x"
                                    << g.c / g.groups << "x" << g.r << "x" << g.s << ", groups " << g.groups
                                    << ", y " << g.oh << "x" << g.ow);
    ASSERT_GT(g.oh, 0);
    ASSERT_GT(g.ow, 0);
    const auto x = values(g.n * g.c * g.h * g.w, seed++), w = values(g.k * (g.c / g.groups) * g.r * g.s, seed++);
    const auto dy = values(g.n * g.k * g.oh * g.ow, seed++);
    std::vector<double> y(dy.size(), 0.0), dx(x.size(), 0.0), dw(w.size(), 0.0);
    // The walk visits each y's terms in (c, r, s) order; dx's and dw's, grouped by their element,
    // in (k, oh, ow) and (n, oh, ow) order: for an element of dx the output pixel fixes the tap.
    walk(g, [&](int64_t xi, int64_t wi, int64_t yi) { y[yi] = std::fma(x[xi], w[wi], y[yi]); });
    walk(g, [&](int64_t xi, int64_t wi, int64_t yi) { dx[xi] = std::fma(dy[yi], w[wi], dx[xi]); });
    walk(g, [&](int64_t xi, int64_t wi, int64_t yi) { dw[wi] = std::fma(x[xi], dy[yi], dw[wi]); });
    namespace ref = minidl::cuda::emu::detail;
    expect_same_bits(ref::conv_forward_ref(g, x, w), y, "y");
    expect_same_bits(ref::conv_backward_data_ref(g, dy, w), dx, "dx");
    expect_same_bits(ref::conv_backward_filter_ref(g, x, dy), dw, "dw");
  }
}

}  // namespace
