// conv2d_workspace_bytes (kernels/cpu/conv_workspace.h) against what the CPU convolution kernels
// really allocate: the peak of allocated bytes during each pass, above what was allocated before
// it, equals the sum of the blocks it reports, on every path of the kernels (per-sample tiles,
// grouped small planes, threads splitting channels, the transposed input gradient, Winograd, 1x1),
// for 1 and 2 threads, f32, f64 and f16. A shape-only dry run relies on this to reproduce the CPU's peak.
#include <gtest/gtest.h>
#include <omp.h>

#include <numeric>

#include "core/allocator.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "kernels/cpu/conv_workspace.h"
#include "kernels/cpu/cpu_backend.h"

namespace minidl {
namespace {

using cpu::ConvPass;

struct Geometry {
  int64_t n, c, h, o, k, stride, pad;
};

int64_t measured_peak(const std::function<void()>& pass) {
  const int64_t before = memory_stats().allocated_bytes;
  reset_peak_stats();
  pass();
  EXPECT_EQ(memory_stats().allocated_bytes, before) << "the pass left memory behind";
  return memory_stats().peak_allocated_bytes - before;
}

void check(const Geometry& ge, DType dt, int threads) {
  omp_set_num_threads(threads);
  const Conv2dOptions o{.stride = {ge.stride, ge.stride}, .padding = {ge.pad, ge.pad}};
  const int64_t oh = conv_output_size(ge.h, ge.k, ge.stride, ge.pad, 1, false, "test");
  const TensorOptions opt{.dtype = dt};
  const Tensor x = randn({ge.n, ge.c, ge.h, ge.h}).to(dt), w = randn({ge.o, ge.c, ge.k, ge.k}).to(dt);
  const Tensor b = randn({ge.o}).to(dt), y = empty({ge.n, ge.o, oh, oh}, opt);
  const Tensor gy = randn({ge.n, ge.o, oh, oh}).to(dt), gx = empty(x.shape(), opt), gw = empty(w.shape(), opt);
  auto& be = cpu::cpu_backend();
  const auto sum = [](const std::vector<int64_t>& v) { return std::accumulate(v.begin(), v.end(), int64_t{0}); };
  const std::string what = "n" + std::to_string(ge.n) + " c" + std::to_string(ge.c) + " " + std::to_string(ge.h) +
                           "px o" + std::to_string(ge.o) + " k" + std::to_string(ge.k) + " s" +
                           std::to_string(ge.stride) + " " + dtype_name(dt) + " threads " + std::to_string(threads);
  EXPECT_EQ(measured_peak([&] { be.conv2d_forward(x, w, b, o, y); }),
            sum(cpu::conv2d_workspace_bytes(ConvPass::Forward, x.shape(), w.shape(), y.shape(), o, dt, true)))
      << "forward, " << what;
  EXPECT_EQ(measured_peak([&] { be.conv2d_backward_input(gy, w, o, gx); }),
            sum(cpu::conv2d_workspace_bytes(ConvPass::BackwardInput, x.shape(), w.shape(), y.shape(), o, dt)))
      << "input gradient, " << what;
  EXPECT_EQ(measured_peak([&] { be.conv2d_backward_weight(gy, x, o, gw); }),
            sum(cpu::conv2d_workspace_bytes(ConvPass::BackwardWeight, x.shape(), w.shape(), y.shape(), o, dt)))
      << "weight gradient, " << what;
}

TEST(ConvWorkspace, ReportedBlocksAreWhatTheKernelsAllocate) {
  const int saved = omp_get_max_threads();
  const Geometry shapes[] = {
      {2, 3, 40, 8, 3, 1, 1},      // the small CNN's shape: per-sample row tiles
      {4, 64, 16, 64, 3, 1, 1},    // ResNet stage 1: Winograd in f32 (winograd.h), im2col in f64
      {1, 64, 8, 64, 3, 1, 1},     // too few tiles for Winograd: the transposed input gradient
      {8, 256, 4, 256, 3, 1, 1},   // deep stage, big weight: grouped samples, threads split channels
      {4, 64, 8, 128, 3, 2, 1},    // strided
      {4, 128, 8, 256, 1, 1, 0},   // 1x1: columns are views of the input
      {3, 3, 24, 16, 7, 2, 3},     // stem
  };
  for (int threads : {1, 2}) {
    for (const Geometry& ge : shapes) {
      check(ge, DType::f32, threads);
      check(ge, DType::f64, threads);
    }
    check(shapes[1], DType::f16, threads);
  }
  omp_set_num_threads(saved);
}

TEST(ConvWorkspace, TransposedInputGradientCountsItsFlippedWeight) {
  const Conv2dOptions o{.padding = {1, 1}};
  const auto blocks = cpu::conv2d_workspace_bytes(ConvPass::BackwardInput, {1, 64, 8, 8}, {64, 64, 3, 3},
                                                  {1, 64, 8, 8}, o, DType::f32);
  ASSERT_FALSE(blocks.empty());
  EXPECT_EQ(blocks.front(), 64 * 64 * 9 * 4);
}

}  // namespace
}  // namespace minidl
