// The step-time model on the emulated device with its counters (minidl_emu_prof): the call log
// puts cuDNN / cuBLAS calls in stream order among the kernels; a real small-CNN training step,
// profiled at six small sizes, predicts a held-out size's counters; the launch timer keys every
// launch as the model does (the GPU calibration's plumbing, rehearsed on the emulator).
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>

#include "perfmodel/calibrate.h"
#include "perfmodel/emu_profile.h"
#include "perfmodel/extrapolate.h"
#include "perfmodel/train_step.h"
#include "core/ops.h"
#include "cuda_emu/runtime_state.h"
#include "kernels/cuda/runtime.h"
#include "core/backend.h"
#include "core/conv_bn.h"
#include "perfmodel/report.h"
#include "nn/layers.h"

namespace minidl::gpumodel {
namespace {

Conv2dOptions pad1() {
  Conv2dOptions o;
  o.padding = {1, 1};
  return o;
}

StepProfile profile_small_cnn(int64_t batch, int64_t image, bool amp) {
  StepConfig c;
  c.model = "smallcnn";
  c.amp = amp;
  TrainStep ts(c, image, Device::cuda(0));
  ts.prepare(2, image);
  ts.run();   // warm-up: the optimizer's first step
  ts.prepare(batch, image);
  StepProfile p = profile_on_emulator([&] { ts.run(); }, batch, image);
  EXPECT_TRUE(ts.last_stepped());
  return p;
}

TEST(GpuModelOnTheEmulator, LibraryCallsSitInStreamOrderAmongTheKernels) {
  const TensorOptions o{DType::f32, Device::cuda(0), false};
  const Tensor x = randn({2, 3, 8, 8}, o), w = randn({4, 3, 3, 3}, o), m = randn({5, 7}, o), n = randn({7, 6}, o);
  Tensor y, z;
  const StepProfile p = profile_on_emulator(
      [&] {
        y = relu(conv2d(x, w, Tensor(), pad1()));
        z = matmul(m, n);
      },
      2, 8);
  std::vector<std::string> ops;
  for (const Work& wk : p.work) ops.push_back(wk.op);
  const auto conv = std::find(ops.begin(), ops.end(), "cuDNN conv forward");
  const auto gemm = std::find(ops.begin(), ops.end(), "cuBLAS gemm");
  ASSERT_NE(conv, ops.end());
  ASSERT_NE(gemm, ops.end());
  EXPECT_LT(conv - ops.begin(), std::find(ops.begin(), ops.end(), "relu") - ops.begin());   // relu after the conv
  const Work& c = p.work[static_cast<size_t>(conv - ops.begin())];
  EXPECT_DOUBLE_EQ(c.v[kFlops], 2.0 * 2 * 4 * 8 * 8 * 3 * 3 * 3);
  EXPECT_DOUBLE_EQ(c.v[kMinBytes], 4.0 * (2 * 3 * 8 * 8 + 4 * 3 * 3 * 3 + 2 * 4 * 8 * 8));
  EXPECT_EQ(c.math, Math::Tf32Tensor);   // f32 convolutions use TF32 by default, as PyTorch's
  const Work& g = p.work[static_cast<size_t>(gemm - ops.begin())];
  EXPECT_DOUBLE_EQ(g.v[kFlops], 2.0 * 5 * 6 * 7);
  EXPECT_EQ(g.math, Math::Fp32);   // TF32 is off for GEMMs by default
  // The relu's counters are real: 128 f32 values in, 128 out, 16 sectors each way at least.
  const Work& r = p.work[static_cast<size_t>(std::find(ops.begin(), ops.end(), "relu") - ops.begin())];
  EXPECT_GE(r.v[kUniqueSectorsRead], 64.0 * 2 * 4 / 32);
  // 512 f32 values as 128 16-byte Vec loads: 4 warp requests of 16 sectors, as nvcc's LDG.128
  // makes them (g++ would split each Vec copy into 4 narrow loads: 16 requests).
  EXPECT_EQ(r.v[kGldRequests], 4.0);
  EXPECT_EQ(r.v[kGldSectors], 64.0);
}

TEST(GpuModelOnTheEmulator, ASmallCnnStepExtrapolatesToAHeldOutSize) {
  for (const bool amp : {true}) {   // AMP: the casts and the gradient scaler's launches too
    std::vector<StepProfile> samples;
    // Batch 1 takes other paths (a broadcast bias is contiguous); reductions pick their block from
    // the reduced length up to 256, which N*S*S passes from 16 px on.
    for (int64_t s : {16, 24, 32})
      for (int64_t b : {2, 3}) samples.push_back(profile_small_cnn(b, s, amp));
    const Fit fit = fit_samples(samples);
    EXPECT_EQ(fit.terms.size(), 6u);
    const StepProfile held_out = profile_small_cnn(4, 24, amp);
    const FitError e = compare(predict(fit, 4, 24), held_out);
    // Every DRAM byte and FLOP of the step exactly, and 98% of the counters (a grid's block count
    // is a ceiling, not a polynomial).
    EXPECT_LT(e.dram_bytes_relative, 1e-9) << (amp ? "AMP: " : "FP32: ") << e.worst;
    EXPECT_LT(e.flops_relative, 1e-9) << e.worst;
    EXPECT_GE(e.exact_fields, e.fields * 98 / 100) << e.worst;
  }
}

// The keys of the launches `work` makes, timed (gated or not) by the launch timer.
template <class Work>
std::vector<std::string> timed_keys(bool gated, Work&& work) {
  cuda::synchronize(0);
  cuda::take_launch_times();
  cuda::set_launch_gating(gated);
  cuda::set_launch_timing(true);
  work();
  cuda::set_launch_timing(false);
  cuda::set_launch_gating(false);
  std::vector<std::string> keys;
  for (const cuda::LaunchTime& t : cuda::take_launch_times()) {
    keys.push_back(launch_key(t.op, t.kernel));
    EXPECT_GE(t.ms, 0.0);
  }
  return keys;
}

TEST(GpuModelOnTheEmulator, TheLaunchTimerKeysLaunchesAsTheModelDoes) {
  const TensorOptions o{DType::f32, Device::cuda(0), false};
  const Tensor x = randn({2, 3, 8, 8}, o), w = randn({4, 3, 3, 3}, o);
  const std::vector<std::string> keys = timed_keys(false, [&] {
    cuda::set_conv_nhwc(true);
    const Tensor y = relu(conv2d(x, w, Tensor(), pad1()));
    cuda::set_conv_nhwc(false);
  });
  // The transposes into and out of channels-last are filed apart from other copies.
  const auto conv = std::find(keys.begin(), keys.end(), "cuDNN conv forward");
  ASSERT_NE(conv, keys.end());
  EXPECT_EQ(keys.front().rfind("copy (conv2d NHWC transpose) / ", 0), 0u) << keys.front();
  EXPECT_EQ(keys.back(), "relu / (unary_vec_kernel<T>)");
  EXPECT_TRUE(cuda::take_launch_times().empty());   // taken once
}

// Gated timing (runtime.h, set_launch_gating): each timed launch sits behind a host function that
// waits until the host has enqueued the launch and its stop event, so on a GPU the event pair
// brackets the GPU's work alone. Deferred (the emulator's default, like a GPU that runs behind the
// host), the gates are open when the stream reaches them: the same launches are timed, none waits.
// Immediate (each piece of work runs as it is queued, like a GPU that keeps up with its host), the
// gate comes up before its launch is enqueued, so it waits out its timeout: that it does shows it
// holds the stream until the host opens it. (The emulated cuDNN and cuBLAS compute inside the
// call, so their calls are not gated on the emulator.)
TEST(GpuModelOnTheEmulator, GatedLaunchTimingTimesTheSameLaunchesAndHoldsTheStream) {
  const TensorOptions o{DType::f32, Device::cuda(0), false};
  const Tensor x = randn({2, 3, 8, 8}, o), w = randn({4, 3, 3, 3}, o);
  auto keys_of = [&](bool gated, bool with_conv) {
    return timed_keys(gated, [&] { const Tensor y = relu(with_conv ? conv2d(x, w, Tensor(), pad1()) : x); });
  };
  const bool deferred = cuda::emu::deferred_streams();   // the mode before the test, afterwards
  cuda::emu::set_deferred_streams(true);
  const size_t timeouts = cuda::launch_gate_timeouts();
  const std::vector<std::string> ungated = keys_of(false, true);
  ASSERT_EQ(ungated.size(), 2u);   // the convolution and the relu
  EXPECT_EQ(keys_of(true, true), ungated);
  EXPECT_EQ(cuda::launch_gate_timeouts(), timeouts) << "deferred: every gate was open when the stream reached it";

  cuda::emu::set_deferred_streams(false);
  const auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(keys_of(true, false), std::vector<std::string>{ungated.back()});
  const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_EQ(keys_of(false, false), std::vector<std::string>{ungated.back()});
  cuda::emu::set_deferred_streams(deferred);
  EXPECT_EQ(cuda::launch_gate_timeouts(), timeouts + 1) << "immediate: the relu's gate waited for its host";
  EXPECT_GE(waited, 0.45);
}

// The batch-norm reductions size their blocks per channel from the work (capped by the vectors a
// thread walks), so at a small emulated size they launch one block per channel and at the target
// many: a count no polynomial in the batch extrapolates. Planned with the target's scale, the
// small run launches the target's grid, and the extrapolated block count is the real one.
TEST(GpuModelOnTheEmulator, BatchNormGridsArePlannedForTheTargetSize) {
  const TensorOptions o{DType::f32, Device::cuda(0), false};
  const TensorOptions pc{DType::f32, Device::cuda(0), false};
  auto stats_blocks = [&](int64_t batch, int64_t side) {
    const Tensor x = randn({batch, 8, side, side}, o), w = ones({8}, pc), b = zeros({8}, pc);
    const StepProfile p = profile_on_emulator([&] { (void)batch_norm_relu(x, w, b, Tensor(), Tensor(), true); },
                                              batch, side);
    for (const Work& wk : p.work)
      if (wk.kernel.find("stats_kernel") != std::string::npos) return wk.v[kBlocks];
    ADD_FAILURE() << "no stats_kernel launch";
    return 0.0;
  };
  const double target = stats_blocks(32, 32);   // 8 channels x 8 blocks: 8,192 vectors of 4 floats
  EXPECT_EQ(target, 64.0);
  EXPECT_EQ(stats_blocks(2, 16), 8.0);           // one block per channel at the small size
  cuda::set_launch_plan_scale(32.0 * 32 * 32 / (2.0 * 16 * 16));
  const double planned = stats_blocks(2, 16);
  cuda::set_launch_plan_scale(1.0);
  EXPECT_EQ(planned, target);
}

// The forward's finalize reads only the partial sums and the shifts the statistics pass wrote, so
// its counters are a constant of the fit. It used to read each channel's first value of x, whose
// sectors follow the plane's size (4 channels a sector at 2x2, one at 3x3): the fit in N * S^2
// carried that wobble ~1,500x to the target, 4.5 MB a launch and 5 ms of "latency" in the table.
TEST(GpuModelOnTheEmulator, BatchNormFinalizeReadsTheSameBytesAtEverySize) {
  const TensorOptions o{DType::f32, Device::cuda(0), false};
  auto finalize_sectors = [&](int64_t side) {
    const Tensor x = randn({2, 8, side, side}, o), w = ones({8}, o), b = zeros({8}, o);
    const StepProfile p = profile_on_emulator([&] { (void)batch_norm_relu(x, w, b, Tensor(), Tensor(), true); },
                                              2, side);
    for (const Work& wk : p.work)
      if (wk.kernel.find("finalize_kernel") != std::string::npos) return wk.v[kUniqueSectorsRead];
    ADD_FAILURE() << "no finalize_kernel launch";
    return 0.0;
  };
  const double small = finalize_sectors(2);
  EXPECT_GT(small, 0.0);
  EXPECT_EQ(finalize_sectors(3), small);
  EXPECT_EQ(finalize_sectors(5), small);
}

// num_batches_tracked += 1 is one launch per training forward: the module keeps its 1 on the
// device (making it each step was a fill launch per batch norm, 53 of a ResNet-50 step's 739).
TEST(GpuModelOnTheEmulator, BatchNormCountsItsBatchesWithOneLaunch) {
  nn::BatchNorm2d bn(4);
  bn.to(Device::cuda(0));
  bn.train();
  const Tensor x = randn({2, 4, 3, 3}, {DType::f32, Device::cuda(0), false});
  (void)bn.forward_relu(x, Tensor());   // the first forward may set things up
  const StepProfile p = profile_on_emulator([&] { (void)bn.forward_relu(x, Tensor()); }, 2, 3);
  std::vector<std::string> ops;
  for (const Work& wk : p.work) ops.push_back(wk.op);
  EXPECT_EQ(std::count(ops.begin(), ops.end(), std::string("fill")), 0) << ::testing::PrintToString(ops);
  EXPECT_EQ(std::count(ops.begin(), ops.end(), std::string("add")), 1) << ::testing::PrintToString(ops);
  EXPECT_EQ(bn.num_batches_tracked().to(Device::cpu()).item(), 2.0);
}

// A CUDA graph launches the grids planned when it was captured: the step-time model's --mode graph
// must capture under the target's plan scale (gpumodel_main.cpp), or every batch norm of the
// profiled replay runs the small size's grid (a first graph-mode ResNet-50 table: 61.8 ms,
// batch norm latency-bound, against 40.8 ms eager).
TEST(GpuModelOnTheEmulator, GraphReplaysKeepTheGridsPlannedAtTheCapture) {
  const TensorOptions o{DType::f32, Device::cuda(0), false};
  const Tensor x = randn({2, 8, 16, 16}, o), w = ones({8}, o), b = zeros({8}, o);
  const Device dev = Device::cuda(0);
  auto replayed_stats_blocks = [&](bool planned_at_capture) {
    (void)batch_norm_relu(x, w, b, Tensor(), Tensor(), true);   // eager first, as a warm-up
    const double scale = 32.0 * 32 * 32 / (2.0 * 16 * 16);
    if (planned_at_capture) cuda::set_launch_plan_scale(scale);
    auto graph = backend(dev).capture_graph(dev.index, [&] { (void)batch_norm_relu(x, w, b, Tensor(), Tensor(), true); });
    cuda::set_launch_plan_scale(scale);
    const StepProfile p = profile_on_emulator([&] { graph->replay(); }, 2, 16);
    cuda::set_launch_plan_scale(1.0);
    for (const Work& wk : p.work)
      if (wk.kernel.find("stats_kernel") != std::string::npos) return wk.v[kBlocks];
    ADD_FAILURE() << "no stats_kernel launch in the replay";
    return 0.0;
  };
  EXPECT_EQ(replayed_stats_blocks(false), 8.0);   // the capture's own plan: one block per channel
  EXPECT_EQ(replayed_stats_blocks(true), 64.0);   // planned for 32 x 32 x 32, as eager at the target
}


// The convolutions that carry batch norm (core/conv_bn.h) run as cuDNN's fused graphs; each logs its
// convolution with the pattern's name, so the model prices it as the convolution it is (FLOPs at the
// tensor cores' peak, its operands' bytes, the scale-bias-ReLU and the statistics fused in) and the
// report shows it apart from the plain convolutions.
TEST(GpuModelOnTheEmulator, TheFusedConvolutionsArePricedAsConvolutionsCarryingBatchNorm) {
  const Device dev = Device::cuda(0);
  const auto leaf = [&](const Shape& s, DType t, bool cl) {
    Tensor v = randn(s, {t, dev, false});
    if (cl) v = to_channels_last(v).detach();
    return v.set_requires_grad(true);
  };
  const Tensor x = leaf({2, 8, 6, 6}, DType::f16, true), w1 = leaf({8, 8, 3, 3}, DType::f16, true);
  const Tensor w2 = leaf({8, 8, 1, 1}, DType::f16, true);
  const Tensor g = leaf({8}, DType::f32, false), b = leaf({8}, DType::f32, false);
  const StepProfile p = profile_on_emulator(
      [&] {
        const ConvStats s1 = conv2d_stats(x, Tensor(), Tensor(), w1, pad1());
        const BnAffine a = bn_finalize(s1, g, b, Tensor(), Tensor());
        const ConvStats s2 = conv2d_stats(s1.y, a.scale, a.bias, w2);
        sum(s2.y.to(DType::f32)).backward();
      },
      2, 6);
  std::vector<std::string> patterns;
  for (const Work& wk : p.work)
    if (wk.kind == Work::Kind::Library) patterns.push_back(wk.op + " " + wk.algo);
  const auto has = [&](const std::string& s) { return std::find(patterns.begin(), patterns.end(), s) != patterns.end(); };
  ASSERT_TRUE(has("cuDNN conv forward scale_bias_relu_conv_genstats")) << ::testing::PrintToString(patterns);
  EXPECT_TRUE(has("cuDNN conv backward filter scale_bias_relu_wgrad")) << ::testing::PrintToString(patterns);
  EXPECT_TRUE(has("cuDNN conv backward data dgrad_drelu_dbn_weight")) << ::testing::PrintToString(patterns);
  for (const Work& wk : p.work) {
    if (wk.algo != "scale_bias_relu_conv_genstats" || wk.v[kDims + 5] != 1) continue;   // the 1x1 forward
    EXPECT_DOUBLE_EQ(wk.v[kFlops], 2.0 * 2 * 8 * 6 * 6 * 8);
    // Stored tensors once: x, w and y in f16, the input's scale and bias and the output's sum and
    // sum of squares in f32; relu(x * scale + bias) is virtual and costs nothing.
    EXPECT_DOUBLE_EQ(wk.v[kMinBytes], 2.0 * (2 * 8 * 6 * 6 + 8 * 8 + 2 * 8 * 6 * 6) + 4.0 * 4 * 8);
    EXPECT_EQ(wk.math, Math::F16Tensor);
    EXPECT_EQ(wk.detail, "f16 NHWC");
  }
  // The backward's two elementwise passes (the statistics' gradients folded into the output's, and
  // gx = dr * scale) write 16 bytes a thread: 16 sectors a full warp's store (12 on average here,
  // the last warp a quarter full), not the 2 of 2-byte f16 accesses.
  int passes = 0;
  for (const Work& wk : p.work) {
    if (wk.kind != Work::Kind::Kernel || wk.op.rfind("conv2d_stats", 0) != 0) continue;
    ++passes;
    ASSERT_GT(wk.v[kGstRequests], 0.0) << wk.key();
    EXPECT_GE(wk.v[kGstSectors] / wk.v[kGstRequests], 12.0) << wk.key();
  }
  EXPECT_EQ(passes, 2);
  const ModelledStep m = model_step(p, {}, H100Spec{}, LaunchMode::Eager);
  ReportInfo info;
  info.title = "a chain";
  info.images_per_step = 2;
  const std::string md = markdown_report(m, info, H100Spec{});
  EXPECT_NE(md.find("cuDNN convolutions carrying batch norm (fused graphs)"), std::string::npos) << md;
}

}  // namespace
}  // namespace minidl::gpumodel
