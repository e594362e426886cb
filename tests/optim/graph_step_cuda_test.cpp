// CUDA graphs for a whole training step: forward, backward, the gradient scaler, clipping and the
// fused optimizer (SGD variants, Adam, AdamW) captured once and replayed must give the eager steps'
// parameters and optimizer state bit for bit, in FP32 and AMP, with a learning rate that changes
// every step (written to the device before each replay: one capture), including a step the scaler
// skips on the device (a planted overflow: Adam's step counts do not advance) with no host sync
// inside the graph; a capture that needs a host sync fails naming the fix. On the emulated device
// (cuda-emu) the replay runs every check eager work gets. A ResNet whose convolutions carry its batch
// norms (cuDNN's fused graphs) replays the same way.
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "core/autocast.h"
#include "core/backend.h"
#include "core/generator.h"
#include "core/ops.h"
#include "nn/keras_cnn.h"
#include "nn/recompute.h"
#include "nn/resnet.h"
#include "optim/accumulation.h"
#include "optim/adam.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"

#ifdef MINIDL_WITH_CUDA
#include "kernels/cuda/runtime.h"
#endif
#ifdef MINIDL_CUDA_EMU
#include "cuda_emu/call_log.h"
#endif

namespace minidl::optim {
namespace {

const Device kGpu = Device::cuda(0);

class GraphStep : public ::testing::Test {
 protected:
  // Bit-for-bit against eager needs the same bits from every run of a step: on a GPU some of
  // cuDNN's backward algorithms add with atomics (the first H100 run's ResNet-18 FP32 parameters
  // differed), so these tests run the deterministic ones, as PyTorch's would.
  void SetUp() override {
    if (!minidl::cuda_available()) GTEST_SKIP() << "no CUDA device";
#ifdef MINIDL_WITH_CUDA
    cuda::set_cudnn_deterministic(true);
#endif
  }
  void TearDown() override {
#ifdef MINIDL_WITH_CUDA
    cuda::set_cudnn_deterministic(false);
#endif
  }
};

// The ResNets take small inputs (a 3x3 stem, no max-pool). ResNet10SmallChain: a ResNet of one
// basic block a stage (the emulated device runs it in half a ResNet-18's time), channels-last, the
// convolutions carrying the batch norms (conv_bn_chain), so that the step runs cuDNN's fused
// graphs. ResNet10SmallCheckpointed: the same ResNet with each stage recomputed in the backward
// (nn::Recomputer, "stages"), as minidl-train's --checkpoint stages runs it.
enum class Net { SmallCnn, ResNet18Small, ResNet10SmallChain, ResNet10SmallCheckpointed };
enum class Opt { Sgd, SgdNesterov, SgdDampening, Adam, AdamAmsgrad, AdamW };

// What the step runs besides the model: the optimizer, a rate that changes every step (set before
// each step, as minidl-train's schedule does) and clipping (through AccumulatingTrainer).
struct Recipe {
  Opt opt = Opt::Sgd;
  bool schedule = false;
  double max_grad_norm = 0.0;
};

std::unique_ptr<Optimizer> make_optimizer(Opt o, std::vector<Tensor> params) {
  switch (o) {
    case Opt::Sgd: return std::make_unique<SGD>(params, SgdOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-4});
    case Opt::SgdNesterov:
      return std::make_unique<SGD>(params, SgdOptions{.lr = 0.05, .momentum = 0.8, .weight_decay = 5e-4, .nesterov = true});
    case Opt::SgdDampening:
      return std::make_unique<SGD>(params, SgdOptions{.lr = 0.05, .momentum = 0.9, .dampening = 0.3, .maximize = true});
    case Opt::Adam: return std::make_unique<Adam>(params, AdamOptions{.lr = 1e-3, .weight_decay = 1e-4});
    case Opt::AdamAmsgrad: return std::make_unique<Adam>(params, AdamOptions{.lr = 1e-3, .amsgrad = true});
    case Opt::AdamW: return std::make_unique<AdamW>(params, AdamOptions{.lr = 1e-3, .weight_decay = 1e-2});
  }
  return nullptr;
}

// One training setup: the model, the recipe's optimizer (SGD with momentum and weight decay by
// default), and a scaler when AMP is on; `via_trainer` steps through AccumulatingTrainer
// (minidl-train's path) instead of calling the scaler and the optimizer directly.
struct Trainer {
  Trainer(Net net, bool amp, bool via_trainer = false, const Recipe& recipe = {})
      : net_(net), amp_(amp), recipe_(recipe), scaler(GradScalerOptions{.init_scale = 1024.0, .enabled = amp}) {
    Generator gen(7);
    if (net == Net::SmallCnn) model = std::make_shared<nn::KerasSmallCnn>(kImage, &gen);
    else if (net == Net::ResNet18Small) model = nn::resnet18(2, &gen, false, /*small_input=*/true);
    else model = std::make_shared<nn::ResNet>(
             nn::ResNetOptions{.layers = {1, 1, 1, 1}, .num_classes = 2, .small_input = true}, &gen);
    model->to(kGpu);
    if (net == Net::ResNet10SmallChain) {
      std::static_pointer_cast<nn::ResNet>(model)->set_conv_bn_chain(true);
      model->to_channels_last();
    }
    model->train();
    if (net == Net::ResNet10SmallCheckpointed)
      recomputer = std::make_unique<nn::Recomputer>(*std::static_pointer_cast<nn::ResNet>(model),
                                                    nn::RecomputeMode::parse("stages"));
    opt = make_optimizer(recipe.opt, model->parameters());
    base_lr_ = opt->lr(0);
    if (via_trainer || recipe.max_grad_norm > 0) {
      trainer = std::make_unique<AccumulatingTrainer>(
          *opt, AccumulationOptions{.max_grad_norm = recipe.max_grad_norm, .scaler = amp ? &scaler : nullptr});
    }
  }
  // The rate of step i (0-based): a warmup then a decay, a new value every step.
  void set_rate(int i) {
    if (recipe_.schedule) opt->set_lr(0, base_lr_ * (i < 3 ? (i + 1) / 3.0 : 1.0 / (1.0 + 0.25 * (i - 2))));
  }
  // The step the graph captures: nothing in it reads the device on the host.
  void step(const Tensor& x, const Tensor& y) {
    opt->zero_grad();
    Tensor loss;
    {
      AutocastGuard autocast(DType::f16, amp_);
      const Tensor logits = recomputer ? recomputer->forward(x)
                                       : model->forward(net_ == Net::ResNet10SmallChain ? to_channels_last(x) : x);
      loss = net_ == Net::SmallCnn ? binary_cross_entropy_with_logits(logits, y) : cross_entropy(logits, y);
    }
    if (trainer) {
      trainer->micro_batch(loss, MicroBatch{.loss_weight = 1.0, .steps = true, .samples = x.size(0)});
    } else if (amp_) {
      scaler.scale(loss).backward();
      scaler.step(*opt);
      scaler.update();
    } else {
      loss.backward();
      opt->step();
    }
  }
  static constexpr int64_t kImage = 8;
  Net net_;
  bool amp_;
  Recipe recipe_;
  double base_lr_;
  std::shared_ptr<nn::Module> model;
  std::unique_ptr<nn::Recomputer> recomputer;
  std::unique_ptr<Optimizer> opt;
  GradScaler scaler;
  std::unique_ptr<AccumulatingTrainer> trainer;
};

struct Batch {
  Tensor x, y;   // on the host
};

std::vector<Batch> batches(Net net, int n) {
  Generator gen(11);
  std::vector<Batch> v;
  const TensorOptions f32{DType::f32, Device::cpu(), false};
  for (int i = 0; i < n; ++i) {
    Batch b;
    b.x = randn({2, 3, Trainer::kImage, Trainer::kImage}, f32, &gen);
    b.y = net == Net::SmallCnn ? gt(rand({2, 1}, f32, &gen), full({1}, 0.5, f32)).to(DType::f32)
                               : gt(rand({2}, f32, &gen), full({1}, 0.5, f32)).to(DType::i64);
    v.push_back(b);
  }
  return v;
}

std::vector<uint8_t> bytes_of(const Tensor& t) {
  const Tensor h = t.detach().to(Device::cpu()).contiguous();
  std::vector<uint8_t> b(h.nbytes());
  std::memcpy(b.data(), h.data_ptr(), b.size());
  return b;
}

// Every parameter and buffer (running statistics, momentum is checked through later steps), bit for bit.
::testing::AssertionResult bit_identical(nn::Module& a, nn::Module& b) {
  const auto sa = a.state_dict(), sb = b.state_dict();
  for (const auto& [name, t] : sa) {
    if (bytes_of(t) != bytes_of(sb.at(name))) {
      return ::testing::AssertionFailure() << name << " differs between the eager and the replayed steps";
    }
  }
  return ::testing::AssertionSuccess();
}

constexpr int kWarmup = 2;   // eager steps before the capture: handles, workspaces, optimizer state

// The optimizers' state, bit for bit: every buffer, per-parameter step count and rate ("state.step",
// the host's count of step() calls, is the caller's to settle after replays: left out).
::testing::AssertionResult same_optimizer_state(const Optimizer& a, const Optimizer& b) {
  const auto sa = a.state_dict(), sb = b.state_dict();
  if (sa.size() != sb.size()) return ::testing::AssertionFailure() << sa.size() << " vs " << sb.size() << " keys";
  for (const auto& [key, t] : sa) {
    if (key == "state.step") continue;
    if (!sb.count(key) || bytes_of(t) != bytes_of(sb.at(key)))
      return ::testing::AssertionFailure() << "optimizer state '" << key << "' differs between eager and replayed steps";
  }
  return ::testing::AssertionSuccess();
}

// Runs `steps` steps eagerly and through a graph; `plant` (a step index, or -1) sets a scale that
// overflows before that step, in both runs. The graphed optimizer keeps its rates and step counts
// on the device (one capture, whatever the rate). Returns the graph's private pool bytes.
size_t compare(Net net, bool amp, int steps, int plant, bool via_trainer = false, const Recipe& recipe = {}) {
  const std::vector<Batch> data = batches(net, steps);
  Trainer eager(net, amp, via_trainer, recipe), graphed(net, amp, via_trainer, recipe);
  for (int i = 0; i < steps; ++i) {
    if (i == plant) eager.scaler.update(1e38);
    eager.set_rate(i);
    eager.step(data[i].x.to(kGpu), data[i].y.to(kGpu));
  }
  for (int i = 0; i < kWarmup; ++i) {
    graphed.set_rate(i);
    graphed.step(data[i].x.to(kGpu), data[i].y.to(kGpu));
  }
  // A capture before a real step makes fresh state that the skipped replays never fill: minidl-train
  // waits for one (GraphedStep); here the optimizers' state is compared only when there was one.
  const bool stepped_before_capture = graphed.opt->step_count() > 0;
  if (amp) graphed.scaler.to_device_state(kGpu);
  graphed.opt->to_device_state(kGpu);
  // The captured input buffers: each step's batch is copied into them before the replay.
  Tensor x = data[kWarmup].x.to(kGpu), y = data[kWarmup].y.to(kGpu);
  std::unique_ptr<Backend::Graph> graph = backend(kGpu).capture_graph(0, [&] { graphed.step(x, y); });
  std::vector<uint8_t> before_plant;
  int64_t param_step_before_plant = 0;
  for (int i = kWarmup; i < steps; ++i) {
    if (i == plant) {
      graphed.scaler.update(1e38);
      before_plant = bytes_of(graphed.model->parameters()[0]);
      param_step_before_plant = graphed.opt->state(0, 0).step;
    }
    x.copy_(data[i].x);
    y.copy_(data[i].y);
    graphed.set_rate(i);
    graphed.opt->upload_lrs();   // the step's rate, read by the replay
    graph->replay();
    if (i == plant) {
      EXPECT_EQ(bytes_of(graphed.model->parameters()[0]), before_plant) << "the overflowing step was not skipped";
      EXPECT_EQ(graphed.opt->state(0, 0).step, param_step_before_plant) << "a skipped step advanced the count";
    }
  }
  if (stepped_before_capture) {
    EXPECT_TRUE(same_optimizer_state(*eager.opt, *graphed.opt));
  }
  // The last step's norm, from the device: the host's, bit for bit (a skipped step's differs: the
  // host skips before clipping, the device clips inf gradients and discards the result).
  if (recipe.max_grad_norm > 0 && plant < 0) {
    EXPECT_GT(eager.trainer->last_grad_norm(), recipe.max_grad_norm) << "the max norm must really clip";
    EXPECT_EQ(graphed.trainer->last_grad_norm(), eager.trainer->last_grad_norm());
  }
  if (amp) {
    EXPECT_EQ(graphed.scaler.get_scale(), eager.scaler.get_scale());
    EXPECT_EQ(graphed.scaler.growth_tracker(), eager.scaler.growth_tracker());
    if (plant >= 0) {
      EXPECT_LT(eager.scaler.get_scale(), 1e38);   // it backed off
    }
  }
  EXPECT_TRUE(bit_identical(*eager.model, *graphed.model));
  const size_t pool = graph->pool_bytes();
  graph.reset();
  return pool;
}

TEST_F(GraphStep, SmallCnnFp32ReplayIsBitIdenticalToEager) { EXPECT_GT(compare(Net::SmallCnn, false, 5, -1), 0u); }

TEST_F(GraphStep, SmallCnnAmpWithASkippedStepIsBitIdenticalToEager) { compare(Net::SmallCnn, true, 6, 4); }

TEST_F(GraphStep, ThroughTheAccumulatingTrainerTooWithASkippedStep) { compare(Net::SmallCnn, true, 5, 3, true); }

// One graph serves every rate: the rate changes every step and is written to the device before
// each replay, and SGD's variants, Adam (with amsgrad) and AdamW read it there; Adam's bias
// corrections come from the step counts on the device.
TEST_F(GraphStep, EveryOptimizerReplaysOneCaptureAtARateThatChangesEveryStep) {
  for (Opt o : {Opt::Sgd, Opt::SgdNesterov, Opt::SgdDampening, Opt::Adam, Opt::AdamAmsgrad, Opt::AdamW}) {
    SCOPED_TRACE("optimizer " + std::to_string(static_cast<int>(o)));
    compare(Net::SmallCnn, false, 6, -1, false, Recipe{.opt = o, .schedule = true});
  }
}

// Clipping on the device (norm and factor, no host read) inside the captured step, with AMP: a
// replay the scaler skips (its gradients are inf, their norm too) leaves the weights and Adam's
// step counts as they were, and every other replay clips as the eager step does.
TEST_F(GraphStep, ClippedAdamAndAdamWWithASkippedStepAreBitIdenticalToEager) {
  compare(Net::SmallCnn, true, 6, 4, true, Recipe{.opt = Opt::Adam, .schedule = true, .max_grad_norm = 0.05});
  compare(Net::SmallCnn, false, 5, -1, true, Recipe{.opt = Opt::AdamW, .schedule = true, .max_grad_norm = 0.05});
  compare(Net::SmallCnn, true, 5, -1, true, Recipe{.opt = Opt::SgdNesterov, .max_grad_norm = 0.05});
}

// Few steps: an emulated ResNet step takes seconds (2 eager warm-up steps, then replays). With
// each stage checkpointed (the techniques study's recomputation rows, graphed by default on a GPU)
// the reruns inside the captured backward are captured with it: they read nothing on the host.
// The plain f32 and AMP ResNet-18s replay on a GPU only: the emulated device would take minutes
// more for kernels the checkpointed AMP step and the small CNN's f32 steps already replay.
TEST_F(GraphStep, SmallInputResNetsReplayBitIdenticallyToEager) {
  compare(Net::ResNet10SmallCheckpointed, true, 3, -1);
#ifndef MINIDL_CUDA_EMU
  compare(Net::ResNet18Small, false, 3, -1);
  compare(Net::ResNet18Small, true, 4, 3);
#endif
}

// The convolutions that carry batch norm (cuDNN's fused graphs, their plans cached per shape) in a
// captured AMP step: the replays run the fused graphs, a replay the scaler skips leaves the weights
// as they were, and every parameter and running statistic equals the eager chain's bit for bit.
TEST_F(GraphStep, AResNetWhoseConvolutionsCarryTheBatchNormsReplaysBitIdenticallyWithASkippedStep) {
  constexpr int kSteps = 4;
#ifdef MINIDL_CUDA_EMU
  cuda::emu::clear_call_log();
  cuda::emu::set_call_logging(true);
#endif
  compare(Net::ResNet10SmallChain, true, kSteps, 3);
#ifdef MINIDL_CUDA_EMU
  cuda::emu::set_call_logging(false);
  int64_t fused_forwards = 0;
  for (const cuda::emu::LibCall& c : cuda::emu::call_log()) fused_forwards += c.algo == "scale_bias_relu_conv_genstats";
  // 8 chained convolutions a step (two a block): the eager run's steps, the graphed run's warm-up
  // steps and its replays (the capture itself runs nothing).
  EXPECT_EQ(fused_forwards, 8 * 2 * kSteps);
#endif
}

TEST_F(GraphStep, AHostReadInsideTheCaptureFailsNamingTheFix) {
  Trainer t(Net::SmallCnn, false);
  const std::vector<Batch> data = batches(Net::SmallCnn, 1);
  const Tensor x = data[0].x.to(kGpu), y = data[0].y.to(kGpu);
  t.step(x, y);
  const int64_t allocated = memory_stats(kGpu).allocated_bytes;
  std::string what;
  try {
    backend(kGpu).capture_graph(0, [&] {
      const Tensor loss = binary_cross_entropy_with_logits(t.model->forward(x), y);
      (void)loss.item();   // planted: a host read of a device value
    });
  } catch (const Error& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("CUDA graph capture of the step failed"), std::string::npos) << what;
  EXPECT_NE(what.find("operation not permitted when stream is capturing"), std::string::npos) << what;
  EXPECT_NE(what.find(".item()"), std::string::npos) << what;   // the fix
  // The device works eagerly again and the failed capture left no memory behind.
  t.step(x, y);
  synchronize(kGpu);
  EXPECT_EQ(memory_stats(kGpu).allocated_bytes, allocated);
}

// The data loader's workers wait for their pinned buffers' last copies (cudaEventSynchronize) while
// the main thread captures a step. In CUDA's global capture mode another thread's potentially
// unsafe call is refused and invalidates the capture (likely the first GPU studies' 11 failed captures);
// a step is captured in thread-local mode, which refuses such calls on the capturing thread only.
TEST_F(GraphStep, ALoaderWorkerWaitingForItsCopyDuringTheCaptureLeavesItValid) {
  Trainer t(Net::SmallCnn, false);
  const std::vector<Batch> data = batches(Net::SmallCnn, 2);
  const Tensor x = data[0].x.to(kGpu), y = data[0].y.to(kGpu);
  t.step(x, y);
  Backend& be = backend(kGpu);
  const Tensor next = data[1].x.contiguous();
  const size_t bytes = static_cast<size_t>(next.numel()) * sizeof(float);
  void* pinned = be.pinned_alloc(bytes);
  ASSERT_NE(pinned, nullptr);
  std::memcpy(pinned, next.data_ptr(), bytes);
  Tensor dst = empty(next.shape(), {DType::f32, kGpu, false});
  std::unique_ptr<DeviceServices::CopyHandle> copy = be.copy_async({{pinned, dst}});
  std::string worker_error;
  std::unique_ptr<Backend::Graph> graph;
  try {
    graph = be.capture_graph(0, [&] {
      t.step(x, y);
      std::thread worker([&] {
        try {
          copy->host_wait();
        } catch (const Error& e) {
          worker_error = e.what();
        }
      });
      worker.join();
    });
  } catch (const Error& e) {
    ADD_FAILURE() << "the capture failed: " << e.what();
  }
  EXPECT_EQ(worker_error, "");
  ASSERT_NE(graph, nullptr);
  graph->replay();
  synchronize(kGpu);
  EXPECT_EQ(bytes_of(dst), bytes_of(next));   // the copy the worker waited for landed
  copy.reset();
  be.pinned_free(pinned);
}

TEST_F(GraphStep, EagerAllocationsAfterTheCaptureDoNotReuseItsPool) {
  Trainer t(Net::SmallCnn, false);
  const std::vector<Batch> data = batches(Net::SmallCnn, 3);
  Tensor x = data[0].x.to(kGpu), y = data[0].y.to(kGpu);
  t.step(x, y);
  empty_cache(kGpu);   // as the capture does first: what stays reserved holds live tensors
  const int64_t reserved_before = memory_stats(kGpu).reserved_bytes;
  auto graph = backend(kGpu).capture_graph(0, [&] { t.step(x, y); });
  ASSERT_GT(graph->pool_bytes(), 0u);
  // The pool: the segments it grew, and what it used of the free room beside the live eager tensors.
  const int64_t reserved_after = memory_stats(kGpu).reserved_bytes;
  EXPECT_GT(reserved_after, reserved_before);
  EXPECT_LE(reserved_after, reserved_before + static_cast<int64_t>(graph->pool_bytes()));
  // Eager tensors made now, of the sizes the captured step freed and more: none may land in the
  // pool, or the next replay would overwrite them.
  graph->replay();
  std::vector<Tensor> eager;
  for (int64_t k = 1; k <= 48; ++k) {
    eager.push_back(full({16 * k * k}, 7.0, {DType::f32, kGpu, false}));
    eager.push_back(full({2, 32, 8, 8}, 7.0, {DType::f32, kGpu, false}));
  }
  x.copy_(data[1].x);
  graph->replay();
  graph->replay();
  for (const Tensor& e : eager) {
    ASSERT_EQ(max(e.to(Device::cpu())).item(), 7.0) << "a replay wrote into an eager tensor: the pool was reused";
    ASSERT_EQ(min(e.to(Device::cpu())).item(), 7.0) << "a replay wrote into an eager tensor: the pool was reused";
  }
  graph.reset();
  synchronize(kGpu);
}

}  // namespace
}  // namespace minidl::optim
