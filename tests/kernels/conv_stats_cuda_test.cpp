// CPU-vs-CUDA parity of the convolutions that carry batch norm (core/conv_bn.h: conv2d_stats,
// bn_finalize, scale_bias_relu; Backend::conv2d_stats_forward / _backward, bn_finalize_forward /
// _backward): a two-convolution
// chain with its batch norms, the add and the ReLU, on the device under test against the CPU's
// composition, forward (output, running statistics) and backward (every input's gradient), in f32
// NCHW and channels-last and f16 channels-last (f32 statistics). kernels_cuda_emu runs it on the
// emulated device: the shapes stay small. There the fused graphs (kernels/cuda/conv_stats.cu) are
// counted through the call log (a fused execute logs its convolution with the pattern's name), and
// a channels-last ResNet-18 step with the chain is checked against the CPU's, and AMP steps (one
// the scaler skips, one it takes) against the composed path's.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/conv_bn.h"
#include "core/ops.h"
#include "nn/checkpoint.h"
#include "nn/resnet.h"
#include "optim/grad_scaler.h"
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

// A small-input ResNet of one basic block a stage with 10 classes: every kind of link a ResNet-18
// has, in about half its emulated time.
std::shared_ptr<nn::ResNet> resnet10_small(Generator* g) {
  return std::make_shared<nn::ResNet>(
      nn::ResNetOptions{.layers = {1, 1, 1, 1}, .num_classes = 10, .small_input = true}, g);
}

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
    const ConvStatsCounts before = conv_stats_counts();
    const FusedCounts n = count_fused([&] { run_chain(kGpu, c.dt, c.channels_last); });
    // What a run reports (RunResult::conv_stats): the first node's backward, without a prologue,
    // counts as composed.
    const ConvStatsCounts after = conv_stats_counts();
    EXPECT_EQ(after.fused_forward - before.fused_forward, 2 * c.fused) << tag;
    EXPECT_EQ(after.composed_forward - before.composed_forward, 2 - 2 * c.fused) << tag;
    EXPECT_EQ(after.fused_backward - before.fused_backward, c.fused) << tag;
    EXPECT_EQ(after.composed_backward - before.composed_backward, 2 - c.fused) << tag;
    EXPECT_EQ(n.forward, 2 * c.fused) << tag << ": scale_bias_relu_conv_genstats executes (with and without "
                                          "the prologue)";
    EXPECT_EQ(n.dgrad, c.fused) << tag << ": dgrad_drelu_dbn_weight executes";
    EXPECT_EQ(n.wgrad, c.fused) << tag << ": scale_bias_relu_wgrad executes";
    // Fused: the first node's data and filter gradients; composed: every convolution, 2 per node
    // forward (recomputed activation not needed there) and backward.
    EXPECT_EQ(n.plain_convs, c.fused ? 2 : 6) << tag << ": plain cuDNN convolutions";
  }
}

// Benchmark mode (--cudnn-benchmark on) times each fused graph's plans on the first call's own
// operands, cudnn_find_trials() runs each, once per shape; the results are the heuristic plans'
// (every trial's outputs are overwritten by the call's own run).
TEST_F(ConvStatsParity, BenchmarkModeTimesEachFusedGraphOncePerShapeAndChangesNoResult) {
  if (self_test()) GTEST_SKIP() << "the call log is the emulated device's";
  cuda::clear_conv_algo_cache();
  const ChainRun heuristic = run_chain(kGpu, DType::f16, true);
  cuda::clear_conv_algo_cache();
  cuda::set_cudnn_benchmark(true);
  ChainRun tuned;
  const FusedCounts first = count_fused([&] { tuned = run_chain(kGpu, DType::f16, true); });
  const FusedCounts second = count_fused([&] { run_chain(kGpu, DType::f16, true); });
  cuda::set_cudnn_benchmark(false);
  cuda::clear_conv_algo_cache();
  const int trials = cuda::cudnn_find_trials();
  EXPECT_EQ(second.forward, 2);
  EXPECT_EQ(first.forward, 2 * (1 + trials)) << "each forward graph's plan timed " << trials << " times";
  EXPECT_EQ(first.dgrad, 1 + trials);
  EXPECT_EQ(first.wgrad, 1 + trials);
  EXPECT_TRUE(close(heuristic.y, tuned.y, 0.0, "output"));
  for (size_t i = 0; i < heuristic.grads.size(); ++i)
    EXPECT_TRUE(close(heuristic.grads[i], tuned.grads[i], 0.0, "gradient " + std::to_string(i)));
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

// Recomputation on the device under test with the chain's one-launch finalize: a checkpointed stage
// reruns its finalizes inside the backward without updating the running statistics a second time,
// and every gradient is the plain step's.
TEST_F(ConvStatsParity, ACheckpointedChainUpdatesTheRunningStatisticsOnce) {
  Generator gp(7), gr(7), gx(8);
  auto plain = nn::resnet18(10, &gp, false, /*small_input=*/true);
  auto rerun = nn::resnet18(10, &gr, false, /*small_input=*/true);
  for (auto* m : {&plain, &rerun}) {
    (*m)->set_conv_bn_chain(true);
    (*m)->to(kGpu);
    (*m)->to_channels_last();
  }
  const Tensor x = to_channels_last(to_target(randn({2, 3, 16, 16}, {}, &gx)));
  sum((*plain)(x)).backward();
  Tensor h = nn::checkpoint([&](const Tensor& in) { return (*rerun->stage(1))(in); }, rerun->stem().run(x));
  for (int i = 2; i <= 4; ++i) h = (*rerun->stage(i))(h);
  sum(rerun->head().run(h)).backward();
  const auto bp = plain->named_buffers(), br = rerun->named_buffers();
  for (size_t i = 0; i < bp.size(); ++i)
    EXPECT_TRUE(close(bp[i].second.to(kGpu), br[i].second, 0.0, bp[i].first + " (updated twice?)"));
  const auto pp = plain->named_parameters(), pr = rerun->named_parameters();
  for (size_t i = 0; i < pp.size(); ++i)
    EXPECT_TRUE(close(pp[i].second.grad().to(kGpu), pr[i].second.grad(), 1e-5, "grad of " + pp[i].first));
}

// An AMP training step of a channels-last ResNet (resnet10_small) with the chain launches about what
// the default path (conv -> fused batch norm + ReLU) launches: the same library calls (the fused
// graphs replace the convolutions one for one) and a few kernels more (a ResNet-50 step: 564 against
// 500): each finalize is one launch each way, the statistics' gradients fold into the output's in
// one pass, a block's end is batch norm's fused apply kernel. Composed, the finalize alone was a
// dozen launches forward and two dozen backward.
TEST_F(ConvStatsParity, AChainedAmpStepLaunchesAboutWhatTheDefaultStepLaunches) {
  if (self_test()) GTEST_SKIP() << "launches are counted on the emulated device";
  Generator gx(8);
  const Tensor x = to_channels_last(to_target(randn({2, 3, 16, 16}, {}, &gx)));
  const Tensor labels = to_target(from_vector({3, 7}, {2}, {.dtype = DType::i64}));
  struct Launches {
    int64_t kernels = 0, calls = 0;
  };
  const auto count = [&](bool chain) {
    Generator g(7);
    auto m = resnet10_small(&g);
    m->set_conv_bn_chain(chain);
    m->to(kGpu);
    m->to_channels_last();
    optim::SGD opt(m->parameters(), {.lr = 0.1, .momentum = 0.9});
    optim::GradScaler scaler(optim::GradScalerOptions{.init_scale = 1024.0});
    const auto step = [&] {
      opt.zero_grad();
      Tensor loss;
      {
        AutocastGuard autocast(DType::f16);
        loss = cross_entropy(m->forward(x), labels);
      }
      scaler.scale(loss).backward();
      scaler.step(opt);
      scaler.update();
    };
    step();   // the optimizer's state, the plans
    Launches n;
#ifdef MINIDL_CUDA_EMU
    cuda::emu::clear_call_log();
    cuda::emu::set_call_logging(true);
    step();
    synchronize(kGpu);
    cuda::emu::set_call_logging(false);
    n.kernels = static_cast<int64_t>(cuda::emu::kernel_runs().size());
    for (const cuda::emu::LibCall& c : cuda::emu::call_log()) n.calls += c.lib != "runtime";
#endif
    return n;
  };
  const Launches plain = count(false), chained = count(true);
  ASSERT_GT(plain.kernels, 0);
  EXPECT_EQ(chained.calls, plain.calls);
  // The few more: each fused data gradient's constant rows (two fills) and its gx = dr * scale, each
  // block end's zero mean.
  EXPECT_LE(chained.kernels, plain.kernels * 120 / 100) << "default path " << plain.kernels << " kernels";
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

// bn_finalize on the device under test against the CPU's composition, forward (scale, shift, the
// running statistics) and backward (the sums', weight's and bias's gradients), with and without
// weight, bias and running statistics, in f32 and f64; a channel whose E[y^2] - E[y]^2 rounds below
// zero takes the clamp and passes no variance gradient. On the emulated device each direction is one
// launch (Backend::bn_finalize_forward / _backward), where the composition takes dozens.
TEST_F(ConvStatsParity, TheFinalizeMatchesTheCpuCompositionInOneLaunchEachWay) {
  struct Case {
    DType dt;
    bool affine, running;
  };
  for (const Case k : {Case{DType::f32, true, true}, Case{DType::f32, false, false}, Case{DType::f64, true, false},
                       Case{DType::f32, true, false}}) {
    const std::string tag = std::string(dtype_name(k.dt)) + (k.affine ? " affine" : " plain") +
                            (k.running ? " running" : "");
    constexpr int64_t kC = 37, kCount = 50;
    const auto run = [&](Device d) {
      const auto on = [&](const Tensor& t, bool grad) {
        Tensor v = d == Device::cpu() ? t.clone() : to_target(t);
        return grad ? v.set_requires_grad(true) : v;
      };
      // Sums of 50 values a channel: mean in [-1, 2], spread 0.05 to 1.5; the last channel's sumsq
      // is under count * mean^2 (a variance that rounded negative: clamped).
      const std::vector<double> mean = rnd({kC}, DType::f64, 21, -1.0, 2.0).to_vector();
      const std::vector<double> spread = rnd({kC}, DType::f64, 22, 0.05, 1.5).to_vector();
      std::vector<double> sums(kC), sumsqs(kC);
      for (size_t c = 0; c < sums.size(); ++c) {
        sums[c] = mean[c] * kCount;
        sumsqs[c] = (mean[c] * mean[c] + (c + 1 < sums.size() ? spread[c] * spread[c] : -1e-3)) * kCount;
      }
      const TensorOptions host{k.dt, Device::cpu(), false};
      ConvStats st{Tensor(), on(from_vector(sums, {kC}, host), true), on(from_vector(sumsqs, {kC}, host), true),
                   kCount};
      const Tensor w = k.affine ? on(rnd({kC}, k.dt, 23, 0.5, 1.5), true) : Tensor();
      const Tensor b = k.affine ? on(rnd({kC}, k.dt, 24, -0.5, 0.5), true) : Tensor();
      const Tensor rm = k.running ? on(rnd({kC}, k.dt, 25, -0.2, 0.2), false) : Tensor();
      const Tensor rv = k.running ? on(rnd({kC}, k.dt, 26, 0.5, 2.0), false) : Tensor();
      BnAffine a;
      const auto forward = [&] { a = bn_finalize(st, w, b, rm, rv, 0.1, 1e-5); };
      const auto backward = [&] {
        const Tensor ga = on(rnd({kC}, k.dt, 27, -1.0, 1.0), false), gb = on(rnd({kC}, k.dt, 28, -1.0, 1.0), false);
        sum(a.scale * ga + a.bias * gb).backward();
      };
#ifdef MINIDL_CUDA_EMU
      if (d != Device::cpu()) {
        for (const auto& [what, fn] : {std::pair<const char*, std::function<void()>>{"forward", forward},
                                       std::pair<const char*, std::function<void()>>{"backward", backward}}) {
          cuda::emu::clear_call_log();
          cuda::emu::set_call_logging(true);
          fn();
          synchronize(kGpu);   // the runs are logged as they execute
          cuda::emu::set_call_logging(false);
          const int64_t kernels = static_cast<int64_t>(cuda::emu::kernel_runs().size());
          // The finalize's one launch; the backward also seeds and sums the loss above (a handful).
          if (std::string(what) == "forward") EXPECT_EQ(kernels, 1) << tag << ": " << what << " launches";
          else EXPECT_LE(kernels, 8) << tag << ": " << what << " launches";
        }
      } else {
        forward();
        backward();
      }
#else
      forward();
      backward();
#endif
      std::vector<Tensor> out{a.scale.detach(), a.bias.detach(), st.sum.grad(), st.sumsq.grad()};
      if (k.affine) out.insert(out.end(), {w.grad(), b.grad()});
      if (k.running) out.insert(out.end(), {rm, rv});
      return out;
    };
    const std::vector<Tensor> cpu = run(Device::cpu()), dev = run(kGpu);
    const char* names[] = {"scale", "shift", "gsum", "gsumsq", "gweight", "gbias", "running_mean", "running_var"};
    const double tol = k.dt == DType::f64 ? 1e-12 : 1e-5;
    for (size_t i = 0; i < cpu.size(); ++i) {
      const size_t name = !k.affine && i >= 4 ? i + 2 : i;
      EXPECT_TRUE(close(cpu[i], dev[i], tol, tag + " " + names[name]));
    }
    // The clamped channel: no gradient through its variance (sumsq's), as relu's backward at 0.
    EXPECT_EQ(cpu[3].to(Device::cpu()).to_vector().back(), 0.0) << tag;
    EXPECT_EQ(dev[3].to(Device::cpu()).to_vector().back(), 0.0) << tag;
  }
}

// AMP steps with the chain and without, on the device under test, against the composed path in f32:
// a step the scaler skips (a planted overflow) changes no weight in either and backs both scales
// off alike; the running statistics, which the forward updates whether or not the step is then
// skipped (as PyTorch's batch norm), and the next step's update, at a sane scale, are as close to
// f32's with the chain as without it.
TEST_F(ConvStatsParity, AnAmpStepTheScalerSkipsLeavesTheChainWhereItLeavesTheComposedPath) {
  enum class Path { F32, AmpComposed, AmpChain };
  struct Run {
    std::vector<Tensor> update, stats;
    double scale_after_skip = 0;
  };
  Generator gx(8);
  const Tensor x = to_channels_last(to_target(randn({2, 3, 16, 16}, {}, &gx)));
  const Tensor labels = to_target(from_vector({3, 7}, {2}, {.dtype = DType::i64}));
  const auto snapshot = [](nn::Module& m) {
    std::vector<Tensor> v;
    for (const auto& [name, p] : m.named_parameters()) v.push_back(p.detach().to(DType::f64).clone());
    return v;
  };
  const auto run = [&](Path path) {
    const bool amp = path != Path::F32;
    const std::string tag = path == Path::F32 ? "f32" : path == Path::AmpChain ? "AMP chain" : "AMP composed";
    Generator g(7);
    auto m = resnet10_small(&g);
    m->set_conv_bn_chain(path == Path::AmpChain);
    m->to(kGpu);
    m->to_channels_last();
    optim::SGD opt(m->parameters(), {.lr = 0.1, .momentum = 0.9});
    optim::GradScaler scaler(optim::GradScalerOptions{.init_scale = 1024.0, .enabled = amp});
    const auto step = [&] {
      opt.zero_grad();
      Tensor loss;
      {
        AutocastGuard autocast(DType::f16, amp);
        loss = cross_entropy(m->forward(x), labels);
      }
      scaler.scale(loss).backward();
      const bool stepped = scaler.step(opt);
      scaler.update();
      return stepped;
    };
    Run r;
    const std::vector<Tensor> before = snapshot(*m);
    if (amp) {
      scaler.update(1e38);   // planted: the f16 gradients overflow
      EXPECT_FALSE(step()) << tag << ": the overflowing step was not skipped";
      const std::vector<Tensor> after = snapshot(*m);
      for (size_t i = 0; i < before.size(); ++i)
        EXPECT_TRUE(close(before[i], after[i], 0.0, tag + ": a skipped step changed parameter " + std::to_string(i)));
      r.scale_after_skip = scaler.get_scale();
      scaler.update(1024.0);
    } else {
      NoGradGuard no_grad;
      (void)m->forward(x);   // the skipped step's forward, for the running statistics
    }
    EXPECT_TRUE(step()) << tag << ": the step at a sane scale was skipped";
    const std::vector<Tensor> after = snapshot(*m);
    for (size_t i = 0; i < before.size(); ++i) r.update.push_back(after[i] - before[i]);
    for (const auto& [name, b] : m->named_buffers())
      if (b.dtype() == DType::f32) r.stats.push_back(b.detach().to(DType::f64).clone());
    return r;
  };
  const Run f32 = run(Path::F32), composed = run(Path::AmpComposed), chained = run(Path::AmpChain);
  EXPECT_EQ(chained.scale_after_skip, composed.scale_after_skip);
  EXPECT_LT(composed.scale_after_skip, 1e38);   // backed off
  const auto error = [](const std::vector<Tensor>& ref, const std::vector<Tensor>& v) {
    double num = 0, den = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      num += sum(square(v[i] - ref[i])).item();
      den += sum(square(ref[i])).item();
    }
    return std::sqrt(num / den);
  };
  const double update_composed = error(f32.update, composed.update), update_chained = error(f32.update, chained.update);
  const double stats_composed = error(f32.stats, composed.stats), stats_chained = error(f32.stats, chained.stats);
  // f16 moves this batch-2 ResNet's update by about 5% either way (its last batch norms see 8
  // values a channel); a chain that lost a ReLU or a scale is off by its whole size.
  EXPECT_GT(update_composed, 0.0);
  EXPECT_LE(update_chained, 1.5 * update_composed) << "the chain's AMP update is further from f32's than the composed one";
  EXPECT_LE(stats_chained, 1.5 * stats_composed + 1e-6) << "the chain's running statistics are further from f32's";
}

}  // namespace
}  // namespace minidl
