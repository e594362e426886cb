// minidl-maxbatch's answer holds for the whole run on a GPU (tests/experiments/whole_run.h): the
// run at the answer trains and the run at the answer + 1 runs out of the budget, on the caching
// allocator, with the dry run on meta:cuda. On the emulated device (experiments_cuda_emu) the
// backend's own allocator, kernels and loader staging run, so the answers are checked in CI.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "core/backend.h"
#include "experiments/harness/step_runner.h"
#include "train/run_footprint.h"
#include "tests/experiments/helpers.h"
#include "tests/experiments/whole_run.h"

namespace minidl::harness {
namespace {

TrainConfig small_cnn_on_gpu(const std::string& budget) {
  TrainConfig c = testing::small_cnn(32, "64,4,4", budget);
  c.device = "cuda";
  // The heuristic's algorithms, which the dry run asks cuDNN for. Autotuning picks by timing, under
  // the memory free when a shape is first seen, which no dry run can know in advance.
  c.cudnn_benchmark = "off";
  return c;
}

// The small CNN with momentum on 120 training images a class, whose budgets below put the graphs'
// captures and the eager work beside them at odds; the trials make two steps.
TrainConfig momentum_cnn_on_gpu(const std::string& budget) {
  TrainConfig c = small_cnn_on_gpu(budget);
  c.momentum = 0.9;
  c.split = "120,4,4";
  return c;
}

MaxBatchOptions two_steps() {
  MaxBatchOptions o;
  o.steps = 2;
  return o;
}

TEST(WholeRunCuda, SyntheticData) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const TrainConfig c = small_cnn_on_gpu("24MiB");
  // The synthetic set stays in host memory: on a GPU the run holds one batch of it at a time.
  EXPECT_EQ(run_footprint(c, Device::cuda(0), 32).resident_bytes, 0);
  testing::expect_answer_trains(c);
}

TEST(WholeRunCuda, SyntheticDataWithAmp) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  TrainConfig c = small_cnn_on_gpu("24MiB");
  c.amp = true;
  testing::expect_answer_trains(c);
}

// Expandable segments: the device's pages mapped into one range (the emulated driver's virtual memory
// calls), the dry run's pages on meta:cuda; the answer trains, the answer + 1 does not.
TEST(WholeRunCuda, SyntheticDataWithExpandableSegments) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  TrainConfig c = small_cnn_on_gpu("32MiB");
  c.expandable_segments = true;
  testing::expect_answer_trains(c);
}

// bf16 autocast: no gradient scaler, its activations and casts in bf16; the dry run on meta:cuda
// knows the bf16 kernels' temporaries, so the answer still trains and the answer + 1 does not.
TEST(WholeRunCuda, SyntheticDataWithBf16Amp) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  TrainConfig c = small_cnn_on_gpu("24MiB");
  c.amp = true;
  c.amp_dtype = "bf16";
  testing::expect_answer_trains(c);
}

// Photos through the loader's pinned staging: without workers one batch is on the device at a time.
TEST(WholeRunCuda, PhotoFolder) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::filesystem::path photos = std::filesystem::path(MINIDL_SHARED_DATA_DIR) / "catsdogs";
  if (!std::filesystem::exists(photos)) GTEST_SKIP() << "no photos at " << photos << " (../shared/data)";
  TrainConfig c = small_cnn_on_gpu("24MiB");
  c.data = photos.string();
  c.split = "48,4,4";
  testing::expect_answer_trains(c);
}

// --checkpoint optimal on the caching allocator: the trials and the run solve the same plan at
// each batch (modelled link times, the run's limit), so the dry run's answer is the real trial's.
// A smaller batch runs another plan, which keeps more: what fits is not monotonic in the batch
// (dry trials of two steps at 8-40 under this budget, with 132 training images, fit 8-11 and
// 18-21), so the dry run looks above its first answer (FinderOptions::look_above), and the
// recommended batch is tried with its own plan. The run at the answer trains and the one at the
// answer + 1 runs out. Trials of one step answered 23 here, where a run's second step ran out.
// Before the run drew cuBLAS's workspace and the batch norms' constant with its model (as the
// trials do), its first step's profile and rehearsal saw other room than the trials' and ran out
// where they fitted; and before the allocator broke ties between equal free blocks by segment
// age, where the emulated device's host memory put a segment decided, from one run to the next.
TEST(WholeRunCuda, SyntheticDataWithOptimalRecomputation) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  TrainConfig c = small_cnn_on_gpu("115MiB");
  c.split = "66,4,4";   // 132 images
  c.model = "resnet18-small";
  c.image_size = 16;
  c.checkpoint = "optimal";
  c.cuda_graphs = false;   // no capture: the trials' steps are the eager steps of the run
  MaxBatchOptions o;
  o.steps = 2;
  const MaxBatchReport rep = run_maxbatch(c, o, false);
  const int64_t answer = rep.finder.max_batch;
  ASSERT_GT(answer, 1) << rep.text;
  EXPECT_TRUE(rep.finder.confirmed) << rep.text;
  EXPECT_EQ(rep.finder.dry_max_batch, answer) << rep.text;
  EXPECT_GT(rep.finder.below_gap, 0) << rep.text;
  EXPECT_NE(rep.text.find("tried with its own recomputation plan"), std::string::npos) << rep.text;
  EXPECT_GT(rep.recommended, 0) << rep.text;
  // Two steps and the evaluation: the first steps are where the run differed.
  const RunResult fits = testing::train_at(c, answer);
  EXPECT_EQ(fits.status, "ok") << fits.note << "\n" << rep.text;
  EXPECT_EQ(testing::train_at(c, answer + 1).status, "oom") << rep.text;
}

// Photos through the loader's workers and pinned staging, with graphs where they fit (the default):
// the run holds the batch it trains on and the next one, whose tensors are made as the current one
// is handed out whether or not the workers have it ready (data::DeviceStaging::next), so the run's
// requests come in the same order every time. The trials make the same requests as the run's
// epochs: the smaller last batch, run eagerly in the first epoch and captured in the second, and the
// evaluation passes with theirs. Under this budget what fits is not monotonic in the batch (the
// graphs' captures fit at some batches and not at their neighbours'), so the recommended batch is
// tried itself: the answer and the recommended batch train their whole runs, and the answer + 1
// runs out. (Before the staging made its requests in a fixed order and the trials made the run's
// epochs, the runs at the answer and at the recommended batch here ran out of memory.)
TEST(WholeRunCuda, PhotoFolderWithWorkersAndGraphs) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const std::filesystem::path photos = std::filesystem::path(MINIDL_SHARED_DATA_DIR) / "catsdogs";
  if (!std::filesystem::exists(photos)) GTEST_SKIP() << "no photos at " << photos << " (../shared/data)";
  TrainConfig c = small_cnn_on_gpu("64MiB");
  c.image_size = 64;
  c.data = photos.string();
  c.split = "48,24,24";
  c.workers = 2;
  EXPECT_EQ(run_footprint(c, Device::cuda(0), 64).batches_held, 2);
  MaxBatchOptions o;
  o.steps = 3;
  const MaxBatchReport rep = run_maxbatch(c, o, false);
  const int64_t answer = rep.finder.max_batch;
  ASSERT_GT(answer, 1) << rep.text;
  for (const int64_t b : {answer, rep.recommended}) {
    const RunResult r = testing::train_whole(c, b, 2);
    EXPECT_EQ(r.status, "ok") << "batch " << b << ": " << r.note << "\n" << rep.text;
  }
  EXPECT_EQ(testing::train_whole(c, answer + 1, 2).status, "oom") << rep.text;
}

// Graphs where they fit, at batches whose capture fits while the eager work beside the held graphs
// (an evaluation batch, the epoch's partial batch, the next batch's inputs) does not: that work
// drops the graphs and goes on eagerly, in the trials as in the run (GraphedStep::make_room), so
// the answer is the eager run's and the run there trains. (Before, the trials failed from 35 on
// under this budget and the default answered 34 where an eager run trains 64.)
TEST(WholeRunCuda, EagerWorkBesideTheGraphsKeepsTheEagerAnswer) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const TrainConfig c = momentum_cnn_on_gpu("44MiB");
  const MaxBatchOptions o = two_steps();
  TrainConfig eager = c;
  eager.cuda_graphs = false;
  const int64_t eager_answer = run_maxbatch(eager, o, false).finder.max_batch;
  const MaxBatchReport rep = run_maxbatch(c, o, false);
  EXPECT_EQ(rep.finder.max_batch, eager_answer) << rep.text;
  const RunResult fits = testing::train_whole(c, rep.finder.max_batch, 2);
  EXPECT_EQ(fits.status, "ok") << fits.note << "\n" << rep.text;
  EXPECT_GT(fits.graph_replays, 0) << "it replayed until the eager work beside the graphs";
  EXPECT_EQ(testing::train_whole(c, rep.finder.max_batch + 1, 2).status, "oom") << rep.text;
  // A trial at a batch whose run drops its graphs (ExperimentsCudaGraphs.EagerWorkThatDoesNotFit-
  // BesideTheGraphsDropsThem) drops them too, in the dry run as in the real trial, to the byte.
  for (const Device d : {Device::meta(DeviceType::CUDA), Device::cuda(0)}) empty_cache(d);
  Trial dry, real;
  {
    StepRunner r(c, int64_t{44} << 20, Device::meta(DeviceType::CUDA));
    dry = r.run(53, 2);
  }
  {
    StepRunner r(c, int64_t{44} << 20, Device::cuda(0));
    real = r.run(53, 2);
  }
  ASSERT_TRUE(dry.ok && real.ok);
  EXPECT_TRUE(dry.graphs_dropped && real.graphs_dropped);
  EXPECT_FALSE(dry.graphed || real.graphed);
  EXPECT_EQ(dry.peak_allocated, real.peak_allocated);
  EXPECT_EQ(dry.peak_reserved, real.peak_reserved);
}

// A run that runs out of memory in an evaluation pass ends as one that runs out in a step: status
// "oom", the note naming the pass, its epochs kept and its weights saved (an OutOfMemoryError escaped
// run_training before, and minidl-train then wrote no results). Under this budget, with graphs where they fit, the run
// at the answer + 1 trains its first epoch and runs out in the validation pass after it, even once
// the graphs beside it are dropped.
TEST(WholeRunCuda, ARunOutOfMemoryInItsEvaluationEndsWithStatusOom) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  const TrainConfig c = momentum_cnn_on_gpu("36MiB");
  const MaxBatchOptions o = two_steps();
  const MaxBatchReport rep = run_maxbatch(c, o, false);
  const int64_t answer = rep.finder.max_batch;
  ASSERT_GT(answer, 1) << rep.text;
  const RunResult fits = testing::train_whole(c, answer, 2);
  EXPECT_EQ(fits.status, "ok") << fits.note << "\n" << rep.text;
  TrainConfig saving = c;
  saving.save_weights = (testing::temp_dir() / "weights.safetensors").string();
  const RunResult over = testing::train_whole(saving, answer + 1, 2);
  EXPECT_EQ(over.status, "oom") << rep.text;
  EXPECT_NE(over.note.find("out of memory in the validation pass after epoch 1"), std::string::npos) << over.note;
  ASSERT_EQ(over.epochs.size(), 1u) << over.note;
  EXPECT_GT(over.epochs[0].images, 0);
  EXPECT_TRUE(std::isnan(over.epochs[0].val_acc));
  EXPECT_TRUE(std::filesystem::exists(saving.save_weights)) << "the weights of the whole epoch are saved";
  std::filesystem::remove_all(std::filesystem::path(saving.save_weights).parent_path());
}

// A plan for a GPU (--gpu, the dry run alone) holds on the GPU: the same answer, trained.
TEST(WholeRunCuda, APlanForTheGpuTrains) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  TrainConfig c = small_cnn_on_gpu("24MiB");
  c.gpu = "4GiB";
  testing::expect_answer_trains(c);
}

// --cuda-graphs: a trial runs its steps as the run does (an eager step at the batch, then the
// capture and a replay), so the captured graph's private pool is in the answer, and the dry run,
// which captures on the model of the GPU, has the real trial's peaks to the byte.
void expect_graph_pool_in_the_answer(int64_t accumulation) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  // The graph's private pool reserves segments of its own (2 MiB small, 20 MiB large), as on a GPU.
  TrainConfig c = small_cnn_on_gpu("64MiB");
  c.cuda_graphs = true;
  c.momentum = 0.9;
  c.accumulation_steps = accumulation;
  // Two windows of full micro-batches beyond the answer (about 90 without accumulation, 110 with),
  // the second one captured.
  c.split = std::to_string(130 * accumulation) + ",4,4";
  for (const Device d : {Device::meta(DeviceType::CUDA), Device::cuda(0)}) empty_cache(d);
  Trial dry, real;
  {
    StepRunner r(c, 0, Device::meta(DeviceType::CUDA));
    dry = r.run(8, 2);
  }
  {
    StepRunner r(c, 0, Device::cuda(0));
    real = r.run(8, 2);
  }
  Trial eager;
  {
    TrainConfig e = c;
    e.cuda_graphs = false;
    StepRunner r(e, 0, Device::meta(DeviceType::CUDA));
    eager = r.run(8, 2);
  }
  ASSERT_TRUE(dry.ok && real.ok && eager.ok);
  EXPECT_EQ(dry.peak_allocated, real.peak_allocated);
  EXPECT_EQ(dry.peak_reserved, real.peak_reserved);
  EXPECT_GE(dry.peak_reserved, eager.peak_reserved) << "the graph's private pool is reserved";
  EXPECT_TRUE(real.recovered) << "the trial's graph, pool and captured tensors go with the trial";
  // With accumulation a trial that runs out inside a window must close it: the answer was 4 low
  // while the kept gradients outlived the trial at the first batch that did not fit.
  testing::expect_answer_trains(c);
}

// A trial that runs out of memory inside an accumulation window leaves nothing behind: the next
// trial's peaks are a fresh runner's. The window stayed open, and with it the gradients that CUDA
// graphs keep between windows, which every later trial then held beside its own steps.
TEST(WholeRunCuda, ATrialThatRunsOutInsideAWindowLeavesNothingBehind) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  TrainConfig c = momentum_cnn_on_gpu("64MiB");
  c.cuda_graphs = true;
  c.accumulation_steps = 2;
  const int64_t budget = int64_t{64} << 20;
  const Device meta = Device::meta(DeviceType::CUDA);
  Trial fresh;
  {
    StepRunner r(c, budget, meta);
    fresh = r.run(100, 2);
  }
  StepRunner r(c, budget, meta);
  const Trial over = r.run(130, 2);
  EXPECT_FALSE(over.ok);
  EXPECT_TRUE(over.recovered);
  const Trial after = r.run(100, 2);
  ASSERT_TRUE(fresh.ok && after.ok);
  EXPECT_EQ(after.peak_allocated, fresh.peak_allocated);
  EXPECT_EQ(after.peak_reserved, fresh.peak_reserved);
}

TEST(WholeRunCuda, CudaGraphsPoolIsInTheAnswer) { expect_graph_pool_in_the_answer(1); }

// Accumulation: the trial's two micro-batches are the two graphs of a window on one shared pool,
// with the gradients kept between windows; the dry run still has the real trial's peaks.
TEST(WholeRunCuda, CudaGraphsOfAnAccumulationWindowAreInTheAnswer) { expect_graph_pool_in_the_answer(2); }

// An epoch of fewer full micro-batches than a window has no window to replay: its one step is a
// trailing window of its own weights, run eagerly. Its trials make no full windows either, so the
// answer with --cuda-graphs is the eager one and the run there trains, eagerly, where trials that
// captured windows no epoch makes answered lower (the combined techniques row: 1,200 images at 661
// with 4 micro-batches a window).
TEST(WholeRunCuda, AnEpochWithoutAFullWindowHasNoGraphInItsAnswer) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  TrainConfig c = momentum_cnn_on_gpu("64MiB");   // 240 training images: two micro-batches near the answer
  c.accumulation_steps = 4;
  TrainConfig required = c, eager = c;
  required.cuda_graphs = true;
  eager.cuda_graphs = false;
  const MaxBatchReport rep = run_maxbatch(required, two_steps(), false);
  const int64_t answer = rep.finder.max_batch;
  ASSERT_LT(run_footprint(c, Device::cuda(0), 32).training_full(answer), 4) << rep.text;
  EXPECT_EQ(answer, run_maxbatch(eager, two_steps(), false).finder.max_batch) << rep.text;
  EXPECT_FALSE(rep.finder.at_max.graphed) << rep.text;
  EXPECT_TRUE(rep.finder.at_max.windowless) << rep.text;
  EXPECT_NE(rep.text.find("holds fewer micro-batches than a window"), std::string::npos) << rep.text;
  const RunResult at = testing::train_whole(required, answer, 2);
  EXPECT_EQ(at.status, "ok") << at.note;
  EXPECT_EQ(at.graph_replays, 0);
  EXPECT_EQ(testing::train_whole(required, answer + 1, 2).status, "oom");
}

// The default, graphs where they fit: above the largest batch whose graph fits, the capture falls
// back to eager steps in the trials as in the run, so the answer is the eager run's and the run
// there trains (eagerly, saying so), while a batch within the graphed answer replays.
TEST(WholeRunCuda, GraphsByDefaultKeepTheEagerAnswer) {
  if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
  // Two full batches at the answer (about 110): the run's second step is a capture.
  const TrainConfig c = momentum_cnn_on_gpu("64MiB");
  const MaxBatchOptions o = two_steps();
  TrainConfig eager = c, required = c;
  eager.cuda_graphs = false;
  required.cuda_graphs = true;
  const int64_t eager_answer = run_maxbatch(eager, o, false).finder.max_batch;
  const int64_t graphed_answer = run_maxbatch(required, o, false).finder.max_batch;
  ASSERT_LT(graphed_answer, eager_answer) << "the graph's pool lowers the answer when graphs are required";
  const MaxBatchReport rep = run_maxbatch(c, o, false);
  const int64_t answer = rep.finder.max_batch;
  EXPECT_EQ(answer, eager_answer) << rep.text;
  EXPECT_FALSE(rep.finder.at_max.graphed) << "the trial at the answer fell back";
  const RunResult at = testing::train_at(c, answer);
  EXPECT_EQ(at.status, "ok") << at.note;
  EXPECT_EQ(at.graph_replays, 0);
  EXPECT_GT(at.graph_fallbacks, 0);
  EXPECT_EQ(testing::train_at(c, answer + 1).status, "oom");
  // memest's rows at the answer: the dry run's trial falls back where the real one does, with the
  // real trial's peaks to the byte (the failed capture's segments included).
  for (const Device d : {Device::meta(DeviceType::CUDA), Device::cuda(0)}) empty_cache(d);
  Trial dry, real;
  {
    StepRunner r(c, int64_t{64} << 20, Device::meta(DeviceType::CUDA));
    dry = r.run(answer, 2);
  }
  {
    StepRunner r(c, int64_t{64} << 20, Device::cuda(0));
    real = r.run(answer, 2);
  }
  ASSERT_TRUE(dry.ok && real.ok);
  EXPECT_FALSE(dry.graphed || real.graphed);
  EXPECT_EQ(dry.peak_allocated, real.peak_allocated);
  EXPECT_EQ(dry.peak_reserved, real.peak_reserved);
  const RunResult within = testing::train_at(c, graphed_answer);
  EXPECT_GT(within.graph_replays, 0);
  EXPECT_EQ(within.graph_fallbacks, 0);
}

}  // namespace
}  // namespace minidl::harness
