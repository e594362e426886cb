// CPU-vs-CUDA parity of the convolutions that carry batch norm (core/conv_bn.h: conv2d_stats,
// bn_finalize, scale_bias_relu; Backend::conv2d_stats_forward / _backward): a two-convolution
// chain with its batch norms, the add and the ReLU, on the device under test against the CPU's
// composition, forward (output, running statistics) and backward (every input's gradient), in f32
// NCHW and channels-last and f16 channels-last (f32 statistics). kernels_cuda_emu runs it on the
// emulated device: the shapes stay small. There the fused graphs (kernels/cuda/conv_stats.cu) are
// counted through the call log (a fused execute logs its convolution with the pattern's name), and
// a channels-last ResNet-18 step with the chain is checked against the CPU's.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/conv_bn.h"
#include "core/ops.h"
#include "nn/resnet.h"
#include "optim/sgd.h"
#include "kernels/cuda/runtime.h"
#include "tests/support/parity_helpers.h"

#ifdef MINIDL_CUDA_EMU
#include "cuda_emu/call_log.h"
#endif

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

#ifdef MINIDL_CUDA_EMU
// How many fused executes of each pattern fn made on the emulated device.
// (The emulator names the forward with or without its prologue scale_bias_relu_conv_genstats.)
struct FusedCounts {
  int forward = 0, dgrad = 0, wgrad = 0, plain_convs = 0;
};
template <class F>
FusedCounts count_fused(F&& fn) {
  cuda::emu::clear_call_log();
  cuda::emu::set_call_logging(true);
  fn();
  cuda::emu::set_call_logging(false);
  FusedCounts n;
  for (const cuda::emu::LibCall& c : cuda::emu::call_log()) {
    if (c.lib != "cuDNN" || c.op.rfind("conv", 0) != 0) continue;
    const int forward = c.algo == "scale_bias_relu_conv_genstats", dgrad = c.algo == "dgrad_drelu_dbn_weight",
              wgrad = c.algo == "scale_bias_relu_wgrad";
    n.forward += forward, n.dgrad += dgrad, n.wgrad += wgrad;
    n.plain_convs += forward + dgrad + wgrad == 0;
  }
  return n;
}

// The chain's two conv2d_stats nodes: the first (no in_scale) forward as conv + genstats and its
// backward composed from the plain convolutions, the second forward and backward fused; NCHW and f64
// compose everything.
TEST_F(ConvStatsParity, ChannelsLastRunsTheFusedGraphsAndNchwComposes) {
  if (self_test()) GTEST_SKIP() << "the call log is the emulated device's";
  struct Case {
    DType dt;
    bool channels_last;
    int fused;   // 1: each fused pattern once; 0: none
  };
  for (const Case c : {Case{DType::f32, true, 1}, Case{DType::f16, true, 1}, Case{DType::f32, false, 0},
                       Case{DType::f64, true, 0}}) {
    const std::string tag = std::string(dtype_name(c.dt)) + (c.channels_last ? " channels-last" : " NCHW");
    const FusedCounts n = count_fused([&] { run_chain(kGpu, c.dt, c.channels_last); });
    EXPECT_EQ(n.forward, 2 * c.fused) << tag << ": scale_bias_relu_conv_genstats executes (with and without "
                                          "the prologue)";
    EXPECT_EQ(n.dgrad, c.fused) << tag << ": dgrad_drelu_dbn_weight executes";
    EXPECT_EQ(n.wgrad, c.fused) << tag << ": scale_bias_relu_wgrad executes";
    // Fused: the first node's data and filter gradients; composed: every convolution, 2 per node
    // forward (recomputed activation not needed there) and backward.
    EXPECT_EQ(n.plain_convs, c.fused ? 2 : 6) << tag << ": plain cuDNN convolutions";
  }
}
#endif

// The fused graphs' plans are part of the convolutions' plan cache: counted, reused, cleared.
TEST_F(ConvStatsParity, TheFusedPlansAreInTheConvolutionPlanCache) {
  cuda::clear_conv_algo_cache();
  EXPECT_EQ(cuda::conv_algo_cache_size(), 0u);
  run_chain(kGpu, DType::f32, true);
  const size_t planned = cuda::conv_algo_cache_size();
  EXPECT_GE(planned, 4u) << "at least the four fused graphs of the chain's shapes";
  run_chain(kGpu, DType::f32, true);
  EXPECT_EQ(cuda::conv_algo_cache_size(), planned) << "the second pass reuses every plan";
  cuda::clear_conv_algo_cache();
  EXPECT_EQ(cuda::conv_algo_cache_size(), 0u);
}

// A channels-last ResNet-18 training step (small input) with the convolutions carrying batch norm,
// on the device under test against the CPU's chain: loss, every gradient, every parameter after
// an SGD step, the running statistics.
TEST_F(ConvStatsParity, AChannelsLastResNet18ChainStepMatchesTheCpu) {
  Generator gc(7), gd(7), gx(8);
  auto cpu = nn::resnet18(10, &gc, false, /*small_input=*/true);
  auto dev = nn::resnet18(10, &gd, false, /*small_input=*/true);
  cpu->set_conv_bn_chain(true);
  dev->set_conv_bn_chain(true);
  dev->to(kGpu);
  ASSERT_GT(dev->to_channels_last(), 0);
  const Tensor x = randn({2, 3, 16, 16}, {}, &gx);
  const Tensor labels = from_vector({3, 7}, {2}, {.dtype = DType::i64});
  const auto step = [&](nn::ResNet& m, const Tensor& in) {
    optim::SGD opt(m.parameters(), {.lr = 0.1, .momentum = 0.9});
    const Tensor loss = cross_entropy(m.forward(in), labels.to(in.device()));
    loss.backward();
    std::vector<Tensor> grads;
    for (const auto& [name, p] : m.named_parameters()) grads.push_back(p.grad().detach().clone());
    opt.step();
    return std::make_pair(loss.item(), grads);
  };
  const auto c = step(*cpu, x);
#ifdef MINIDL_CUDA_EMU
  std::pair<double, std::vector<Tensor>> d;
  const FusedCounts n = count_fused([&] { d = step(*dev, to_channels_last(to_target(x))); });
  if (!self_test()) {
    // 8 basic blocks of two chained convolutions (the stem and the downsamples stay conv + batch
    // norm): 16 emit their statistics, and each block's second, reading through the first's batch
    // norm and ReLU, takes the fused backward too.
    EXPECT_EQ(n.forward, 16) << "fused forwards";
    EXPECT_EQ(n.dgrad, 8) << "fused data gradients";
    EXPECT_EQ(n.wgrad, 8) << "fused filter gradients";
  }
#else
  const auto d = step(*dev, to_channels_last(to_target(x)));
#endif
  EXPECT_NEAR(c.first, d.first, 1e-5);
  const auto names = cpu->named_parameters();
  const auto dev_params = dev->named_parameters();
  for (size_t i = 0; i < names.size(); ++i) {
    EXPECT_TRUE(close(c.second[i], d.second[i], 1e-4, "grad of " + names[i].first));
    EXPECT_TRUE(close(names[i].second.detach(), dev_params[i].second.detach(), 1e-4,
                      names[i].first + " after the step"));
  }
  const auto buffers = cpu->named_buffers(), dev_buffers = dev->named_buffers();
  for (size_t i = 0; i < buffers.size(); ++i) {
    if (buffers[i].second.dtype() != DType::f32) continue;
    EXPECT_TRUE(close(buffers[i].second, dev_buffers[i].second, 1e-4, buffers[i].first));
  }
}

}  // namespace
}  // namespace minidl
