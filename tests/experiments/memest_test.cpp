// The dry run against the measured step (issue 32): for three models, with and without AMP,
// recomputation and accumulation, the shape-only device's peaks equal the peaks a real CPU step
// measures, and minidl-memest skips what the budget rules out (minidl-maxbatch's dry answer:
// sweep_test.cpp, ExperimentsMaxBatch).
#include <gtest/gtest.h>

#include "core/allocator.h"
#include "experiments/harness/memest.h"
#include "experiments/harness/step_runner.h"
#include "tests/experiments/helpers.h"

namespace minidl::harness {
namespace {

// Peaks of one trial above what the device held before its runner existed (a test process keeps
// other tensors alive; memest's own process starts empty, where the absolute peaks agree too), and
// the bytes the max-batch finder fits on. Both start with an empty host cache (the trial empties
// it too).
struct Measured {
  int64_t allocated = 0, reserved = 0, fit = 0;
};

Measured trial_peaks(const TrainConfig& c, Device d, int64_t batch) {
  empty_cache(d);
  const MemoryStats before = memory_stats(d);
  StepRunner r(c, 0, d);
  const Trial t = r.run(batch, 1);
  EXPECT_TRUE(t.ok);
  return {t.peak_allocated - before.allocated_bytes, t.peak_reserved - before.reserved_bytes,
          t.fit_bytes() - before.allocated_bytes};
}

void expect_dry_run_exact(const TrainConfig& c, int64_t batch) {
  SCOPED_TRACE(c.model + " at " + std::to_string(c.image_size) + " px, batch " + std::to_string(batch) +
               (c.amp ? ", AMP " + c.amp_dtype : "") + (c.conv_bn_chain ? ", conv-bn chain" : "") +
               (c.resolved_channels_last() ? ", channels-last" : "") + ", checkpoint " +
               c.checkpoint + ", accumulation " +
               std::to_string(c.accumulation_steps) + ", " + c.optimizer);
  const Measured dry = trial_peaks(c, Device::meta(), batch);
  const Measured real = trial_peaks(c, Device::cpu(), batch);
  EXPECT_GT(real.allocated, 0);
  EXPECT_EQ(dry.allocated, real.allocated) << "peak allocated";
  EXPECT_EQ(dry.reserved, real.reserved) << "peak reserved";
  EXPECT_EQ(dry.fit, real.fit) << "the bytes maxbatch fits on (live blocks on the CPU, on meta:cpu too)";
}

// Three models, each FP32 and with other configurations (AMP f16 and bf16, accumulation,
// recomputation, the conv-bn chain).
TEST(ExperimentsMemest, DryRunEqualsTheMeasuredStepSmallCnn) {
  TrainConfig c = testing::tiny_config();
  c.amp_init_scale = 1;   // AMP: no overflowing warm-up steps to skip (each one a real step here)
  c.image_size = 24;
  c.optimizer = "adam";
  expect_dry_run_exact(c, 6);
  c.amp = true;
  c.accumulation_steps = 2;
  expect_dry_run_exact(c, 5);
}

TEST(ExperimentsMemest, DryRunEqualsTheMeasuredStepResNet18) {
  TrainConfig r = testing::tiny_config();
  r.amp_init_scale = 1;
  r.model = "resnet18-small";
  r.image_size = 16;
  r.momentum = 0.9;
  expect_dry_run_exact(r, 4);
  // AMP with optimal recomputation: both plan alike (modelled link times, the run's limit).
  r.amp = true;
  r.checkpoint = "optimal";
  expect_dry_run_exact(r, 2);
  // bf16 autocast (no gradient scaler) with the convolutions carrying the batch norms (composed on
  // the CPU).
  r.amp_dtype = "bf16";
  r.checkpoint = "none";
  r.conv_bn_chain = true;
  expect_dry_run_exact(r, 3);
  // Channels-last in f32 and with f16 AMP: the CPU runs the convolutions, pooling and batch norms
  // through contiguous NCHW copies, which the dry run makes too.
  r.amp = false;
  r.conv_bn_chain = false;
  r.channels_last = true;
  expect_dry_run_exact(r, 3);
  r.amp = true;
  r.amp_dtype = "f16";
  expect_dry_run_exact(r, 3);
}

TEST(ExperimentsMemest, DryRunEqualsTheMeasuredStepResNet50) {
  TrainConfig f = testing::tiny_config();
  f.model = "resnet50-small";
  f.image_size = 16;
  f.momentum = 0.9;
  f.checkpoint = "stages";
  expect_dry_run_exact(f, 2);
}

TEST(ExperimentsMemest, MarksBatchesOverTheBudgetAndDoesNotRunThem) {
  TrainConfig c = testing::tiny_config();
  c.model = "resnet18-small";
  c.image_size = 16;
  c.memory_budget = "200MiB";
  const MemestReport rep = run_memest(c, {2, 4096});
  ASSERT_EQ(rep.rows.size(), 2u);
  EXPECT_FALSE(rep.rows[0].over_budget());
  EXPECT_TRUE(rep.rows[0].measured);
  EXPECT_NEAR(rep.rows[0].error_pct(), 0.0, 0.1) << memest_table(rep);
  EXPECT_NEAR(rep.rows[0].reserved_error_pct(), 0.0, 0.1) << memest_table(rep);
  EXPECT_TRUE(rep.rows[1].over_budget());
  EXPECT_FALSE(rep.rows[1].measured) << "a batch the dry run rules out must not be run";
  const std::string md = memest_markdown(rep, "abc123", "2026-01-01");
  for (const char* s : {"resnet18-small at 16 px", "cpu", "abc123", "over the budget", "not run"})
    EXPECT_NE(md.find(s), std::string::npos) << s << " missing from\n" << md;
}

}  // namespace
}  // namespace minidl::harness
