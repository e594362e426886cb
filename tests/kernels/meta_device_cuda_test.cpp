// The dry run for a GPU (meta:cuda, docs/memory.md) against a measured step on the CUDA backend:
// the caching allocator's model on address ranges, cuDNN's workspaces (heuristic order, the first
// that fits), cuBLAS's workspace, batch norm's coefficients and the fused optimizer's tables give
// the device's peak allocated and reserved bytes; the fused batch norm's scratch (per-block partial
// sums whose block count follows the launch geometry) too. As kernels_cuda_emu it checks the model against
// the emulated device (its cuDNN stand-in defines the algorithms); as kernels_cuda, on a GPU.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/autocast.h"
#include "core/backend.h"
#include "core/generator.h"
#include "core/ops.h"
#include "kernels/meta/cuda_model.h"
#include "nn/layers.h"
#include "nn/resnet.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "tests/support/error_of.h"
#ifdef MINIDL_WITH_CUDA
#include "kernels/cuda/runtime.h"
#endif

namespace minidl {
namespace {

struct Peaks {
  int64_t allocated = 0, reserved = 0;
};

std::shared_ptr<nn::Sequential> net(Generator& gen) {
  using namespace nn;
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Conv2d>(3, 16, 3, 1, 1, 1, false, &gen), std::make_shared<BatchNorm2d>(16),
      std::make_shared<ReLU>(), std::make_shared<Conv2d>(16, 32, 3, 2, 1, 1, false, &gen),
      std::make_shared<BatchNorm2d>(32), std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(2),
      std::make_shared<Flatten>(), std::make_shared<Linear>(32 * 4 * 4, 10, true, &gen)});
}

// Two training steps (SGD with momentum; AMP: f16 autocast with a gradient scaler, or bf16 autocast
// without one, `amp_dtype`), peaks above the start, of
// the small net, or of a ResNet-18 for 32 px images (its residual joins: the convolution's data
// gradient added into the shortcut's, conv2d_backward_input_add), NCHW or channels-last, with its
// convolutions carrying the batch norms (`chain`: cuDNN's fused graphs, core/conv_bn.h) or not.
Peaks train(Device d, bool amp, bool resnet = false, bool channels_last = false, bool chain = false,
            DType amp_dtype = DType::f16) {
  Generator gen(7);
  std::shared_ptr<nn::Module> model;
  if (resnet) {
    auto r = nn::resnet18(10, &gen, false, /*small=*/true);
    r->set_conv_bn_chain(chain);
    model = r;
  } else {
    model = net(gen);
  }
  model->to(d);
  if (channels_last) model->to_channels_last();
  optim::SgdOptions so;
  so.lr = 0.01;
  so.momentum = 0.9;
  optim::SGD opt(model->parameters(), so);
  optim::GradScaler scaler(optim::GradScalerOptions{.init_scale = 1.0, .enabled = amp && amp_dtype == DType::f16});
  // cuBLAS's workspace is drawn once per device, at the first GEMM: draw it on both first.
  (void)matmul(ones({2, 2}, {DType::f32, d}), ones({2, 2}, {DType::f32, d}));
  empty_cache(d);
  const MemoryStats before = memory_stats(d);
  reset_peak_stats(d);
  for (int s = 0; s < 2; ++s) {
    Tensor x = randn({resnet ? 2 : 6, 3, 16, 16}, {DType::f32, d}, &gen);
    if (channels_last) x = to_channels_last(x);
    const Tensor y = zeros({x.size(0)}, {DType::i64, d});
    Tensor loss;
    {
      AutocastGuard autocast(amp_dtype, amp);
      loss = cross_entropy((*model)(x), y);
    }
    scaler.scale(loss).backward();
    scaler.step(opt);
    scaler.update();
    opt.zero_grad();
  }
  const MemoryStats after = memory_stats(d);
  return {after.peak_allocated_bytes - before.allocated_bytes, after.peak_reserved_bytes - before.reserved_bytes};
}

TEST(MetaDeviceCuda, DryRunEqualsTheMeasuredStep) {
  if (!cuda_available()) GTEST_SKIP() << "needs a CUDA device (or the emulated one) for cuDNN's answers";
  for (const DType mode : {DType::f32, DType::f16, DType::bf16}) {
    SCOPED_TRACE(mode == DType::f32 ? "FP32" : mode == DType::f16 ? "AMP f16" : "AMP bf16");
    const bool amp = mode != DType::f32;
    const DType low = amp ? mode : DType::f16;   // the guard's dtype, unused when it is off
    const Peaks dry = train(Device::meta(DeviceType::CUDA), amp, false, false, false, low);
    const Peaks real = train(Device::cuda(0), amp, false, false, false, low);
    EXPECT_GT(real.allocated, 0);
    EXPECT_EQ(dry.allocated, real.allocated) << "peak allocated";
    EXPECT_EQ(dry.reserved, real.reserved) << "peak reserved";
  }
}

// Expandable segments (kernels/caching_allocator.h): the device's large blocks in pages mapped into one
// address range (on the emulated device through its stand-in of the driver's virtual memory calls,
// cuda_emu/vmm.cpp), the dry run's in pages of an address range: the same peaks. (The mode is chosen
// before a device's first tensor, so the comparison with fixed segments is the allocator's tests'.)
TEST(MetaDeviceCuda, DryRunEqualsTheMeasuredStepWithExpandableSegments) {
  if (!cuda_available()) GTEST_SKIP() << "needs a CUDA device (or the emulated one) for cuDNN's answers";
  for (const Device d : {Device::meta(DeviceType::CUDA), Device::cuda(0)}) set_expandable_segments(d, true);
  for (const bool amp : {true, false}) {
    SCOPED_TRACE(amp ? "AMP f16" : "FP32");
    const Peaks dry = train(Device::meta(DeviceType::CUDA), amp);
    const Peaks real = train(Device::cuda(0), amp);
    EXPECT_GT(real.allocated, 0);
    EXPECT_EQ(dry.allocated, real.allocated) << "peak allocated";
    EXPECT_EQ(dry.reserved, real.reserved) << "peak reserved";
  }
}

// Channels-last, the CUDA + AMP default, with residual joins: this test found the model copying
// the weight gradients for the AMP unscale, which amp.cu walks flat (25 MB over the device's peak
// here). One format only (about 20 s emulated); the NCHW pieces are the small net's above.
TEST(MetaDeviceCuda, DryRunEqualsTheMeasuredStepOfAChannelsLastResNet) {
  if (!cuda_available()) GTEST_SKIP() << "needs a CUDA device (or the emulated one) for cuDNN's answers";
  const Peaks dry = train(Device::meta(DeviceType::CUDA), true, true, true);
  const Peaks real = train(Device::cuda(0), true, true, true);
  EXPECT_GT(real.allocated, 0);
  EXPECT_EQ(dry.allocated, real.allocated) << "peak allocated";
  EXPECT_EQ(dry.reserved, real.reserved) << "peak reserved";
}

// The same step with the convolutions carrying the batch norms: each fused graph's workspace (the
// plans' order, the first that fits) and the backward's per-channel scratch.
TEST(MetaDeviceCuda, DryRunEqualsTheMeasuredStepOfAResNetWhoseConvolutionsCarryTheBatchNorms) {
  if (!cuda_available()) GTEST_SKIP() << "needs a CUDA device (or the emulated one) for cuDNN's answers";
  const Peaks dry = train(Device::meta(DeviceType::CUDA), true, true, true, true);
  const Peaks real = train(Device::cuda(0), true, true, true, true);
  EXPECT_GT(real.allocated, 0);
  EXPECT_EQ(dry.allocated, real.allocated) << "peak allocated";
  EXPECT_EQ(dry.reserved, real.reserved) << "peak reserved";
}

TEST(MetaDeviceCuda, ConvolutionWorkspacesEqualTheDevices) {
  if (!cuda_available()) GTEST_SKIP() << "needs a CUDA device (or the emulated one) for cuDNN's answers";
  // One convolution's three directions, each with cuDNN's first-ranked workspace.
  const auto peak = [](Device d) {
    Generator gen(3);
    const Tensor x = randn({4, 8, 32, 32}, {DType::f32, d, true}, &gen);
    const Tensor w = randn({16, 8, 5, 5}, {DType::f32, d, true}, &gen);
    empty_cache(d);
    const MemoryStats before = memory_stats(d);
    reset_peak_stats(d);
    Conv2dOptions o;
    o.padding = {2, 2};
    sum(conv2d(x, w, Tensor(), o)).backward();
    const MemoryStats after = memory_stats(d);
    return Peaks{after.peak_allocated_bytes - before.allocated_bytes, after.peak_reserved_bytes - before.reserved_bytes};
  };
  // What a GEMM leaves on a device for good (cuBLAS's workspace, in a segment with room to spare),
  // on both devices: an earlier test may have left it on one of them, and the convolution's
  // workspace would then fit in that segment's spare room there and not on the other.
  for (const Device d : {Device::meta(DeviceType::CUDA), Device::cuda(0)}) {
    const TensorOptions o{DType::f32, d, false};
    (void)matmul(ones({2, 2}, o), ones({2, 2}, o));
  }
  const Peaks dry = peak(Device::meta(DeviceType::CUDA)), real = peak(Device::cuda(0));
  EXPECT_EQ(dry.allocated, real.allocated) << "peak allocated (the workspaces are part of it)";
  EXPECT_EQ(dry.reserved, real.reserved) << "peak reserved";
}

// relu(batch_norm(x) [+ r]) fused, forward and backward, from values made on the host; the peaks
// above the start.
Peaks fused_bn(Device d, const Shape& s, DType dt, bool channels_last, bool residual, bool training) {
  Generator gen(5);
  const auto leaf = [&](const Shape& shape, DType t, bool cl) {
    Tensor v = randn(shape, {DType::f32, Device::cpu()}, &gen).to(t).to(d);
    if (cl) v = to_channels_last(v).detach();
    v.set_requires_grad(true);
    return v;
  };
  const Tensor x = leaf(s, dt, channels_last), r = residual ? leaf(s, dt, channels_last) : Tensor();
  const Tensor w = leaf({s[1]}, DType::f32, false), b = leaf({s[1]}, DType::f32, false);
  const Tensor rm = zeros({s[1]}, {DType::f32, d}), rv = ones({s[1]}, {DType::f32, d});
  const Tensor gy = leaf(s, dt, channels_last).detach();
  empty_cache(d);
  const MemoryStats before = memory_stats(d);
  reset_peak_stats(d);
  {
    const Tensor y = residual ? batch_norm_add_relu(x, r, w, b, rm, rv, training)
                              : batch_norm_relu(x, w, b, rm, rv, training);
    y.backward(gy);
  }
  const MemoryStats after = memory_stats(d);
  return {after.peak_allocated_bytes - before.allocated_bytes, after.peak_reserved_bytes - before.reserved_bytes};
}

// A reduction with few outputs over many elements is split across blocks, whose partials are a
// temporary (kernels/cuda/reduce.cu): whole-tensor and per-row sums, max and argmax; the peaks
// above the start.
Peaks reductions(Device d) {
  const Tensor x = zeros({3, 40000}, {DType::f32, d}), v = zeros({50000}, {DType::f16, d});
  empty_cache(d);
  const MemoryStats before = memory_stats(d);
  reset_peak_stats(d);
  {
    // The large output first, so that each split reduction's partials add to the peak.
    const Tensor f = sum(x, {0}), a = sum(x), b = sum(x, {1}), c = max(v), e = argmax(x, 1);
  }
  const MemoryStats after = memory_stats(d);
  return {after.peak_allocated_bytes - before.allocated_bytes, after.peak_reserved_bytes - before.reserved_bytes};
}

TEST(MetaDeviceCuda, SplitReductionScratchEqualsTheDevices) {
  if (!cuda_available()) GTEST_SKIP() << "needs a CUDA device (or the emulated one)";
  const Peaks dry = reductions(Device::meta(DeviceType::CUDA)), real = reductions(Device::cuda(0));
  // The outputs alone are 160000 + 4 + 12 + 2 + 24 bytes.
  EXPECT_GT(real.allocated, 160042) << "no partials were allocated: the test checks nothing";
  EXPECT_EQ(dry.allocated, real.allocated) << "peak allocated";
  EXPECT_EQ(dry.reserved, real.reserved) << "peak reserved";
}

TEST(MetaDeviceCuda, FusedBatchNormScratchEqualsTheDevices) {
  if (!cuda_available()) GTEST_SKIP() << "needs a CUDA device (or the emulated one)";
#ifdef MINIDL_WITH_CUDA
  // Planar (NCHW) and rows (NHWC), f32 and f16 (other vector widths), with and without the
  // residual, training (partial sums) and evaluation (none in the forward); then 3 blocks per
  // channel forced, as a GPU-sized tensor would get, on a shape that stays small for the emulated
  // device.
  for (int split : {0, 3}) {
    cuda::set_batch_norm_split(split);
    for (DType dt : {DType::f32, DType::f16}) {
      for (bool cl : {false, true}) {
        for (bool residual : {false, true}) {
          for (bool training : {true, false}) {
            if (split > 0 && !training) continue;   // evaluation's forward has no partial sums
            SCOPED_TRACE(std::string(dtype_name(dt)) + (cl ? " NHWC" : " NCHW") + (residual ? " +residual" : "") +
                         (training ? " train" : " eval") + " split " + std::to_string(split));
            const Shape s{4, 6, 4, 8};
            const Peaks dry = fused_bn(Device::meta(DeviceType::CUDA), s, dt, cl, residual, training);
            const Peaks real = fused_bn(Device::cuda(0), s, dt, cl, residual, training);
            EXPECT_GT(real.allocated, 0);
            EXPECT_EQ(dry.allocated, real.allocated) << "peak allocated";
            EXPECT_EQ(dry.reserved, real.reserved) << "peak reserved";
          }
        }
      }
    }
  }
  cuda::set_batch_norm_split(0);
#endif
}

// draw_library_workspaces: cuBLAS's workspace drawn up front (a run does it before its model), on
// the device and on its model alike. Once drawn, a GEMM allocates its output and nothing else, and
// drawing again draws nothing.
TEST(MetaDeviceCuda, LibraryWorkspacesAreDrawnUpFrontAsOnTheDevice) {
  if (!cuda_available()) GTEST_SKIP() << "needs a CUDA device (or the emulated one)";
  for (const Device d : {Device::meta(DeviceType::CUDA), Device::cuda(0)}) {
    SCOPED_TRACE(d.str());
    const Tensor a = randn({4, 8}, {DType::f32, d, false}), b = randn({8, 4}, {DType::f32, d, false});
    const int64_t before = memory_stats(d).allocated_bytes;
    draw_library_workspaces(d);
    const int64_t drawn = memory_stats(d).allocated_bytes;
    // The first draw in this process takes the workspace; a test run after another may find it held.
    EXPECT_TRUE(drawn == before || drawn - before == static_cast<int64_t>(meta::cuda_model::cublas_workspace_bytes()))
        << drawn - before << " bytes drawn";
    draw_library_workspaces(d);
    EXPECT_EQ(memory_stats(d).allocated_bytes, drawn) << "a second draw";
    reset_peak_stats(d);
    {
      const Tensor c = matmul(a, b);
      EXPECT_EQ(memory_stats(d).peak_allocated_bytes - drawn, static_cast<int64_t>(c.nbytes())) << "the GEMM";
    }
  }
}

// A process that has run once (its library workspaces drawn before its model) can choose another
// allocator mode for its next run, as minidl-sweep and the test binaries run one run after another:
// the workspaces, all the device holds, go back, the mode changes and they are drawn again in it. A
// device that holds a tensor still refuses, and keeps its workspace.
TEST(MetaDeviceCuda, TheAllocatorModeChangesWhenTheLibraryWorkspacesAreAllItHolds) {
  if (!cuda_available()) GTEST_SKIP() << "needs a CUDA device (or the emulated one)";
  const auto ws = static_cast<int64_t>(meta::cuda_model::cublas_workspace_bytes());
  for (const Device d : {Device::meta(DeviceType::CUDA), Device::cuda(0)}) {
    SCOPED_TRACE(d.str());
    draw_library_workspaces(d);
    ASSERT_EQ(memory_stats(d).allocated_bytes, ws) << "the device should hold cuBLAS's workspace alone";
    for (const bool on : {true, false, true, false}) {
      set_expandable_segments(d, on);
      EXPECT_EQ(allocator_for(d).expandable_segments(), on);
      EXPECT_EQ(memory_stats(d).allocated_bytes, ws) << "the workspace, drawn again in the new mode";
      const Tensor a = randn({4, 8}, {DType::f32, d, false}), b = randn({8, 4}, {DType::f32, d, false});
      const Tensor c = matmul(a, b);   // cuBLAS runs with the new workspace (its handle made again on a device)
      EXPECT_EQ(c.shape(), (Shape{4, 4}));
    }
    const Tensor t = empty({1024}, {.dtype = DType::f32, .device = d});
    const std::string e = minidl::testing::error_of([&] { set_expandable_segments(d, true); });
    EXPECT_NE(e.find("already holds 2 blocks"), std::string::npos) << e;
    EXPECT_FALSE(allocator_for(d).expandable_segments());
    EXPECT_EQ(memory_stats(d).allocated_bytes, ws + static_cast<int64_t>(t.nbytes())) << "the workspace stays";
  }
}

}  // namespace
}  // namespace minidl
