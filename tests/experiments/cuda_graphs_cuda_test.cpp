// minidl-train's loop with --cuda-graphs (train/graphed_step.h) against the same run
// without it: the small CNN on synthetic images, SGD (momentum, Nesterov), Adam and AdamW, learning
// rates that change (a step schedule, warmup + cosine) without a new capture, --max-grad-norm, an
// epoch whose last batch is partial, FP32 and AMP, and a run stopped inside an epoch and resumed
// (the captures that do not fit: cuda_graphs_fallback_cuda_test.cpp). On the emulated device
// (experiments_cuda_emu) a replay computes what the eager step computes, so the losses,
// accuracies, step counts, final weights and the saved optimizer and gradient-scaler state must be
// bit-identical.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "train/graphed_step.h"
#include "train/model.h"
#include "train/run.h"
#include "tests/experiments/graphed_runs.h"

namespace minidl::harness {
namespace {

// `steps`: the optimizer steps both runs take (-1: any, the same); `replays`, `captures`: the
// graphed run's micro-batches replayed and graphs captured (-1: any > 0).
void expect_same_training(const TrainConfig& c, int64_t steps, int replays, int captures) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = testing::temp_dir().string();
  const TrainingRun eager = train(c, false, dir), graphed = train(c, true, dir);
  EXPECT_EQ(eager.result.status, "ok");
  EXPECT_EQ(graphed.result.status, "ok");
  if (steps >= 0) {
    EXPECT_EQ(eager.result.steps, steps);
  }
  EXPECT_EQ(graphed.result.steps, eager.result.steps);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(graphed.graph_line, m, std::regex(R"((\d+) micro-batches replayed from (\d+) capture)")))
      << graphed.graph_line;
  if (replays >= 0) {
    EXPECT_EQ(std::stoi(m[1]), replays);
  }
  EXPECT_GT(std::stoi(m[1]), 0);
  if (captures >= 0) {
    EXPECT_EQ(std::stoi(m[2]), captures);
  }
  // Evaluation: one batch of validation images an epoch and one of test images, all full. The first
  // runs eagerly (it warms the evaluation's host code), every later one replays the one captured
  // forward: the later epochs' validation and the test, with the same losses (below).
  ASSERT_TRUE(std::regex_search(graphed.graph_line, m, std::regex(R"((\d+) evaluation batches replayed from (\d+) capture)")))
      << graphed.graph_line;
  EXPECT_EQ(std::stoi(m[1]), c.epochs);
  EXPECT_EQ(std::stoi(m[2]), 1);
  EXPECT_TRUE(eager.graph_line.empty());
  EXPECT_EQ(graphed.progress, eager.progress);
  ASSERT_EQ(graphed.epochs.size(), eager.epochs.size());
  for (size_t e = 0; e < eager.epochs.size(); ++e) {
    SCOPED_TRACE("epoch " + std::to_string(e + 1));
    EXPECT_EQ(graphed.epochs[e].train_loss, eager.epochs[e].train_loss);   // bit for bit
    EXPECT_EQ(graphed.epochs[e].train_acc, eager.epochs[e].train_acc);
    EXPECT_EQ(graphed.epochs[e].val_loss, eager.epochs[e].val_loss);
    EXPECT_EQ(graphed.epochs[e].steps, eager.epochs[e].steps);
    EXPECT_EQ(graphed.epochs[e].lr, eager.epochs[e].lr);
  }
  EXPECT_EQ(graphed.result.test_loss, eager.result.test_loss);
  const bool zero_sign = c.accumulation_steps == 1;
  expect_same_tensors(eager.weights, graphed.weights, "weights", zero_sign);
  // Every buffer, per-parameter step count and rate of the optimizer, and the scaler's state.
  expect_same_tensors(eager.optimizer, graphed.optimizer, "optimizer and scaler state", zero_sign);
}

// 10 steps, 5 an epoch: step 1 eager (the warm-up), 2 captured and replayed, 3 and 4 replayed (4 at
// a new rate: written to the device, no new capture), 5 the partial batch (eager: it warms its
// shape); 6 to 9 replayed, 10 the partial batch again, captured (its shape's host code ran at step
// 5) and replayed: 8 replays of 2 captures, one per batch shape.
TEST(ExperimentsCudaGraphs, Fp32TrainingWithReplaysIsBitIdenticalToEager) {
  expect_same_training(sgd_config(false), 10, 8, 2);
}

TEST(ExperimentsCudaGraphs, AmpTrainingWithReplaysIsBitIdenticalToEager) { expect_same_training(sgd_config(true), 10, 8, 2); }

// bf16 autocast replays without a scaler: nothing to unscale, no step to skip.
TEST(ExperimentsCudaGraphs, Bf16AmpTrainingWithReplaysIsBitIdenticalToEager) {
  TrainConfig c = sgd_config(true);
  c.amp_dtype = "bf16";
  expect_same_training(c, 10, 8, 2);
}

// A loss scale of 2^18 overflows twice: the first step (the scaler's host state, during the
// warm-up) and a later one, which the device skips inside a replay. That step must not count, as
// in the eager loop, or the schedule, the progress lines and the run's step count would shift.
TEST(ExperimentsCudaGraphs, AmpStepsTheDeviceSkipsAreNotCounted) { expect_same_training(sgd_config(true, 262144.0), 8, -1, -1); }

// Adam, warmup + cosine (every step a new rate) and clipping, 3 epochs of 5 steps: one capture a
// batch shape serves every rate, 13 replays (the first step and the first epoch's partial batch
// run eagerly).
TEST(ExperimentsCudaGraphs, AdamWithWarmupCosineAndClippingReplaysOneCaptureAShape) {
  expect_same_training(adam_config(false), 15, 13, 2);
}

// An epoch of one full batch and one partial batch (6 training images, batch 4), for 4 epochs: the
// two shapes alternate, and each is captured the first time it comes after its eager run (epoch 2),
// then both replay: 6 replays of 2 captures in 8 steps.
TEST(ExperimentsCudaGraphs, AnEpochOfOneFullAndOnePartialBatchReplaysBoth) {
  TrainConfig c = sgd_config(false);
  c.split = "3,2,2";
  c.epochs = 4;
  expect_same_training(c, 8, 6, 2);
}

// The same with AMP from a loss scale of 2^18: an overflow inside a replay is skipped on the
// device, where Adam's step counts then stay as they were (the saved per-parameter counts and the
// bias corrections of every later step match the eager run's).
TEST(ExperimentsCudaGraphs, AmpAdamStepsTheDeviceSkipsLeaveItsStepCounts) {
  expect_same_training(adam_config(true, 262144.0), 13, -1, 2);
}

TEST(ExperimentsCudaGraphs, AdamWAndNesterovSgdReplayBitIdentically) {
  TrainConfig adamw = adam_config(true);
  adamw.optimizer = "adamw";
  adamw.weight_decay = 1e-2;
  adamw.epochs = 2;
  expect_same_training(adamw, 10, 8, 2);
  TrainConfig nesterov = sgd_config(false);
  nesterov.nesterov = true;
  nesterov.max_grad_norm = 0.5;
  nesterov.warmup_steps = 4;
  expect_same_training(nesterov, 10, 8, 2);
}

// Accumulation over 2 micro-batches of 4: an epoch of 18 images is two windows of [4, 4] and a
// trailing window of the partial batch of 2 alone (another weight: eager). Epoch 1's first window
// runs eagerly (the warm-up, which also makes the kept gradients); its second captures both graphs
// (the micro-batch that adds its gradients, then the one that steps, on the first's pool); epoch
// 2's two windows replay: 6 micro-batches replayed from 2 captures, 6 steps as in the eager run.
TEST(ExperimentsCudaGraphs, AccumulationWindowsReplayTwoGraphsLikeTheEagerRun) {
  TrainConfig c = sgd_config(false);
  c.accumulation_steps = 2;
  c.schedule = "step:2:0.5";
  expect_same_training(c, 6, 6, 2);
}

// Adam with warmup + cosine, clipping and AMP from a loss scale of 2^18 over windows of 3
// micro-batches: 30 images an epoch, [4, 4, 4] twice then a trailing [4, 2] (eager). The overflows
// are found once a window, at its end, and a window skipped inside a replay counts no step, as in
// the eager loop. After the first eager window (the warm-up) every full window replays, the one
// after the trailing window's partial batch too (its shape stays warm).
TEST(ExperimentsCudaGraphs, AmpAdamAccumulationSkipsWholeWindowsOnTheDevice) {
  TrainConfig c = adam_config(true, 262144.0);
  c.split = "15,2,2";
  c.accumulation_steps = 3;
  expect_same_training(c, -1, -1, 2);
}

// A graphed Adam run stopped inside epoch 2 and resumed (graphed again: a new warm-up step, then a
// new capture) ends with the uninterrupted graphed run's weights and optimizer and scaler state,
// which are also the eager run's.
TEST(ExperimentsCudaGraphs, AGraphedRunStoppedInsideAnEpochResumesBitIdentically) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = testing::temp_dir().string();
  const TrainConfig c = adam_config(true);
  const TrainingRun eager = train(c, false, dir), full = train(c, true, dir);
  const TrainingRun first = train(c, true, dir, {.log = {}, .on_epoch = {}, .on_step = [](int64_t step) {
                                     if (step == 7) request_stop();   // after 2 of epoch 2's 5 steps
                                   }}, "first");
  clear_stop();
  ASSERT_EQ(first.result.status, "interrupted") << first.result.note;
  EXPECT_EQ(first.result.steps, 7);
  TrainConfig rest = c;
  rest.resume = dir + "/first.safetensors";
  const TrainingRun resumed = train(rest, true, dir, {}, "resumed");
  ASSERT_EQ(resumed.result.status, "ok") << resumed.result.note;
  EXPECT_EQ(resumed.result.first_epoch, 2);
  EXPECT_EQ(resumed.result.steps, full.result.steps);
  EXPECT_EQ(resumed.epochs.back().lr, full.epochs.back().lr) << "schedule position";
  expect_same_tensors(full.weights, resumed.weights, "weights, resumed");
  expect_same_tensors(full.optimizer, resumed.optimizer, "optimizer and scaler state, resumed");
  expect_same_tensors(eager.weights, full.weights, "weights, graphed against eager");
  EXPECT_GT(resumed.graph_line.size(), 0u);
}

// The fused losses skip their host check of the targets while capturing; GraphedStep checks every
// batch's labels on the host before it copies them in, so a bad label fails at once, before any
// capture or replay, and the step waits for a real eager step before it is replayable at all.
// The tiny config's model on the device with SGD (momentum 0.9), no scaler, and its GraphedStep.
struct GraphedRig {
  Device dev = Device::cuda(0);
  TrainConfig c;
  Model m;
  std::unique_ptr<optim::Optimizer> opt;
  optim::GradScaler scaler{{.enabled = false}};
  std::unique_ptr<optim::AccumulatingTrainer> trainer;
  std::unique_ptr<GraphedStep> graphed;
  GraphedRig(uint64_t seed, double lr) : c(testing::tiny_config()) {
    c.device = "cuda";
    c.momentum = 0.9;
    m = make_model(c, seed);
    m.module->to(dev);
    m.module->train();
    opt = make_optimizer(c, *m.module, lr);
    trainer = std::make_unique<optim::AccumulatingTrainer>(*opt);
    graphed = std::make_unique<GraphedStep>(m, *trainer, *opt, scaler, dev);
  }
};

TEST(ExperimentsCudaGraphs, LabelsAreCheckedOnTheHostBeforeAReplay) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  GraphedRig rig(3, 0.01);
  const Device dev = rig.dev;
  Model& m = rig.m;
  auto& opt = rig.opt;
  GraphedStep& graphed = *rig.graphed;
  const TensorOptions f32{DType::f32, dev, false};
  const Tensor x = randn(m.input_shape(4), f32);
  const Tensor good = full({4}, 1.0, f32).to(DType::i64);
  const optim::MicroBatch mb{.loss_weight = 1.0, .steps = true, .samples = 4};
  EXPECT_FALSE(graphed.replayable(x, mb, 4));   // no eager step yet
  EXPECT_TRUE(graphed.eager_step(m.loss(m.forward(x), good), mb, x));
  EXPECT_TRUE(graphed.replayable(x, mb, 4));
  EXPECT_FALSE(graphed.replayable(x.slice(0, 0, 2), mb, 4));   // a partial batch runs eagerly
  EXPECT_FALSE(graphed.replayable(randn(m.input_shape(8), f32), mb, 8));   // a new shape: eager first
  Tensor bad = good.to(Device::cpu()).clone();
  bad.data<int64_t>()[2] = 2;
  std::string what;
  try {
    graphed.step(x, bad.to(dev));
  } catch (const Error& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("label 2 of sample 2 is outside [0, 2)"), std::string::npos) << what;
  EXPECT_EQ(graphed.captures(), 0);
  EXPECT_EQ(opt->step_count(), 1);
  const GraphedStep::Output out = graphed.step(x, good).value();   // the good batch is captured and replayed
  EXPECT_TRUE(out.stepped);
  EXPECT_EQ(graphed.captures(), 1);
  EXPECT_EQ(opt->step_count(), 2);
  EXPECT_TRUE(std::isfinite(out.loss.item()));
}

// An evaluation batch replays only once the training graph exists (its pool) and an eager
// evaluation batch of its layout has run; it then gives the eager forward's loss and count to the
// bit, at the weights the training replays left, and a partial batch never replays.
TEST(ExperimentsCudaGraphs, EvaluationBatchesReplayACapturedForwardWithTheEagerResults) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  GraphedRig rig(5, 0.05);
  const Device dev = rig.dev;
  Model& m = rig.m;
  GraphedStep& graphed = *rig.graphed;
  const TensorOptions f32{DType::f32, dev, false};
  const Tensor x = randn(m.input_shape(4), f32), y = from_vector({0, 1, 1, 0}, {4}, {.dtype = DType::i64}).to(dev);
  const Tensor xv = randn(m.input_shape(4), f32), yv = from_vector({1, 1, 0, 0}, {4}, {.dtype = DType::i64}).to(dev);
  const optim::MicroBatch mb{.loss_weight = 1.0, .steps = true, .samples = 4};
  ASSERT_TRUE(graphed.eager_step(m.loss(m.forward(x), y), mb, x));
  const auto eager_eval = [&] {
    NoGradGuard no_grad;
    m.module->eval();
    const Tensor logits = m.forward(xv);
    const std::pair<double, int64_t> r{m.loss(logits, yv).item(), m.correct(logits, yv)};
    m.module->train();
    return r;
  };
  const auto replayed_eval = [&] {
    m.module->eval();
    const GraphedStep::EvalOutput o = graphed.eval_step(xv, yv).value();
    m.module->train();
    return std::pair<double, int64_t>{o.loss.item(), static_cast<int64_t>(o.correct.item())};
  };
  graphed.eval_warmed(xv);
  EXPECT_FALSE(graphed.eval_replayable(xv, yv)) << "no training graph (no pool) yet";
  for (int i = 0; i < 3; ++i) graphed.step(x, y);   // captured once, replayed three times
  EXPECT_TRUE(graphed.eval_replayable(xv, yv));
  EXPECT_FALSE(graphed.eval_replayable(xv.slice(0, 0, 2), yv.slice(0, 0, 2))) << "a partial batch runs eagerly";
  const auto want = eager_eval();
  EXPECT_EQ(replayed_eval(), want);
  EXPECT_EQ(graphed.eval_captures(), 1);
  graphed.step(x, y);   // the weights move: the next replay evaluates them, as an eager pass does
  const auto after = eager_eval();
  EXPECT_NE(after.first, want.first);
  EXPECT_EQ(replayed_eval(), after);
  EXPECT_EQ(graphed.eval_captures(), 1);
  EXPECT_EQ(graphed.eval_replays(), 2);
  EXPECT_EQ(graphed.captures(), 1) << "the evaluation graph shares the pool and leaves the training graph";
  graphed.eval_warmed(xv.slice(0, 0, 2));   // a pass's partial batch ran eagerly
  EXPECT_TRUE(graphed.eval_replayable(xv, yv)) << "the full batch's layout stays warm for the next pass";
  graphed.release();
  EXPECT_FALSE(graphed.eval_replayable(xv, yv));
}

// An eager micro-batch beside held graphs runs in their pool; work in it that keeps a tensor there
// drops them, since a replay would write over it. Here a step hook keeps a device tensor of every
// step. Steps 1 (the warm-up) and 5 (the first partial batch) run eagerly; at step 5 the graph of
// the full batch is held, so its tensor lands in the pool and the graph goes: the full batch is
// captured again at step 6, the partial one at step 10 (3 captures, the same 8 replays), and the
// first evaluation runs eagerly. No replay touches a kept tensor, and the run is the eager run.
TEST(ExperimentsCudaGraphs, EagerWorkThatKeepsATensorInTheGraphsPoolDropsThem) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = testing::temp_dir().string();
  const TrainConfig c = sgd_config(false);
  std::vector<std::pair<int64_t, Tensor>> kept;
  RunHooks hooks;
  hooks.on_step = [&](int64_t step) {
    kept.emplace_back(step, full({256}, static_cast<double>(step), {DType::f32, Device::cuda(0), false}));
  };
  const TrainingRun eager = train(c, false, dir), graphed = train(c, true, dir, hooks, "kept");
  ASSERT_EQ(graphed.result.status, "ok") << graphed.result.note;
  EXPECT_EQ(graphed.result.graph_replays, 8);
  std::smatch m;
  const std::regex counts(R"((\d+) micro-batches replayed from (\d+) capture)");
  ASSERT_TRUE(std::regex_search(graphed.graph_line, m, counts)) << graphed.graph_line;
  EXPECT_EQ(std::stoi(m[2]), 3);
  EXPECT_NE(graphed.graph_line.find("graphs dropped 1 time(s) for eager work that left tensors in their pool"),
            std::string::npos)
      << graphed.graph_line;
  ASSERT_EQ(kept.size(), 10u);
  for (const auto& [step, t] : kept) {
    EXPECT_EQ(min(t.to(Device::cpu())).item(), static_cast<double>(step)) << "step " << step << "'s tensor was written";
    EXPECT_EQ(max(t.to(Device::cpu())).item(), static_cast<double>(step)) << "step " << step << "'s tensor was written";
  }
  EXPECT_EQ(graphed.progress, eager.progress);
  ASSERT_EQ(graphed.epochs.size(), eager.epochs.size());
  for (size_t e = 0; e < eager.epochs.size(); ++e) EXPECT_EQ(graphed.epochs[e].val_loss, eager.epochs[e].val_loss);
  EXPECT_EQ(graphed.result.test_loss, eager.result.test_loss);
  expect_same_tensors(eager.weights, graphed.weights, "weights");
}

// The epoch's partial batch gets a graph of its own in the pool the full batch's graph made: eager
// the first time (it warms its shape), then captured and replayed, with the pool no larger (its
// peak is the smaller one) and the full batch's graph still replaying; the loss of a partial replay
// is the eager partial step's on a twin.
TEST(ExperimentsCudaGraphs, APartialBatchGetsItsOwnGraphInTheFullBatchsPool) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  GraphedRig rig(9, 0.05), twin(9, 0.05);
  const TensorOptions f32{DType::f32, rig.dev, false};
  const Tensor x = randn(rig.m.input_shape(4), f32), y = from_vector({0, 1, 1, 0}, {4}, {.dtype = DType::i64}).to(rig.dev);
  const Tensor xp = x.slice(0, 0, 2).contiguous(), yp = y.slice(0, 0, 2).contiguous();
  const optim::MicroBatch full{.loss_weight = 1.0, .steps = true, .samples = 4};
  const optim::MicroBatch part{.loss_weight = 1.0, .steps = true, .samples = 2};
  GraphedStep& g = *rig.graphed;
  for (GraphedRig* r : {&rig, &twin}) ASSERT_TRUE(r->graphed->eager_step(r->m.loss(r->m.forward(x), y), full, x));
  g.step(x, y);   // the full batch's capture and replay
  twin.graphed->step(x, y);
  const size_t pool = g.pool_bytes();
  ASSERT_GT(pool, 0u);
  EXPECT_FALSE(g.replayable(xp, part, 4)) << "a partial batch's first time is eager";
  for (GraphedRig* r : {&rig, &twin}) ASSERT_TRUE(r->graphed->eager_step(r->m.loss(r->m.forward(xp), yp), part, xp));
  ASSERT_TRUE(g.replayable(xp, part, 4));
  const GraphedStep::Output out = g.step(xp, yp, part).value();   // captured into the same pool, replayed
  EXPECT_EQ(g.captures(), 2);
  EXPECT_EQ(g.pool_bytes(), pool) << "the partial batch's graph fits in the full batch's pool";
  const double eager_loss = twin.m.loss(twin.m.forward(xp), yp).item();
  EXPECT_TRUE(twin.graphed->eager_step(twin.m.loss(twin.m.forward(xp), yp), part, xp));
  EXPECT_EQ(out.loss.item(), eager_loss);
  EXPECT_TRUE(g.replayable(x, full, 4)) << "the full batch's graph is kept";
  g.step(x, y);
  EXPECT_EQ(g.captures(), 2);
  EXPECT_EQ(g.replays(), 3);
}

}  // namespace
}  // namespace minidl::harness
