// CPU-vs-CUDA parity of the f16 paths that mixed precision uses beyond elementwise ops: pooling,
// batch norm (f16 activations, f32 parameters and statistics), convolution forward/backward, and
// the softmax / log-softmax / NLL kernels a pure-f16 model reaches, each against the CPU's own f16
// path (f32 compute, one rounding), forward and backward.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/ops.h"
#include "tests/support/parity_helpers.h"

namespace minidl {
namespace {

using namespace testing::parity;   // NOLINT: the shared harness (tests/support/parity_helpers.h)

class HalfParity : public Parity {};

Pool2dOptions resnet_pool() {
  Pool2dOptions o;
  o.kernel = {3, 3};
  o.stride = {2, 2};
  o.padding = {1, 1};
  return o;
}

TEST_F(HalfParity, MaxAndAvgPooling) {
  for (const Pool2dOptions& o : {Pool2dOptions{}, resnet_pool()}) {
    const Pool2dOptions opt = o;
    // Max pooling selects and sums in output order on both backends: exact.
    check_op("max_pool2d", [opt](const std::vector<Tensor>& v) { return max_pool2d(v[0], opt); }, {{2, 3, 15, 17}},
             DType::f16, false, true, 0);
    check_op("avg_pool2d", [opt](const std::vector<Tensor>& v) { return avg_pool2d(v[0], opt); }, {{2, 3, 15, 17}},
             DType::f16, false, true);
    if (HasFatalFailure()) return;
  }
}

TEST_F(HalfParity, BatchNormF16ActivationsF32Parameters) {
  for (bool training : {true, false}) {
    const Tensor x = (rnd({4, 5, 7, 9}, DType::f32, 61) * 3.0 + 1.0).to(DType::f16);
    const Tensor w = rnd({5}, DType::f32, 62), b = rnd({5}, DType::f32, 63);
    const Tensor rm = rnd({5}, DType::f32, 64), rv = rnd({5}, DType::f32, 65, 0.5, 2.0);
    auto run = [&](Device d, Tensor& gx, Tensor& gw, Tensor& rm_out, Tensor& rv_out) {
      Tensor xl = x.to(d).detach().clone().set_requires_grad(true);
      Tensor wl = w.to(d).detach().clone().set_requires_grad(true);
      Tensor bl = b.to(d).detach().clone().set_requires_grad(true);
      rm_out = rm.to(d).detach().clone();
      rv_out = rv.to(d).detach().clone();
      const Tensor y = batch_norm(xl, wl, bl, rm_out, rv_out, training);
      y.backward(rnd(y.shape(), DType::f16, 66).to(d));
      gx = xl.grad();
      gw = wl.grad();
      return y;
    };
    Tensor gxc, gwc, rmc, rvc, gxg, gwg, rmg, rvg;
    const Tensor yc = run(Device::cpu(), gxc, gwc, rmc, rvc);
    const Tensor yg = run(kGpu, gxg, gwg, rmg, rvg);
    const std::string what = training ? "batch_norm f16 (train)" : "batch_norm f16 (eval)";
    ASSERT_EQ(yg.dtype(), DType::f16);
    EXPECT_TRUE(close(yc, yg, 2e-3, what + " forward"));
    EXPECT_TRUE(close(gxc, gxg, 5e-3, what + " grad x"));
    EXPECT_TRUE(close(gwc, gwg, 2e-3, what + " grad weight (f32, from f16 activations)"));
    EXPECT_TRUE(close(rmc, rmg, 1e-6, what + " running_mean"));
    EXPECT_TRUE(close(rvc, rvg, 1e-5, what + " running_var"));
  }
}

TEST_F(HalfParity, Conv2dForwardBackward) {
  // cuDNN runs f16 on tensor cores with f32 accumulation; the CPU computes in f32 and rounds once.
  // The bound is an f16 rounding or two, far below what a wrong index or layout gives (O(1)).
  Conv2dOptions s2;
  s2.stride = {2, 2};
  s2.padding = {1, 1};
  check_op("conv2d f16", [s2](const std::vector<Tensor>& v) { return conv2d(v[0], v[1], v[2], s2); },
           {{3, 5, 17, 15}, {8, 5, 3, 3}, {8}}, DType::f16, false, true, 1e-2);
  check_op("conv2d f16 1x1", [](const std::vector<Tensor>& v) { return conv2d(v[0], v[1], Tensor(), {}); },
           {{4, 16, 7, 7}, {32, 16, 1, 1}}, DType::f16, false, true, 1e-2);
}

// Pure-f16 models (nn::to_pure_f16, no autocast to lift the loss to f32) call softmax, log-softmax
// and NLL on f16; the CUDA kernels widen to f32 and round once, as the CPU does.
TEST_F(HalfParity, SoftmaxLogSoftmaxAndNll) {
  for (const auto& [s, d] : std::vector<std::pair<Shape, int64_t>>{{{7, 10}, 1}, {{5, 1000}, -1}, {{3, 7, 5}, 1}}) {
    check_op("softmax f16", [d = d](const std::vector<Tensor>& v) { return softmax(v[0] * 4.0, d); }, {s},
             DType::f16, false, true);
    check_op("log_softmax f16", [d = d](const std::vector<Tensor>& v) { return log_softmax(v[0] * 4.0, d); }, {s},
             DType::f16, false, true);
    if (HasFatalFailure()) return;
  }
  for (const auto& [N, C] : std::vector<std::pair<int64_t, int64_t>>{{1, 2}, {7, 1000}, {300, 10}}) {
    Generator g(static_cast<uint64_t>(N * C));
    const Tensor tc = (rand({N}, {DType::f64}, &g) * static_cast<double>(C)).to(DType::i64), tg = to_target(tc);
    int calls = 0;
    check_op("nll_loss f16 (mean)",
             [&](const std::vector<Tensor>& v) { return nll_loss(log_softmax(v[0], 1), calls++ == 1 ? tg : tc); },
             {{N, C}}, DType::f16, false, true);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace minidl
