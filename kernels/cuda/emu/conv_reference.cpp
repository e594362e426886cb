// The three convolution directions as one walk over every (output pixel, filter tap) pair that
// lands inside the input: forward gathers x*w into y, backward-data scatters dy*w into dx,
// backward-filter accumulates x*dy into dw. Sharing the walk keeps the three consistent with
// each other; the tests check the walk itself against an im2col GEMM and the adjoint identities.
#include "kernels/cuda/emu/conv_reference.h"

namespace minidl::cuda::emu::detail {
namespace {

// Calls f(x_index, w_index, y_index) for every product term of the convolution.
template <class F>
void for_each_tap(const ConvGeometry& g, F&& f) {
  const int64_t cg = g.c / g.groups, kg = g.k / g.groups;
  for (int64_t n = 0; n < g.n; ++n) {
    for (int64_t k = 0; k < g.k; ++k) {
      const int64_t group = k / kg;
      for (int64_t oh = 0; oh < g.oh; ++oh) {
        for (int64_t ow = 0; ow < g.ow; ++ow) {
          const int64_t yi = ((n * g.k + k) * g.oh + oh) * g.ow + ow;
          for (int64_t c = 0; c < cg; ++c) {
            const int64_t xc = group * cg + c;
            for (int64_t r = 0; r < g.r; ++r) {
              const int64_t ih = oh * g.stride_h - g.pad_h + r * g.dil_h;
              if (ih < 0 || ih >= g.h) continue;
              const int64_t fr = g.flip ? g.r - 1 - r : r;
              for (int64_t s = 0; s < g.s; ++s) {
                const int64_t iw = ow * g.stride_w - g.pad_w + s * g.dil_w;
                if (iw < 0 || iw >= g.w) continue;
                const int64_t fs = g.flip ? g.s - 1 - s : s;
                f(((n * g.c + xc) * g.h + ih) * g.w + iw, ((k * cg + c) * g.r + fr) * g.s + fs, yi);
              }
            }
          }
        }
      }
    }
  }
}

}  // namespace

std::vector<double> conv_forward_ref(const ConvGeometry& g, const std::vector<double>& x, const std::vector<double>& w) {
  std::vector<double> y(static_cast<size_t>(g.n * g.k * g.oh * g.ow), 0.0);
  for_each_tap(g, [&](int64_t xi, int64_t wi, int64_t yi) { y[yi] += x[xi] * w[wi]; });
  return y;
}

std::vector<double> conv_backward_data_ref(const ConvGeometry& g, const std::vector<double>& dy,
                                           const std::vector<double>& w) {
  std::vector<double> dx(static_cast<size_t>(g.n * g.c * g.h * g.w), 0.0);
  for_each_tap(g, [&](int64_t xi, int64_t wi, int64_t yi) { dx[xi] += dy[yi] * w[wi]; });
  return dx;
}

std::vector<double> conv_backward_filter_ref(const ConvGeometry& g, const std::vector<double>& x,
                                             const std::vector<double>& dy) {
  std::vector<double> dw(static_cast<size_t>(g.k * (g.c / g.groups) * g.r * g.s), 0.0);
  for_each_tap(g, [&](int64_t xi, int64_t wi, int64_t yi) { dw[wi] += x[xi] * dy[yi]; });
  return dw;
}

}  // namespace minidl::cuda::emu::detail
