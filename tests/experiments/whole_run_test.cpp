// minidl-maxbatch's answer holds for the whole run on the CPU (tests/experiments/whole_run.h): the
// synthetic set (held in memory for the whole run) and a photo folder (decoded by the loader), in
// f32, with AMP and with recomputation. The folder runs use --workers 0, whose loader holds one
// batch at a time, so that the answer + 1 runs out every time; with workers the loader holds up to
// its queue's worth, which the answer counts, so the answer trains but its neighbour may too.
#include <gtest/gtest.h>

#include <filesystem>

#include "experiments/harness/step_runner.h"
#include "train/run_footprint.h"
#include "tests/experiments/helpers.h"
#include "tests/experiments/whole_run.h"

namespace minidl::harness {
namespace {

TrainConfig small_cnn(const std::string& budget) { return testing::small_cnn(16, "96,8,8", budget); }

std::filesystem::path photos() { return std::filesystem::path(MINIDL_SHARED_DATA_DIR) / "catsdogs"; }

TEST(WholeRun, SyntheticDataHeldInMemoryCountsAgainstTheBudget) {
  const TrainConfig c = small_cnn("6MiB");
  // The set alone is worth several images of the step: without it the answer was too large.
  const RunFootprint f = run_footprint(c, Device::cpu(), 16);
  EXPECT_EQ(f.resident_bytes, 2 * (96 + 8 + 8) * (3 * 16 * 16 * 4 + 8));
  // The epochs' smaller last batches, which every trial runs too: 192 training images and 16 to
  // evaluate, at batch 10.
  EXPECT_EQ(f.training_images, 192);
  EXPECT_EQ(f.training_partial(10), 2);
  EXPECT_EQ(f.evaluation_partial(10), 6);
  EXPECT_EQ(f.training_partial(16), 0);
  EXPECT_EQ(f.evaluation_partial(16), 0);
  testing::expect_answer_trains(c);
}

TEST(WholeRun, SyntheticDataWithAmp) {
  TrainConfig c = small_cnn("5MiB");
  c.amp = true;
  testing::expect_answer_trains(c);
}

TEST(WholeRun, SyntheticDataWithRecomputation) {
  TrainConfig c = small_cnn("120MiB");
  c.model = "resnet18-small";
  c.checkpoint = "stages";
  testing::expect_answer_trains(c);
}

// Accumulation: a trial's windows of two micro-batches, the second adding into the gradients the
// first made; its time is a micro-batch's, which the trial lines say.
TEST(WholeRun, SyntheticDataWithAccumulation) {
  TrainConfig c = small_cnn("6MiB");
  c.accumulation_steps = 2;
  const int64_t answer = testing::expect_answer_trains(c);
  MaxBatchOptions o;
  o.steps = 2;
  const MaxBatchReport rep = run_maxbatch(c, o, false);
  EXPECT_EQ(rep.finder.max_batch, answer);
  EXPECT_NE(rep.text.find(": ok, peak allocated"), std::string::npos) << rep.text;
  EXPECT_NE(rep.text.find(" s a micro-batch"), std::string::npos) << rep.text;
  EXPECT_EQ(rep.text.find(" s/step"), std::string::npos) << rep.text;
}

// --checkpoint optimal: the plan is solved at the first step of each batch shape, under a limit
// derived from the budget. The trials and the run plan alike (the same limit, modelled link
// times), so the answer trains and the answer + 1 runs out, the dry run's answer is the real one,
// and the recommended batch, which runs a plan of its own, trains too.
TEST(WholeRun, SyntheticDataWithOptimalRecomputation) {
  TrainConfig c = small_cnn("120MiB");
  c.model = "resnet18-small";
  c.checkpoint = "optimal";
  const int64_t answer = testing::expect_answer_trains(c);
  MaxBatchOptions o;
  o.steps = 2;
  const MaxBatchReport rep = run_maxbatch(c, o, false);
  EXPECT_EQ(rep.finder.dry_max_batch, answer) << rep.text;
  EXPECT_TRUE(rep.finder.confirmed) << rep.text;
  // A smaller batch runs another plan, which keeps more: the recommended batch was tried itself.
  EXPECT_NE(rep.text.find("tried with its own recomputation plan"), std::string::npos) << rep.text;
  EXPECT_EQ(testing::train_at(c, rep.recommended).status, "ok") << rep.text;
}

// The shared photos (../shared/data/catsdogs) decoded by the loader; skipped where they are absent.
class WholeRunPhotos : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(photos())) GTEST_SKIP() << "no photos at " << photos() << " (../shared/data)";
  }
  static TrainConfig photo_cnn(const std::string& budget, const std::string& split) {
    TrainConfig c = small_cnn(budget);
    c.data = photos().string();
    c.split = split;
    return c;
  }
};

TEST_F(WholeRunPhotos, SmallCnn) { testing::expect_answer_trains(photo_cnn("4MiB", "48,4,4")); }

TEST_F(WholeRunPhotos, WithAmpAndRecomputation) {
  TrainConfig c = photo_cnn("110MiB", "40,4,4");
  c.model = "resnet18-small";
  c.amp = true;
  c.checkpoint = "stages";
  testing::expect_answer_trains(c);
}

// With loader workers the answer counts the loader's whole queue: the run at the answer trains
// (whether the queue is full at the step's peak or not).
TEST_F(WholeRunPhotos, WithLoaderWorkersTheAnswerHoldsTheQueue) {
  TrainConfig c = photo_cnn("4MiB", "48,4,4");
  c.workers = 2;
  EXPECT_EQ(run_footprint(c, Device::cpu(), 16).batches_held, 6);
  MaxBatchOptions o;
  o.steps = 2;
  const MaxBatchReport rep = run_maxbatch(c, o, false);
  const RunResult r = testing::train_at(c, rep.finder.max_batch);
  EXPECT_EQ(r.status, "ok") << r.note << "\n" << rep.text;
}

// What a trial holds ahead is what the run's loader holds: the epoch's next batches, up to its
// queue, not the trial's own. At batch 32 two steps of an epoch of three full batches hold all
// three during the first step (the run's loader may have made the third by then), where an epoch of
// two holds two: the trials answered a batch whose run ran out when the loader was ahead of its step.
TEST_F(WholeRunPhotos, ATrialHoldsTheEpochsNextBatchesAsTheRunsLoaderDoes) {
  TrainConfig three = photo_cnn("", "48,4,4"), two = photo_cnn("", "32,4,4");
  three.workers = two.workers = 2;
  const auto peak = [](const TrainConfig& c) {
    StepRunner r(c, 0, Device::meta());
    const Trial t = r.run(32, 2);
    EXPECT_TRUE(t.ok);
    return t.peak_allocated;
  };
  EXPECT_EQ(peak(three) - peak(two), run_footprint(three, Device::cpu(), 16).batch_bytes(32));
}

}  // namespace
}  // namespace minidl::harness
