// What a graphed run does when a capture does not fit (train/graphed_step.h): by default it
// falls back to eager steps for that batch shape, saying so once, and the run is the eager run bit
// for bit; with --cuda-graphs the capture's out-of-memory ends the run. A budget reaches the first
// capture of a pool. The captures that share a pool (an accumulation window's stepping graph, the
// evaluation forward) fit in its freed blocks, and no budget reaches them. A fault injected into
// the allocator (CachingAllocator::fail_in_capture) then stands for a device with nothing left.
#include <gtest/gtest.h>

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/backend.h"
#include "kernels/caching_allocator.h"
#include "kernels/cuda/runtime.h"
#include "tests/experiments/graphed_runs.h"
#include "tests/experiments/whole_run.h"

namespace minidl::harness {
namespace {

// `fell` is the eager run bit for bit: its steps, progress lines, every epoch's losses, accuracy and
// rate, the test loss, every saved weight and the optimizer's and scaler's saved state.
void expect_the_eager_run(const TrainingRun& eager, const TrainingRun& fell) {
  EXPECT_EQ(fell.result.steps, eager.result.steps);
  EXPECT_EQ(fell.progress, eager.progress);
  ASSERT_EQ(fell.epochs.size(), eager.epochs.size());
  for (size_t e = 0; e < eager.epochs.size(); ++e) {
    SCOPED_TRACE("epoch " + std::to_string(e + 1));
    EXPECT_EQ(fell.epochs[e].train_loss, eager.epochs[e].train_loss);
    EXPECT_EQ(fell.epochs[e].val_loss, eager.epochs[e].val_loss);
    EXPECT_EQ(fell.epochs[e].val_acc, eager.epochs[e].val_acc);
    EXPECT_EQ(fell.epochs[e].lr, eager.epochs[e].lr);
  }
  EXPECT_EQ(fell.result.test_loss, eager.result.test_loss);
  expect_same_tensors(eager.weights, fell.weights, "weights after the fallback");
  expect_same_tensors(eager.optimizer, fell.optimizer, "optimizer and scaler state after the fallback");
}

// Adam with AMP, warmup + cosine and clipping, over windows of 2 micro-batches, 2 epochs.
TrainConfig window_config() {
  TrainConfig c = adam_config(true);
  c.accumulation_steps = 2;
  c.epochs = 2;
  return c;
}

// By default (neither --cuda-graphs nor --no-cuda-graphs) a CUDA run replays graphs where they fit.
// Under a budget that the eager run fills to the byte, the graph's private pool (segments of its
// own, no memory released while a stream captures) cannot grow: the capture is abandoned, the run
// says so once per batch shape, and it is the eager run bit for bit. With --cuda-graphs the same
// capture is the run's out-of-memory end.
TEST(ExperimentsCudaGraphs, ACaptureThatDoesNotFitFallsBackToTheEagerRun) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = testing::temp_dir().string();
  TrainConfig c = sgd_config(true);
  const TrainingRun eager = train(c, false, dir);
  ASSERT_EQ(eager.result.status, "ok") << eager.result.note;
  {
    const TrainingRun fits = train(c, std::nullopt, dir, {}, "fits");   // no budget: graphs by default
    EXPECT_GT(fits.result.graph_replays, 0);
    EXPECT_EQ(fits.result.graph_fallbacks, 0);
    EXPECT_TRUE(fits.fallbacks.empty());
    expect_same_tensors(eager.weights, fits.weights, "weights, graphed by default");
  }
  c.memory_budget = std::to_string(eager.result.peak_reserved);
  const TrainingRun fell = train(c, std::nullopt, dir);
  ASSERT_EQ(fell.result.status, "ok") << fell.result.note;
  ASSERT_FALSE(fell.fallbacks.empty());
  // No graph is held when the full batch's capture runs out: the partial batch is not captured either.
  EXPECT_NE(fell.fallbacks[0].find("every batch runs eagerly from here: capturing the step of f32[4, 3, 16, 16] "
                                   "ran out of memory"),
            std::string::npos)
      << fell.fallbacks[0];
  EXPECT_NE(fell.fallbacks[0].find("--no-cuda-graphs"), std::string::npos) << "it names the switches";
  EXPECT_EQ(fell.result.graph_fallbacks, static_cast<int64_t>(fell.fallbacks.size()));
  EXPECT_EQ(fell.result.graph_replays, 0);
  expect_the_eager_run(eager, fell);
  c.save_weights = dir + "/required.safetensors";
  c.cuda_graphs = true;
  EXPECT_EQ(run_training(c).status, "oom") << "--cuda-graphs requires the graph";
}

// The same with Adam (warmup + cosine, clipping) over windows of 2 micro-batches: the capture that
// falls back ran the window's host code (the trainer's window, the rates, the step counts), which
// goes back, so the eager window that follows is the eager run's.
TEST(ExperimentsCudaGraphs, AnAccumulationWindowWhoseCaptureDoesNotFitRunsEagerly) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = testing::temp_dir().string();
  TrainConfig c = window_config();
  const TrainingRun eager = train(c, false, dir);
  ASSERT_EQ(eager.result.status, "ok") << eager.result.note;
  c.memory_budget = std::to_string(eager.result.peak_reserved);
  const TrainingRun fell = train(c, std::nullopt, dir);
  ASSERT_EQ(fell.result.status, "ok") << fell.result.note;
  EXPECT_GT(fell.result.graph_fallbacks, 0);
  expect_the_eager_run(eager, fell);
}

// Eager work beside held graphs that does not fit even in their pool drops them and goes on
// eagerly (the allocator's out-of-memory handler, GraphedStep::make_room), saying so once, instead
// of running out of memory beside memory that only the graphs held: the run replays until then and
// is the eager run bit for bit. Under this budget the full batch's capture fits, and an eager run
// fits with room to spare (its largest batch is 64). At batch 53 the work that does not fit comes
// at the first epoch's end (the partial batch or the validation pass); at 59 the run replays to its
// end and --save-weights' copies do not fit, counted in the run's summary all the same. With
// --cuda-graphs, which never drops the graphs, the run at 53 ends out of memory.
TEST(ExperimentsCudaGraphs, EagerWorkThatDoesNotFitBesideTheGraphsDropsThem) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = testing::temp_dir().string();
  TrainConfig c = testing::small_cnn(32, "120,4,4", "44MiB");
  c.device = "cuda";
  c.cudnn_benchmark = "off";
  c.momentum = 0.9;
  c.epochs = 2;
  // 53: 4 full batches and a partial one of 28 an epoch; 59: 4 and 4.
  for (const auto& [batch, layouts] : {std::pair<int64_t, const char*>{53, "f32[53, 3, 32, 32]"},
                                       std::pair<int64_t, const char*>{59, "f32[59, 3, 32, 32], f32[4, 3, 32, 32]"}}) {
    SCOPED_TRACE("batch " + std::to_string(batch));
    c.batch_size = batch;
    const TrainingRun eager = train(c, false, dir);
    ASSERT_EQ(eager.result.status, "ok") << eager.result.note;
    const TrainingRun fell = train(c, std::nullopt, dir);
    ASSERT_EQ(fell.result.status, "ok") << fell.result.note;
    EXPECT_GT(fell.result.graph_replays, 0) << "the graphs replayed until the eager work beside them";
    ASSERT_EQ(fell.fallbacks.size(), 1u);
    EXPECT_NE(fell.fallbacks[0].find("every batch runs eagerly from here: "), std::string::npos) << fell.fallbacks[0];
    EXPECT_NE(fell.fallbacks[0].find(std::string("did not fit beside the graphs of ") + layouts +
                                     ", which were dropped to make room"),
              std::string::npos)
        << fell.fallbacks[0];
    EXPECT_NE(fell.graph_line.find("graphs dropped to make room for eager work"), std::string::npos)
        << fell.graph_line;
    EXPECT_GT(fell.result.graph_fallbacks, 0);
    expect_the_eager_run(eager, fell);
  }
  c.batch_size = 53;
  c.save_weights = dir + "/required.safetensors";
  c.cuda_graphs = true;
  EXPECT_EQ(run_training(c).status, "oom") << "--cuda-graphs keeps the graphs: the eager work runs out beside them";
}

CachingAllocator& cuda_allocator() { return dynamic_cast<CachingAllocator&>(allocator_for(Device::cuda(0))); }

// The runs of `c` (graphs by default) whose capture number `captures_before` (from 0) runs out of
// memory from its first request, from midway, and at its last: a first run, whose fault never
// fires, counts that capture's requests.
std::vector<TrainingRun> runs_out_in_capture(const TrainConfig& c, int captures_before, const std::string& dir) {
  CachingAllocator& a = cuda_allocator();
  a.fail_in_capture(captures_before, int64_t{1} << 40);
  const TrainingRun counted = train(c, std::nullopt, dir, {}, "counted");
  EXPECT_TRUE(counted.fallbacks.empty());
  const int64_t requests = a.capture_fault_requests();
  EXPECT_GT(requests, 2) << "capture " << captures_before << " of the run allocates";
  std::vector<TrainingRun> runs;
  for (const int64_t request : {int64_t{0}, requests / 2, requests - 1}) {
    a.fail_in_capture(captures_before, request);
    runs.push_back(train(c, std::nullopt, dir, {}, "fell" + std::to_string(request)));
    EXPECT_FALSE(a.capture_fault_armed()) << "request " << request;
    EXPECT_EQ(a.capture_fault_requests(), request) << "it fired at request " << request << " of " << requests;
  }
  return runs;
}

// The run's captures: the full batch's step (epoch 1, step 2), the partial batch's (step 10), then
// epoch 2's validation forward, on the training graphs' pool. That one runs out: the evaluations run
// eagerly from there, with the eager losses, while the training graphs keep replaying.
TEST(ExperimentsCudaGraphs, AnEvaluationCaptureThatRunsOutOfMemoryEvaluatesEagerly) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = testing::temp_dir().string();
  const TrainConfig c = sgd_config(true);
  const TrainingRun eager = train(c, false, dir);
  ASSERT_EQ(eager.result.status, "ok") << eager.result.note;
  for (const TrainingRun& fell : runs_out_in_capture(c, 2, dir)) {
    ASSERT_EQ(fell.result.status, "ok") << fell.result.note;
    ASSERT_EQ(fell.fallbacks.size(), 1u);
    EXPECT_NE(fell.fallbacks[0].find("evaluation batches of f32[4, 3, 16, 16] run eagerly from here"),
              std::string::npos) << fell.fallbacks[0];
    EXPECT_EQ(fell.result.graph_fallbacks, 1);
    EXPECT_EQ(fell.result.graph_replays, 8) << "the training graphs replay on";
    EXPECT_NE(fell.graph_line.find("0 evaluation batches replayed"), std::string::npos) << fell.graph_line;
    expect_the_eager_run(eager, fell);
  }
}

// Adam over windows of 2 micro-batches: epoch 1's second window captures the adding micro-batch's
// graph and replays it, then captures the stepping one into the same pool, which runs out (in its
// forward, its backward, or its optimizer step, whose host code has run by then). The window's host
// state goes back to where the replay left it, the stepping micro-batch runs eagerly on the
// gradients the replay added to, and the shape runs eagerly from there: the run is the eager run.
TEST(ExperimentsCudaGraphs, AWindowsSteppingCaptureThatRunsOutAfterItsAddingGraphReplayedEndsEagerly) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = testing::temp_dir().string();
  const TrainConfig c = window_config();
  const TrainingRun eager = train(c, false, dir);
  ASSERT_EQ(eager.result.status, "ok") << eager.result.note;
  for (const TrainingRun& fell : runs_out_in_capture(c, 1, dir)) {
    ASSERT_EQ(fell.result.status, "ok") << fell.result.note;
    ASSERT_EQ(fell.fallbacks.size(), 1u);
    EXPECT_NE(fell.fallbacks[0].find("every batch runs eagerly from here: capturing the step of f32[4, 3, 16, 16]"),
              std::string::npos)
        << fell.fallbacks[0];
    EXPECT_EQ(fell.result.graph_replays, 1) << "the adding micro-batch's graph, once";
    expect_the_eager_run(eager, fell);
  }
}

// A capture that fails for another reason than memory falls back the same way (issue 51: what
// cannot be captured runs eagerly, saying why). Here the convolutions' plans are cleared after the
// warm-up step, so the step's capture stops at its first convolution; the run says so once and is
// the eager run whose plans are cleared at the same step.
TEST(ExperimentsCudaGraphs, ACaptureThatFailsOtherwiseFallsBackToTheEagerRun) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::string dir = testing::temp_dir().string();
  TrainConfig c = sgd_config(true);
  RunHooks clear_plans;
  clear_plans.on_step = [](int64_t step) {
    if (step == 1) cuda::clear_conv_algo_cache();
  };
  const TrainingRun eager = train(c, false, dir, clear_plans);
  ASSERT_EQ(eager.result.status, "ok") << eager.result.note;
  const TrainingRun fell = train(c, std::nullopt, dir, clear_plans, "fell");
  ASSERT_EQ(fell.result.status, "ok") << fell.result.note;
  ASSERT_EQ(fell.fallbacks.size(), 1u);
  EXPECT_NE(fell.fallbacks[0].find("batches of f32[4, 3, 16, 16] run eagerly from here: capturing their step "
                                   "failed ("),
            std::string::npos)
      << fell.fallbacks[0];
  EXPECT_NE(fell.fallbacks[0].find("has no cuDNN plan yet"), std::string::npos) << fell.fallbacks[0];
  EXPECT_EQ(fell.result.graph_fallbacks, 1);
  expect_the_eager_run(eager, fell);
  c.save_weights = dir + "/required.safetensors";
  c.cuda_graphs = true;
  std::string what;   // --cuda-graphs requires the graph: the capture's error ends the run
  try {
    run_training(c, clear_plans);
  } catch (const Error& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("CUDA graph capture of the step failed"), std::string::npos) << what;
}

}  // namespace
}  // namespace minidl::harness
