// CPU-vs-CUDA parity of the reductions and the pooling kernels, the backend's index-arithmetic
// kernels: reductions over any dims (one block per output, or split across blocks with partials
// combined in order), argmax/argmin's tie and NaN rules across chunks, and max/avg pooling (NCHW
// here; channels-last in channels_last_cuda_test.cpp) through both of the pooling kernels' index
// paths. Split from backend_parity_cuda_test.cpp, whose harness (tests/support/parity_helpers.h)
// it shares.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "core/autograd.h"
#include "core/ops.h"
#include "tests/support/parity_helpers.h"
#ifdef MINIDL_WITH_CUDA
#include "kernels/cuda/runtime.h"
#endif

namespace minidl {
namespace {

using namespace testing::parity;   // NOLINT: the shared harness (tests/support/parity_helpers.h)

// ---- Reductions ----

TEST_F(Parity, ReductionsOverAnyDims) {
  const std::vector<std::pair<Shape, std::vector<int64_t>>> cases{
      {{1}, {0}}, {{1000}, {0}}, {{33, 17}, {0}}, {{33, 17}, {1}}, {{33, 17}, {}}, {{4, 5, 6, 7}, {0, 2, 3}},
      {{4, 5, 6, 7}, {1}}, {{3, 70000}, {1}}, {{2, 3, 5}, {0, 2}},
      // split across blocks (reduce.cu): one output, and outputs whose elements are strided
      {{40000}, {0}}, {{20000, 3}, {0}},
      // outputs side by side, elements along one stride: a thread each (reduce_cols_kernel) when
      // short, a block each when long and few
      {{100, 40}, {0}}, {{300, 40}, {0}}};
  for (DType dt : {DType::f32, DType::f64}) {
    for (const auto& [s, dims] : cases) {
      for (bool nc : {false, true}) {
        check_op("sum", [&](const std::vector<Tensor>& v) { return sum(v[0], dims); }, {s}, dt, nc, true);
        check_op("mean", [&](const std::vector<Tensor>& v) { return mean(v[0], dims, true); }, {s}, dt, nc, true);
        check_op("max", [&](const std::vector<Tensor>& v) { return max(v[0], dims); }, {s}, dt, nc, true);
        check_op("min", [&](const std::vector<Tensor>& v) { return min(v[0], dims); }, {s}, dt, nc, true);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST_F(Parity, ArgmaxArgminTiesAndNaN) {
  Tensor x = from_vector({1, 5, 5, 2, 3, 3, 0, 3, 7, 7, 7, 1}, {3, 4});
  EXPECT_EQ(argmax(x.to(kGpu), 1).to_vector(), argmax(x, 1).to_vector()) << "first maximum wins";
  EXPECT_EQ(argmin(x.to(kGpu), 0).to_vector(), argmin(x, 0).to_vector());
  Tensor n = from_vector({1, NAN, 5, NAN, 2, 9}, {6});
  EXPECT_EQ(argmax(n.to(kGpu), 0).to_vector(), argmax(n, 0).to_vector()) << "first NaN wins";
  EXPECT_TRUE(std::isnan(max(n.to(kGpu)).item()));
  Tensor r = rnd({37, 1000}, DType::f32, 4);
  EXPECT_EQ(argmax(r.to(kGpu), 1).to_vector(), argmax(r, 1).to_vector());
  EXPECT_EQ(argmin(r.t().to(kGpu), 0).to_vector(), argmin(r.t(), 0).to_vector());
  Tensor i = rnd({9, 31}, DType::f32, 5).mul_(100.0).to(DType::i64);
  EXPECT_EQ(sum(i.to(kGpu), {1}).to_vector(), sum(i, {1}).to_vector());
  // Many short rows take a warp per row (reduce_warp_kernel): the same rules. Few distinct values
  // make ties common; two rows hold two NaNs each.
  std::vector<double> v = rnd({64, 20}, DType::f32, 8).mul_(2.0).to(DType::i64).to(DType::f32).to_vector();
  v[5 * 20 + 7] = v[5 * 20 + 3] = NAN;
  v[40 * 20 + 19] = v[40 * 20 + 0] = NAN;
  const Tensor rows = from_vector(v, {64, 20});
  EXPECT_EQ(argmax(rows.to(kGpu), 1).to_vector(), argmax(rows, 1).to_vector()) << "first maximum, first NaN";
  EXPECT_EQ(argmin(rows.to(kGpu), 1).to_vector(), argmin(rows, 1).to_vector());
  EXPECT_TRUE(close(max(rows, {1}), max(rows.to(kGpu), {1}), 0, "max of short rows"));
  EXPECT_EQ(argmax(rows.t().to(kGpu), 0).to_vector(), argmax(rows.t(), 0).to_vector()) << "strided rows";
}

// Reductions split across blocks (few outputs, many elements: reduce.cu) combine their chunks'
// partials with the same rules: the first maximum and the first NaN win across chunks, integer sums
// stay exact, f16 sums in double.
TEST_F(Parity, ReductionsSplitAcrossBlocksKeepTheirRules) {
  std::vector<double> v(40000, 1.0);
  v[30000] = v[10000] = 9.0;   // a tie in different chunks: the first wins
  v[39999] = -5.0;
  const Tensor t = from_vector(v, {40000});
  EXPECT_EQ(argmax(t.to(kGpu), 0).to_vector(), std::vector<double>{10000});
  EXPECT_EQ(argmin(t.to(kGpu), 0).to_vector(), std::vector<double>{39999});
  EXPECT_EQ(max(t.to(kGpu)).item(), 9.0);
  v[35000] = NAN;
  v[20000] = NAN;
  const Tensor n = from_vector(v, {2, 20000});
  EXPECT_EQ(argmax(n.to(kGpu), 1).to_vector(), argmax(n, 1).to_vector()) << "the first NaN of each row";
  EXPECT_EQ(argmax(n.reshape({40000}).to(kGpu), 0).to_vector(), std::vector<double>{20000}) << "first NaN wins";
  const Tensor i = rnd({3, 50000}, DType::f32, 6).mul_(1000.0).to(DType::i64);
  EXPECT_EQ(sum(i.to(kGpu), {1}).to_vector(), sum(i, {1}).to_vector());
  EXPECT_EQ(sum(i.to(kGpu)).to_vector(), sum(i).to_vector());
  const Tensor h = rnd({60000}, DType::f16, 7);
  EXPECT_EQ(sum(h.to(kGpu)).to_vector(), sum(h).to_vector()) << "f16 sums in double, as on the CPU";
  EXPECT_EQ(mean(h.to(kGpu)).to_vector(), mean(h).to_vector());
}

// ---- Pooling ----

// The pooling kernels' 64-bit index path, which only tensors of 2^30 elements take unforced.
void force_wide_pool_index(bool on) {
#ifdef MINIDL_WITH_CUDA
  cuda::set_pool_wide_index(on);
#else
  (void)on;
#endif
}

TEST_F(Parity, MaxAndAvgPooling) {
  std::vector<std::pair<Shape, Pool2dOptions>> cases;
  cases.push_back({{2, 3, 8, 8}, {}});
  Pool2dOptions resnet;   // ResNet's 3x3/2 pad 1 max pool
  resnet.kernel = {3, 3};
  resnet.stride = {2, 2};
  resnet.padding = {1, 1};
  cases.push_back({{2, 4, 15, 17}, resnet});
  Pool2dOptions ceil = resnet;
  ceil.ceil_mode = true;
  ceil.count_include_pad = false;
  cases.push_back({{1, 2, 10, 9}, ceil});
  Pool2dOptions rect;
  rect.kernel = {2, 3};
  rect.stride = {1, 2};
  cases.push_back({{3, 1, 7, 11}, rect});
  // Both index paths of the kernels: FastDiv (every tensor here) and 64-bit division (forced; huge
  // tensors take it).
  for (const bool wide : {false, true}) {
    force_wide_pool_index(wide);
    for (const auto& [s, o] : cases) {
      const Pool2dOptions opt = o;
      for (const bool nc : {false, true}) {
        check_op("max_pool2d", [opt](const std::vector<Tensor>& v) { return max_pool2d(v[0], opt); }, {s}, DType::f32,
                 nc, true);
        check_op("avg_pool2d", [opt](const std::vector<Tensor>& v) { return avg_pool2d(v[0], opt); }, {s}, DType::f32,
                 nc, true);
      }
      if (HasFatalFailure()) break;
    }
  }
  force_wide_pool_index(false);
  if (HasFatalFailure()) return;
  for (DType dt : {DType::f32, DType::f64}) {
    for (const auto& [s, o] : cases) {
      const Pool2dOptions opt = o;
      check_op("max_pool2d", [opt](const std::vector<Tensor>& v) { return max_pool2d(v[0], opt); }, {s}, dt, false, true);
      check_op("avg_pool2d", [opt](const std::vector<Tensor>& v) { return avg_pool2d(v[0], opt); }, {s}, dt, false, true);
      if (HasFatalFailure()) return;
    }
    check_op("adaptive_avg_pool2d", [](const std::vector<Tensor>& v) { return adaptive_avg_pool2d(v[0]); },
             {{4, 8, 7, 7}}, dt, false, true);
  }
  // Indices: ties take the first maximum, as on the CPU.
  Tensor t = ones({1, 1, 4, 4});
  EXPECT_TRUE(close(max_pool2d(t, resnet), max_pool2d(t.to(kGpu), resnet), 0, "max_pool2d ties"));
}

// Max-pool backward gathers in output order on the GPU: with overlapping windows (an input that is
// the maximum of several windows receives several gradients) repeated runs are bit-identical, and
// equal to the CPU's in-order scatter bit for bit. Few distinct values make shared maxima common.
TEST_F(Parity, MaxPoolBackwardOverlappingWindowsIsDeterministic) {
  auto grad_of = [](const Tensor& x_host, const Pool2dOptions& o, const Tensor& gy_host, Device dev) {
    Tensor x = x_host.to(dev).detach().clone().set_requires_grad(true);
    max_pool2d(x, o).backward(gy_host.to(dev));
    return x.grad();
  };
  for (int64_t stride : {2, 1}) {
    Pool2dOptions o;
    o.kernel = {3, 3};
    o.stride = {stride, stride};
    o.padding = {1, 1};
    for (DType dt : {DType::f32, DType::f64, DType::f16}) {
      const Tensor x = rnd({2, 3, 13, 11}, DType::f32, 41, 0.0, 4.0).to(DType::i64).to(dt);   // 0..3: ties
      const Tensor y = max_pool2d(x, o);
      const Tensor gy = rnd(y.shape(), dt, 42);
      const std::string what = std::string("max_pool2d backward, kernel 3 stride ") + std::to_string(stride) + " " +
                               dtype_name(dt);
      const Tensor cpu = grad_of(x, o, gy, Device::cpu());
      const Tensor first = grad_of(x, o, gy, kGpu);
      // The overlap is real: some input gets the gradients of at least two outputs.
      const Tensor counts = grad_of(x, o, ones(y.shape(), {dt}), Device::cpu());
      ASSERT_GE(max(counts).item(), 2.0) << what;
      EXPECT_TRUE(bit_equal(cpu, first.to(Device::cpu()), what + ": GPU vs CPU"));
      for (int run = 0; run < 3; ++run) {
        ASSERT_TRUE(bit_equal(first, grad_of(x, o, gy, kGpu), what + ": run " + std::to_string(run + 2) + " vs run 1"));
      }
    }
  }
}

}  // namespace
}  // namespace minidl
