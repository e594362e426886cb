// --batch-schedule: the batch changes at the named epochs and at no other time (in-memory tensors
// and the threaded loader alike), the learning rate follows --batch-schedule-lr, epoch units in
// --schedule land on the epoch boundaries of the changing batch, and a scheduled batch that does
// not fit the memory budget is accumulated instead, with the effective batch, the optimizer step
// count and the allocator's peak to show for it.
#include <gtest/gtest.h>

#include <cmath>

#include "train/batch_schedule.h"
#include "train/run.h"
#include "tests/experiments/helpers.h"

namespace minidl::harness {
namespace {

TEST(ExperimentsBatchSchedule, FormsGiveTheBatchOfEachEpoch) {
  const BatchSchedule explicit_form = BatchSchedule::parse("32@0,64@5,128@10", 8);
  EXPECT_TRUE(explicit_form.active());
  EXPECT_EQ(explicit_form.batch_at(0), 32);
  EXPECT_EQ(explicit_form.batch_at(4), 32);
  EXPECT_EQ(explicit_form.batch_at(5), 64) << "64@5: after five completed epochs";
  EXPECT_EQ(explicit_form.batch_at(9), 64);
  EXPECT_EQ(explicit_form.batch_at(10), 128);
  EXPECT_EQ(explicit_form.batch_at(99), 128);
  const BatchSchedule late = BatchSchedule::parse("64@2", 16);
  EXPECT_EQ(late.batch_at(1), 16) << "before the first entry: --batch-size";
  EXPECT_EQ(late.batch_at(2), 64);
  const BatchSchedule every = BatchSchedule::parse("x2@every:5", 32);
  EXPECT_EQ(every.batch_at(4), 32);
  EXPECT_EQ(every.batch_at(5), 64);
  EXPECT_EQ(every.batch_at(10), 128);
  const BatchSchedule at = BatchSchedule::parse("x4@3,6", 16);
  EXPECT_EQ(at.batch_at(2), 16);
  EXPECT_EQ(at.batch_at(3), 64);
  EXPECT_EQ(at.batch_at(7), 256);
  const BatchSchedule none = BatchSchedule::parse("", 24);
  EXPECT_FALSE(none.active());
  EXPECT_EQ(none.batch_at(50), 24);
  for (const char* bad : {"32", "32@", "@5", "0@0", "32@0,64@0", "64@5,32@2", "x1@every:5", "x2@every:0", "x2@",
                          "x2@5,3", "xy@5", "32@-1", "32@1.5"})
    EXPECT_THROW(BatchSchedule::parse(bad, 8), UsageError) << bad;
  EXPECT_THROW(BatchSchedule::parse("x2@every:1", 8).batch_at(40), UsageError) << "past 2^31";
}

TEST(ExperimentsBatchSchedule, LearningRateRules) {
  EXPECT_DOUBLE_EQ(batch_schedule_lr_factor("keep", 128, 32), 1.0);
  EXPECT_DOUBLE_EQ(batch_schedule_lr_factor("linear", 128, 32), 4.0);
  EXPECT_DOUBLE_EQ(batch_schedule_lr_factor("sqrt", 128, 32), 2.0);
  EXPECT_DOUBLE_EQ(batch_schedule_lr_factor("linear", 32, 32), 1.0);
}

TEST(ExperimentsBatchSchedule, EpochUnitsBecomeTheStepsWhereThoseEpochsStart) {
  // Epochs of 10, 10, 5, 5 steps (a batch doubled after two epochs).
  const std::vector<double> starts{0, 10, 20, 25, 30};
  const auto start = [&](double e) {
    const auto w = static_cast<size_t>(e);
    return starts[w] + (e - static_cast<double>(w)) * (starts[w + 1] - starts[w]);
  };
  EXPECT_EQ(resolve_epoch_units("multistep:2e,3e:0.5", start, 4, 0), "multistep:20,25:0.5");
  EXPECT_EQ(resolve_epoch_units("multistep:2e,3e:0.5", start, 4, 4), "multistep:16,21:0.5")
      << "the inner schedule starts after the warmup";
  EXPECT_EQ(resolve_epoch_units("multistep:1.5e:0.1", start, 4, 0), "multistep:15:0.1");
  EXPECT_EQ(resolve_epoch_units("step:1e:0.5", start, 4, 0), "multistep:10,20,25:0.5") << "every epoch below 4";
  EXPECT_EQ(resolve_epoch_units("step:9e:0.5", start, 4, 0), "constant") << "no milestone inside the run";
  EXPECT_EQ(resolve_epoch_units("warmup:3+multistep:2e:0.5", start, 4, 0), "warmup:3+multistep:20:0.5");
  EXPECT_EQ(resolve_epoch_units("multistep:30,60:0.1", start, 4, 0), "multistep:30,60:0.1") << "steps stay steps";
  EXPECT_EQ(resolve_epoch_units("cosine", start, 4, 0), "cosine");
  EXPECT_THROW(resolve_epoch_units("multistep:1e:0.5", start, 4, 12), UsageError) << "inside the warmup";
  EXPECT_THROW(resolve_epoch_units("multistep:2e,30:0.5", start, 4, 0), UsageError) << "units mixed";
}

TEST(ExperimentsBatchSchedule, FallbackKeepsTheScheduledBatchThroughAccumulation) {
  int calls = 0;
  const auto fits_up_to = [&](int64_t limit) {
    return [&calls, limit](int64_t b) {
      ++calls;
      return b <= limit;
    };
  };
  EpochBatch eb = fit_scheduled_batch(32, 1, fits_up_to(40));
  EXPECT_EQ(eb.micro, 32);
  EXPECT_EQ(eb.accumulation, 1);
  EXPECT_FALSE(eb.fell_back());
  EXPECT_EQ(calls, 1) << "a batch that fits costs one trial";
  calls = 0;
  eb = fit_scheduled_batch(128, 1, fits_up_to(40));
  EXPECT_EQ(eb.micro, 32);
  EXPECT_EQ(eb.accumulation, 4);
  EXPECT_EQ(eb.effective(), 128);
  EXPECT_TRUE(eb.fell_back());
  EXPECT_LE(calls, 1 + 7) << "one trial, then a bisection over 1..127";
  eb = fit_scheduled_batch(128, 2, fits_up_to(15));
  EXPECT_EQ(eb.micro, 8) << "an exact split (8 x 16) rather than 15 x 9 = 135";
  EXPECT_EQ(eb.accumulation, 2 * 16) << "times --accumulation-steps";
  eb = fit_scheduled_batch(97, 1, fits_up_to(10));
  EXPECT_EQ(eb.micro * eb.accumulation, 100) << "a prime has no split into micro-batches <= 10 but 1s: 10 x 10";
  eb = fit_scheduled_batch(64, 1, fits_up_to(0));
  EXPECT_EQ(eb.micro, 0) << "not even 1 fits";
}

// The per-epoch batches and steps of a tiny run (32 training images), through both sources.
struct Seen {
  std::vector<int64_t> batch, steps, images;
  std::vector<double> lr;
};

Seen run_and_watch(TrainConfig c, RunResult* out = nullptr, std::vector<std::string>* lines = nullptr) {
  Seen s;
  RunHooks hooks;
  hooks.log = [&](const std::string& l) {
    if (lines) lines->push_back(l);
  };
  int64_t last = 0;
  hooks.on_epoch = [&](const EpochMetrics& e) {
    s.batch.push_back(e.batch_size * e.accumulation_steps);
    s.steps.push_back(e.steps - last);
    s.images.push_back(e.images);
    s.lr.push_back(e.lr);
    last = e.steps;
  };
  const RunResult r = run_training(c, hooks);
  EXPECT_EQ(r.status, "ok") << r.note;
  if (out) *out = r;
  return s;
}

TEST(ExperimentsBatchSchedule, TheBatchChangesAtTheNamedEpochsOnly) {
  TrainConfig c = testing::tiny_config();
  c.epochs = 5;
  c.batch_size = 4;
  c.batch_schedule = "4@0,8@2,16@4";
  for (const std::string augment : {"none", "keras"}) {   // in-memory tensors, then the threaded loader
    c.augment = augment;
    const Seen s = run_and_watch(c);
    EXPECT_EQ(s.batch, (std::vector<int64_t>{4, 4, 8, 8, 16})) << augment;
    EXPECT_EQ(s.steps, (std::vector<int64_t>{8, 8, 4, 4, 2})) << augment;
    EXPECT_EQ(s.images, (std::vector<int64_t>(5, 32))) << augment << ": every image once per epoch";
  }
  c.augment = "none";
  c.batch_schedule = "x2@every:2";
  c.accumulation_steps = 2;   // composes: the scheduled batch is the micro-batch
  EXPECT_EQ(run_and_watch(c).batch, (std::vector<int64_t>{8, 8, 16, 16, 32}));
}

TEST(ExperimentsBatchSchedule, LearningRateIsKeptOrScaledWithTheBatch) {
  TrainConfig c = testing::tiny_config();
  c.epochs = 3;
  c.batch_size = 4;
  c.lr = 0.02;
  c.batch_schedule = "x4@1";   // 4, then 16
  c.batch_schedule_lr = "keep";
  RunResult r;
  Seen s = run_and_watch(c, &r);
  EXPECT_EQ(s.lr, (std::vector<double>{0.02, 0.02, 0.02}));
  EXPECT_DOUBLE_EQ(r.lr, 0.02);
  c.batch_schedule_lr = "linear";
  s = run_and_watch(c);
  EXPECT_DOUBLE_EQ(s.lr[0], 0.02);
  EXPECT_DOUBLE_EQ(s.lr[1], 0.08);
  EXPECT_DOUBLE_EQ(s.lr[2], 0.08);
  c.batch_schedule_lr = "sqrt";
  s = run_and_watch(c);
  EXPECT_DOUBLE_EQ(s.lr[1], 0.04);
  // --lr-scaling scales to the first epoch's batch once; the schedule's rule applies on top.
  c.lr_scaling = "linear";
  c.base_batch = 8;
  c.batch_schedule_lr = "linear";
  s = run_and_watch(c, &r);
  EXPECT_DOUBLE_EQ(r.lr, 0.01);
  EXPECT_DOUBLE_EQ(s.lr[1], 0.04) << "0.02 x 16 / 8";
  // A step decay given in epochs lands on the epoch boundary whatever the batch: after epoch 2.
  c.lr_scaling = "none";
  c.batch_schedule_lr = "keep";
  c.schedule = "multistep:2e:0.5";
  s = run_and_watch(c);
  EXPECT_EQ(s.lr, (std::vector<double>{0.02, 0.02, 0.01}));
}

TEST(ExperimentsBatchSchedule, ABatchOverTheBudgetIsAccumulatedWithTheSameEffectiveBatch) {
  TrainConfig c = testing::tiny_config();
  c.image_size = 16;
  c.split = "64,8,8";          // 128 training images
  c.epochs = 2;
  c.batch_size = 8;
  c.batch_schedule = "x8@1";   // 8, then 64
  RunResult free_run;
  const Seen unlimited = run_and_watch(c, &free_run);
  ASSERT_EQ(unlimited.batch, (std::vector<int64_t>{8, 64}));
  const int64_t p8 = free_run.epochs[0].peak_reserved, p64 = free_run.epochs[1].peak_reserved;
  ASSERT_GT(p64, p8 + 1024 * 1024) << "batch 64 must need visibly more than batch 8";
  // A budget between the two: batch 8 fits, 64 does not.
  const int64_t budget = p8 + (p64 - p8) / 3;
  c.memory_budget = std::to_string(budget) + "B";
  RunResult capped;
  std::vector<std::string> lines;
  const Seen fell = run_and_watch(c, &capped, &lines);
  ASSERT_EQ(capped.epochs.size(), 2u);
  EXPECT_EQ(capped.epochs[0].batch_size, 8);
  EXPECT_EQ(capped.epochs[0].accumulation_steps, 1);
  EXPECT_LT(capped.epochs[1].batch_size, 64) << "64 did not fit";
  EXPECT_GT(capped.epochs[1].accumulation_steps, 1);
  EXPECT_EQ(fell.batch, unlimited.batch) << "the effective batch is kept";
  EXPECT_EQ(fell.steps, unlimited.steps) << "and so the optimizer step count";
  EXPECT_EQ(capped.steps, free_run.steps);
  EXPECT_LE(capped.epochs[1].peak_reserved, budget) << "the allocator's peak stayed under the budget";
  EXPECT_LT(capped.epochs[1].peak_reserved, p64);
  // Epoch 1 is the same run in both; epoch 2's gradients are the same up to rounding (no batch norm).
  EXPECT_EQ(capped.epochs[0].train_loss, free_run.epochs[0].train_loss);
  EXPECT_NEAR(capped.epochs[1].train_loss, free_run.epochs[1].train_loss, 1e-4);
  bool said = false;
  for (const auto& l : lines) said = said || l.find("batch 64 does not fit --memory-budget") != std::string::npos;
  EXPECT_TRUE(said) << "the fallback is announced";
  // Without the schedule the same budget keeps today's behaviour: batch 64 runs out of memory.
  c.batch_schedule.clear();
  c.batch_size = 64;
  EXPECT_EQ(run_training(c, {[](const std::string&) {}, {}, {}}).status, "oom");
}

TEST(ExperimentsBatchSchedule, FlagsAreValidated) {
  TrainConfig c = testing::tiny_config();
  c.batch_schedule = "32@0,16@0";
  EXPECT_THROW(validate(c), UsageError);
  c.batch_schedule = "x2@every:1";
  c.epochs = 40;
  EXPECT_THROW(validate(c), UsageError) << "grows past 2^31 within the run";
  c.epochs = 3;
  EXPECT_NO_THROW(validate(c));
  c.batch_schedule_lr = "cubic";
  EXPECT_THROW(validate(c), UsageError);
  c.batch_schedule_lr = "sqrt";
  c.schedule = "multistep:2e,x:0.5";
  EXPECT_THROW(validate(c), UsageError);
  c.schedule = "step:2e:0.5";
  EXPECT_NO_THROW(validate(c));
}

}  // namespace
}  // namespace minidl::harness
