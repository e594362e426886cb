// CPU-vs-CUDA parity of the convolutions that carry batch norm (core/conv_bn.h: conv2d_stats,
// bn_finalize, scale_bias_relu; Backend::conv2d_stats_forward / _backward): a two-convolution
// chain with its batch norms, the add and the ReLU, on the device under test against the CPU's
// composition, forward (output, running statistics) and backward (every input's gradient), in f32
// NCHW and channels-last and f16 channels-last (f32 statistics). kernels_cuda_emu runs it on the
// emulated device: the shapes stay small.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/conv_bn.h"
#include "core/ops.h"
#include "tests/support/parity_helpers.h"

namespace minidl {
namespace {

using namespace testing::parity;   // NOLINT: the shared harness (tests/support/parity_helpers.h)

class ConvStatsParity : public Parity {};

struct ChainRun {
  Tensor y, rm1, rv1, rm2, rv2;
  std::vector<Tensor> grads;   // x, w1, w2, gamma1, beta1, gamma2, beta2, residual
};

// x [2, 6, 7, 7] -> 3x3 stride 2 -> [2, 8, 4, 4] -> 1x1 -> + residual -> ReLU.
ChainRun run_chain(Device d, DType dt, bool channels_last) {
  const DType pd = dt == DType::f16 ? DType::f32 : dt;
  auto leaf = [&](const Shape& s, DType t, uint64_t seed, double lo, double hi, bool cl) {
    Tensor v = rnd(s, t, seed, lo, hi);
    v = d == Device::cpu() ? v.clone() : to_target(v);
    if (cl) v = to_channels_last(v).detach();
    return v.set_requires_grad(true);
  };
  const Tensor x = leaf({2, 6, 7, 7}, dt, 1, -1.0, 2.0, channels_last);
  const Tensor w1 = leaf({8, 6, 3, 3}, dt, 2, -0.3, 0.3, channels_last);
  const Tensor w2 = leaf({8, 8, 1, 1}, dt, 3, -0.5, 0.5, channels_last);
  const Tensor g1 = leaf({8}, pd, 4, 0.5, 1.5, false), b1 = leaf({8}, pd, 5, -0.5, 0.5, false);
  const Tensor g2 = leaf({8}, pd, 6, 0.5, 1.5, false), b2 = leaf({8}, pd, 7, -0.5, 0.5, false);
  const Tensor r = leaf({2, 8, 4, 4}, dt, 8, -1.0, 1.0, channels_last);
  ChainRun out;
  const TensorOptions po{pd, d, false};
  out.rm1 = zeros({8}, po), out.rv1 = ones({8}, po), out.rm2 = zeros({8}, po), out.rv2 = ones({8}, po);
  const Conv2dOptions s2{.stride = {2, 2}, .padding = {1, 1}};
  const ConvStats s1 = conv2d_stats(x, Tensor(), Tensor(), w1, s2);
  const BnAffine a1 = bn_finalize(s1, g1, b1, out.rm1, out.rv1);
  const ConvStats st2 = conv2d_stats(s1.y, a1.scale, a1.bias, w2);
  const BnAffine a2 = bn_finalize(st2, g2, b2, out.rm2, out.rv2);
  out.y = scale_bias_relu(st2.y, a2.scale, a2.bias, r);
  const Tensor gy = rnd(out.y.shape(), DType::f32, 9);
  sum(out.y.to(DType::f32) * (d == Device::cpu() ? gy : to_target(gy))).backward();
  for (const Tensor& t : {x, w1, w2, g1, b1, g2, b2, r}) out.grads.push_back(t.grad());
  return out;
}

TEST_F(ConvStatsParity, TheChainMatchesTheCpuForwardAndBackward) {
  const char* names[] = {"x", "w1", "w2", "gamma1", "beta1", "gamma2", "beta2", "residual"};
  struct Case {
    DType dt;
    bool channels_last;
  };
  for (const Case c : {Case{DType::f32, false}, Case{DType::f32, true}, Case{DType::f16, true}}) {
    const std::string tag = std::string(dtype_name(c.dt)) + (c.channels_last ? " channels-last" : " NCHW");
    const ChainRun cpu = run_chain(Device::cpu(), c.dt, c.channels_last);
    const ChainRun gpu = run_chain(kGpu, c.dt, c.channels_last);
    const double tol = c.dt == DType::f16 ? 5e-3 : 1e-4;
    EXPECT_TRUE(close(cpu.y, gpu.y, tol, tag + " output"));
    EXPECT_EQ(is_channels_last(gpu.y), c.channels_last) << tag;
    for (size_t i = 0; i < cpu.grads.size(); ++i) {
      EXPECT_TRUE(close(cpu.grads[i], gpu.grads[i], c.dt == DType::f16 ? 2e-2 : 1e-4, tag + " grad " + names[i]));
    }
    EXPECT_TRUE(close(cpu.rm1, gpu.rm1, 1e-4, tag + " running_mean 1"));
    EXPECT_TRUE(close(cpu.rv1, gpu.rv1, 1e-4, tag + " running_var 1"));
    EXPECT_TRUE(close(cpu.rm2, gpu.rm2, 1e-4, tag + " running_mean 2"));
    EXPECT_TRUE(close(cpu.rv2, gpu.rv2, 1e-4, tag + " running_var 2"));
  }
}

}  // namespace
}  // namespace minidl
