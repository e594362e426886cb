// Winograd F(2x2, 3x3) (kernels/cpu/winograd.h), the CPU's f32 path for 3x3 stride-1 layers and
// their input and weight gradients, against the f64 convolution (im2col, itself checked against a direct
// loop in conv_test.cpp) on the same values: every tile layout the transforms special-case (tile
// rows narrower and wider than 16 lanes, odd output sizes with half tiles, paddings 0 to 2, bias),
// both plans (threads over blocks, threads inside a block), and an error no larger than a few
// times the direct f32 sum's. Also calls from inside another parallel region, and the switch that
// turns it off.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/ops.h"
#include "core/tensor.h"
#include "kernels/cpu/conv_plan.h"
#include "kernels/cpu/conv_workspace.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/winograd.h"

namespace minidl {
namespace {

using cpu::conv_detail::ConvGeom;

struct Case {
  int64_t n, c, h, w, o, pad;
  bool bias;
  int64_t oh() const { return h + 2 * pad - 2; }
  int64_t ow() const { return w + 2 * pad - 2; }
  ConvGeom geom() const { return {n, c, h, w, o, 3, 3, oh(), ow(), 1, 1, pad, pad, 1, 1}; }
  std::string name() const {
    return std::to_string(n) + "x" + std::to_string(c) + "x" + std::to_string(h) + "x" + std::to_string(w) + " o" +
           std::to_string(o) + " pad " + std::to_string(pad);
  }
};

double max_abs_diff(const Tensor& a, const Tensor& b) {
  const std::vector<double> av = a.to(DType::f64).to_vector(), bv = b.to_vector();
  double m = 0.0;
  for (size_t i = 0; i < av.size(); ++i) m = std::max(m, std::abs(av[i] - bv[i]));
  return m;
}

double max_abs(const Tensor& a) {
  double m = 0.0;
  for (double v : a.to_vector()) m = std::max(m, std::abs(v));
  return m;
}

// The f32 result of `run` with Winograd on and off, against its f64 result.
struct Errors {
  double winograd, direct, scale;
};

template <typename F>
Errors errors(F&& run) {
  const Tensor ref = run(DType::f64);
  const Tensor fast = run(DType::f32);
  cpu::conv_detail::set_winograd_enabled(false);
  const Tensor direct = run(DType::f32);
  cpu::conv_detail::set_winograd_enabled(true);
  return {max_abs_diff(fast, ref), max_abs_diff(direct, ref), max_abs(ref)};
}

void expect_close(const Errors& e, const std::string& what) {
  EXPECT_GT(e.scale, 0.0) << what;
  // F(2x2, 3x3)'s transforms add at most a few roundings to each product's path.
  EXPECT_LE(e.winograd, 1e-5 * e.scale) << what << ": direct f32 error " << e.direct;
  EXPECT_LE(e.winograd, 8.0 * e.direct + 1e-7 * e.scale) << what << ": direct f32 error " << e.direct;
}

TEST(Winograd, MatchesTheF64ConvolutionOnEveryTileLayout) {
  const Case cases[] = {
      {2, 16, 16, 16, 16, 1, true},    // the smallest batch it takes (128 tiles), 8 tiles a row
      {1, 16, 37, 40, 24, 1, false},   // odd height (half tiles), 20 tiles a row: a partial second lane group
      {2, 20, 18, 21, 17, 0, true},    // no padding, odd width: the last tile of each row is half
      {2, 32, 16, 16, 48, 2, false},   // padding 2 (its input gradient: padding 0)
      {8, 256, 8, 8, 256, 1, false},   // the smallest plane, for wide layers only: 4 tiles a row
      {1, 24, 16, 66, 20, 1, true},    // 33 tiles a row: three lane groups
  };
  const int saved = omp_get_max_threads();
  auto& be = cpu::cpu_backend();
  for (int threads : {1, 2, 8}) {  // 8: few tile rows per thread, so the threads share blocks
    omp_set_num_threads(threads);
    for (const Case& k : cases) {
      const std::string what = k.name() + ", threads " + std::to_string(threads);
      ASSERT_TRUE(cpu::conv_detail::winograd_ok(k.geom())) << what;
      ASSERT_TRUE(cpu::conv_detail::winograd_input_ok<float>(k.geom())) << what;
      const Conv2dOptions o{.padding = {k.pad, k.pad}};
      const Tensor x = randn({k.n, k.c, k.h, k.w}), w = randn({k.o, k.c, 3, 3}), b = randn({k.o});
      const Tensor gy = randn({k.n, k.o, k.oh(), k.ow()});
      expect_close(errors([&](DType dt) {
                     const Tensor y = empty({k.n, k.o, k.oh(), k.ow()}, {.dtype = dt});
                     be.conv2d_forward(x.to(dt), w.to(dt), k.bias ? b.to(dt) : Tensor(), o, y);
                     return y;
                   }),
                   "forward, " + what);
      expect_close(errors([&](DType dt) {
                     const Tensor gx = empty(x.shape(), {.dtype = dt});
                     be.conv2d_backward_input(gy.to(dt), w.to(dt), o, gx);
                     return gx;
                   }),
                   "input gradient, " + what);
      expect_close(errors([&](DType dt) {
                     const Tensor gw = empty(w.shape(), {.dtype = dt});
                     be.conv2d_backward_weight(gy.to(dt), x.to(dt), o, gw);
                     return gw;
                   }),
                   "weight gradient, " + what);
    }
  }
  omp_set_num_threads(saved);
}

TEST(Winograd, GradientsInsideAnotherParallelRegionEqualTheSerialOnes) {
  // A nested parallel region gets one thread while omp_get_max_threads() still says 2: the plan's
  // per-thread sums must not count threads that never ran.
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  const Case k{2, 16, 64, 64, 16, 1, false};  // threads over blocks, per-thread weight-gradient sums
  ASSERT_EQ(cpu::conv_detail::winograd_plan(k.geom()).threads, 2);
  const Conv2dOptions o{.padding = {1, 1}};
  const Tensor x = randn({k.n, k.c, k.h, k.w}), gy = randn({k.n, k.o, k.oh(), k.ow()});
  auto& be = cpu::cpu_backend();
  const Tensor serial = empty({k.o, k.c, 3, 3});
  be.conv2d_backward_weight(gy, x, o, serial);
  const Tensor nested[2] = {empty({k.o, k.c, 3, 3}), empty({k.o, k.c, 3, 3})};
  {  // the scratch the passes will get from the allocator's cache holds garbage, not fresh zeros
    const auto pl = cpu::conv_detail::winograd_plan(k.geom());
    empty({(pl.per_thread + pl.weight_elems) * pl.threads}).fill_(1e30);
  }
  int team = 0;
#pragma omp parallel num_threads(2)
  {
#pragma omp single
    team = omp_get_num_threads();
    be.conv2d_backward_weight(gy, x, o, nested[omp_get_thread_num()]);
  }
  ASSERT_EQ(team, 2) << "the outer region must run two threads (the suite is compiled with OpenMP)";
  for (const Tensor& t : nested) {
    ASSERT_TRUE(t.defined());
    const std::vector<double> a = serial.to_vector(), b = t.to_vector();
    double diff = 0.0;
    for (size_t i = 0; i < a.size(); ++i) diff = std::max(diff, std::abs(a[i] - b[i]));
    EXPECT_LT(diff, 1e-3 * max_abs(serial));
  }
  omp_set_num_threads(saved);
}

TEST(Winograd, BothPlansAreExercised) {
  // Enough tiles for a block of at least 64 per thread: blocks spread over the threads; fewer: the
  // threads share each block.
  const int saved = omp_get_max_threads();
  omp_set_num_threads(2);
  const auto big = cpu::conv_detail::winograd_plan(Case{2, 16, 64, 64, 16, 1, false}.geom());
  EXPECT_EQ(big.threads, 2);
  EXPECT_FALSE(big.inner);
  EXPECT_EQ(big.blocks % 2, 0) << "blocks come in multiples of the threads";
  omp_set_num_threads(8);
  const auto small = cpu::conv_detail::winograd_plan(Case{8, 64, 8, 8, 64, 1, false}.geom());
  EXPECT_EQ(small.threads, 1);
  EXPECT_TRUE(small.inner);
  omp_set_num_threads(saved);
}

TEST(Winograd, LayersOutsideItsRangeKeepIm2col) {
  const ConvGeom resnet{16, 64, 32, 32, 64, 3, 3, 32, 32, 1, 1, 1, 1, 1, 1};
  EXPECT_TRUE(cpu::conv_detail::winograd_ok(resnet));
  ConvGeom g = resnet;
  g.sh = g.sw = 2;  // strided
  EXPECT_FALSE(cpu::conv_detail::winograd_ok(g));
  g = resnet;
  g.c = 3;  // the small CNN's first layer
  EXPECT_FALSE(cpu::conv_detail::winograd_ok(g));
  g = resnet;
  g.h = g.w = g.oh = g.ow = 8;  // 8x8 planes: only for wide layers
  EXPECT_FALSE(cpu::conv_detail::winograd_ok(g));
  g.c = g.o = 256;
  EXPECT_TRUE(cpu::conv_detail::winograd_ok(g));
  g.h = g.w = g.oh = g.ow = 4;  // 4x4 planes
  EXPECT_FALSE(cpu::conv_detail::winograd_ok(g));
  g = resnet;
  g.n = 1;
  g.h = g.w = g.oh = g.ow = 8;  // 16 tiles
  EXPECT_FALSE(cpu::conv_detail::winograd_ok(g));
  g = resnet;
  g.kh = g.kw = 5;
  EXPECT_FALSE(cpu::conv_detail::winograd_ok(g));
}

TEST(Winograd, TheSwitchTurnsItOffForKernelsAndDryRunsAlike) {
  const Shape x{16, 64, 32, 32}, w{64, 64, 3, 3};
  const Conv2dOptions o{.padding = {1, 1}};
  const auto on = cpu::conv2d_workspace_bytes(cpu::ConvPass::Forward, x, w, x, o, DType::f32);
  ASSERT_FALSE(on.empty());
  EXPECT_EQ(on.front(), 16 * 64 * 64 * 4) << "the transformed weight comes first";
  cpu::conv_detail::set_winograd_enabled(false);
  EXPECT_FALSE(cpu::conv_detail::winograd_ok({16, 64, 32, 32, 64, 3, 3, 32, 32, 1, 1, 1, 1, 1, 1}));
  const auto off = cpu::conv2d_workspace_bytes(cpu::ConvPass::Forward, x, w, x, o, DType::f32);
  cpu::conv_detail::set_winograd_enabled(true);
  EXPECT_NE(on, off);
}

}  // namespace
}  // namespace minidl
