// --resume continues a run exactly: a run stopped after epoch 2 (or in the middle of an epoch, at a
// step boundary) and resumed ends with the same weights, optimizer and gradient-scaler state, bit
// for bit, as the run that never stopped, with mixed precision and a warmup + cosine schedule
// (whose position and length depend on the restored step count). Also metrics.csv on resume.
#include <gtest/gtest.h>

#include <cstring>
#include <fstream>

#include "core/allocator.h"
#include "experiments/harness/results.h"
#include "train/run.h"
#include "nn/safetensors.h"
#include "tests/experiments/helpers.h"

namespace minidl::harness {
namespace {

// AMP with a short growth interval so the loss scale changes (grows, and backs off with skipped
// steps when f16 overflows) within 12 steps: a resume that forgot the scaler would diverge.
TrainConfig resume_config() {
  TrainConfig c = testing::tiny_config();   // 4 optimizer steps per epoch
  c.epochs = 3;
  c.optimizer = "sgd";
  c.momentum = 0.9;
  c.amp = true;
  c.amp_growth_interval = 3;
  c.warmup_steps = 3;
  c.schedule = "cosine";
  return c;
}

// Every tensor of two safetensors files, compared byte for byte; returns the differing names.
std::vector<std::string> differing(const std::string& a, const std::string& b) {
  const auto fa = nn::load_safetensors(a).tensors;
  const auto fb = nn::load_safetensors(b).tensors;
  std::vector<std::string> diff;
  for (const auto& [k, ta] : fa) {
    auto it = fb.find(k);
    if (it == fb.end() || it->second.shape() != ta.shape() || it->second.dtype() != ta.dtype() ||
        std::memcmp(it->second.data_ptr(), ta.data_ptr(), ta.nbytes()) != 0)
      diff.push_back(k);
  }
  for (const auto& [k, tb] : fb)
    if (!fa.count(k)) diff.push_back(k + " (only in the resumed run)");
  return diff;
}

double scalar(const std::string& file, const std::string& key) {
  const Tensor t = nn::load_safetensors(file).tensors.at(key);
  return t.dtype() == DType::f64 ? *t.data<double>() : static_cast<double>(*t.data<int64_t>());
}

struct Continuous {
  RunResult result;
  std::string weights;
};

Continuous run_uninterrupted(const std::filesystem::path& dir, TrainConfig c = resume_config()) {
  c.save_weights = (dir / "full.safetensors").string();
  Continuous out{run_training(c, {[](const std::string&) {}, {}, {}}), c.save_weights};
  EXPECT_EQ(out.result.status, "ok");
  if (c.amp) {
    // 12 windows; the scaler skips some (f16 overflow after the scale grew): its state matters.
    EXPECT_LT(out.result.steps, 12);
    EXPECT_GE(out.result.steps, 8);
  }
  return out;
}

// Resumes `saved` for the rest of the 3 epochs and checks it against the uninterrupted run.
void expect_resume_matches(const Continuous& full, const std::string& saved, const std::filesystem::path& dir,
                           int64_t first_epoch, TrainConfig c = resume_config()) {
  c.resume = saved;
  c.save_weights = (dir / "resumed.safetensors").string();
  const RunResult r = run_training(c, {[](const std::string&) {}, {}, {}});
  ASSERT_EQ(r.status, "ok") << r.note;
  EXPECT_EQ(r.first_epoch, first_epoch);
  EXPECT_EQ(r.steps, full.result.steps);
  EXPECT_EQ(differing(full.weights, c.save_weights), std::vector<std::string>{}) << "model weights";
  EXPECT_EQ(differing(full.weights + ".optimizer.safetensors", c.save_weights + ".optimizer.safetensors"),
            std::vector<std::string>{})
      << "optimizer + gradient scaler state";
  ASSERT_FALSE(r.epochs.empty());
  EXPECT_EQ(r.epochs.back().epoch, 3);
  EXPECT_EQ(r.epochs.back().val_acc, full.result.epochs.back().val_acc);
  EXPECT_EQ(r.epochs.back().lr, full.result.epochs.back().lr) << "schedule position";
  EXPECT_EQ(r.best_val_acc, full.result.best_val_acc);
  EXPECT_EQ(r.best_epoch, full.result.best_epoch);
  EXPECT_EQ(r.test_acc, full.result.test_acc);
}

TEST(ExperimentsResume, StopAfterEpochTwoThenResumeIsBitIdentical) {
  const auto dir = testing::temp_dir();
  const Continuous full = run_uninterrupted(dir);
  TrainConfig c = resume_config();
  c.save_weights = (dir / "two.safetensors").string();
  RunHooks hooks{[](const std::string&) {}, [](const EpochMetrics& e) {
                   if (e.epoch == 2) request_stop();   // as a SIGINT during epoch 2's evaluation
                 },
                 {}};
  const RunResult first = run_training(c, hooks);
  clear_stop();
  ASSERT_EQ(first.status, "interrupted") << first.note;
  ASSERT_EQ(first.epochs.size(), 2u);
  EXPECT_EQ(first.steps, full.result.epochs.at(1).steps);
  const auto meta = nn::load_safetensors(c.save_weights).metadata;
  EXPECT_EQ(meta.at("epoch"), "2");
  EXPECT_EQ(meta.at("micro_batches"), "0") << "epoch 2 complete";
  // The scaler state is not the fresh one, so the comparison below depends on restoring it.
  const std::string opt = c.save_weights + ".optimizer.safetensors";
  EXPECT_TRUE(scalar(opt, "scaler.scale") != 65536.0 || scalar(opt, "scaler._growth_tracker") != 0.0);
  EXPECT_EQ(scalar(opt, "scaler.growth_interval"), 3.0);
  expect_resume_matches(full, c.save_weights, dir, 3);
  std::filesystem::remove_all(dir);
}

TEST(ExperimentsResume, StopInsideAnEpochThenResumeIsBitIdentical) {
  const auto dir = testing::temp_dir();
  const Continuous full = run_uninterrupted(dir);
  TrainConfig c = resume_config();
  c.save_weights = (dir / "mid.safetensors").string();
  RunHooks hooks{[](const std::string&) {}, {}, [](int64_t step) {
                   if (step == 6) request_stop();   // after 2 of epoch 2's 4 steps
                 }};
  const RunResult first = run_training(c, hooks);
  clear_stop();
  ASSERT_EQ(first.status, "interrupted") << first.note;
  EXPECT_EQ(first.steps, 6);
  const auto meta = nn::load_safetensors(c.save_weights).metadata;
  EXPECT_EQ(meta.at("epoch"), "2");
  const int64_t micro = std::stoll(meta.at("micro_batches"));
  EXPECT_GT(micro, 0) << "stopped inside epoch 2";
  EXPECT_LT(micro, 4);
  EXPECT_EQ(meta.at("best_epoch"), "1") << "the partial epoch's evaluation is not bookkept";
  expect_resume_matches(full, c.save_weights, dir, 2);
  std::filesystem::remove_all(dir);
}

// Adam (moments and per-parameter step counts) with gradient accumulation, stopped after the
// first window of epoch 2: the resumed epoch starts at the next window of the same order.
TEST(ExperimentsResume, AdamWithAccumulationResumesInsideAnEpoch) {
  const auto dir = testing::temp_dir();
  TrainConfig base = testing::tiny_config();
  base.epochs = 3;
  base.optimizer = "adam";
  base.batch_size = 4;
  base.accumulation_steps = 2;   // 8 micro-batches, 4 optimizer steps per epoch
  base.warmup_steps = 2;
  base.schedule = "step:3:0.5";
  const Continuous full = run_uninterrupted(dir, base);
  EXPECT_EQ(full.result.steps, 12);
  TrainConfig c = base;
  c.save_weights = (dir / "mid.safetensors").string();
  RunHooks hooks{[](const std::string&) {}, {}, [](int64_t step) {
                   if (step == 5) request_stop();
                 }};
  const RunResult first = run_training(c, hooks);
  clear_stop();
  ASSERT_EQ(first.status, "interrupted") << first.note;
  const auto meta = nn::load_safetensors(c.save_weights).metadata;
  EXPECT_EQ(meta.at("epoch"), "2");
  EXPECT_EQ(meta.at("micro_batches"), "2") << "one window of two micro-batches";
  expect_resume_matches(full, c.save_weights, dir, 2, base);
  std::filesystem::remove_all(dir);
}

TEST(ExperimentsResume, PartialEpochNeedsTheSameBatchPlan) {
  const auto dir = testing::temp_dir();
  TrainConfig c = resume_config();
  c.amp = false;
  c.save_weights = (dir / "mid.safetensors").string();
  RunHooks hooks{[](const std::string&) {}, {}, [](int64_t step) {
                   if (step == 1) request_stop();
                 }};
  ASSERT_EQ(run_training(c, hooks).status, "interrupted");
  clear_stop();
  TrainConfig r = resume_config();
  r.amp = true;   // allowed: the optimizer continues, the scaler starts fresh
  r.resume = c.save_weights;
  r.batch_size = 4;
  EXPECT_THROW(run_training(r, {[](const std::string&) {}, {}, {}}), UsageError);
  r.batch_size = 8;
  std::vector<std::string> lines;
  const RunResult ok = run_training(r, {[&](const std::string& s) { lines.push_back(s); }, {}, {}});
  EXPECT_EQ(ok.status, "ok");
  EXPECT_EQ(ok.epochs.back().epoch, 3);
  bool told = false;
  for (const auto& l : lines) told = told || l.find("no gradient-scaler state") != std::string::npos;
  EXPECT_TRUE(told);
  std::filesystem::remove_all(dir);
}

// A batch schedule (8, then 64 after the first epoch) under a budget that 64 does not fit, so the
// second phase runs as accumulated micro-batches: stopped where the phase changes, or inside the
// accumulated phase, the resumed run ends bit-identical to the one that never stopped (the saved
// micro-batch and accumulation are reused, not tried again).
TEST(ExperimentsResume, InsideABatchScheduleWithItsFallbackIsBitIdentical) {
  const auto dir = testing::temp_dir();
  TrainConfig base = resume_config();   // AMP, SGD momentum, warmup + cosine
  base.image_size = 16;
  base.split = "64,8,8";                 // 128 images: 16 steps at 8, then 2 per epoch at 64
  base.batch_size = 8;
  base.batch_schedule = "x8@1";
  base.batch_schedule_lr = "sqrt";
  const RunResult probe = run_training(base, {[](const std::string&) {}, {}, {}});
  ASSERT_EQ(probe.status, "ok") << probe.note;
  const int64_t p8 = probe.epochs[0].peak_reserved, p64 = probe.epochs[1].peak_reserved;
  base.memory_budget = std::to_string(p8 + (p64 - p8) / 3) + "B";
  Continuous full;
  full.weights = (dir / "full.safetensors").string();
  TrainConfig c = base;
  c.save_weights = full.weights;
  full.result = run_training(c, {[](const std::string&) {}, {}, {}});
  ASSERT_EQ(full.result.status, "ok") << full.result.note;
  ASSERT_EQ(full.result.epochs.size(), 3u);
  ASSERT_LT(full.result.epochs[1].batch_size, 64) << "the budget must force the fallback";
  ASSERT_EQ(full.result.epochs[1].batch_size * full.result.epochs[1].accumulation_steps, 64);
  const int64_t first_steps = full.result.epochs[0].steps;
  for (const int64_t stop_at : {first_steps, first_steps + 1}) {   // the phase change; inside epoch 2
    c = base;
    c.save_weights = (dir / ("stop" + std::to_string(stop_at) + ".safetensors")).string();
    RunHooks hooks{[](const std::string&) {}, {}, [stop_at](int64_t step) {
                     if (step == stop_at) request_stop();
                   }};
    const RunResult first = run_training(c, hooks);
    clear_stop();
    ASSERT_EQ(first.status, "interrupted") << first.note;
    const auto meta = nn::load_safetensors(c.save_weights).metadata;
    const bool inside = stop_at > first_steps;
    EXPECT_EQ(meta.at("scheduled_batch"), inside ? "64" : "8");
    EXPECT_EQ(meta.at("batch_size"), std::to_string(inside ? full.result.epochs[1].batch_size : 8));
    expect_resume_matches(full, c.save_weights, dir, 2, base);
    if (HasFatalFailure()) return;
  }
  // Resuming the partial epoch with another schedule: exit status 2, as with another --batch-size.
  c = base;
  c.resume = (dir / ("stop" + std::to_string(first_steps + 1) + ".safetensors")).string();
  c.batch_schedule = "x4@1";
  EXPECT_THROW(run_training(c, {[](const std::string&) {}, {}, {}}), UsageError);
  EXPECT_EQ(memory_stats().budget_bytes, 0) << "the refused run took its budget away with it";
  std::filesystem::remove_all(dir);
}

TEST(ExperimentsResume, MetricsCsvKeepsTheEarlierEpochs) {
  const auto dir = testing::temp_dir();
  const auto csv = dir / "metrics.csv";
  std::vector<EpochMetrics> old(2);
  old[0].epoch = 1, old[0].images = 32;
  old[1].epoch = 2, old[1].images = 16;   // partial: resumed inside epoch 2
  write_file_atomic(csv, epochs_csv(old));
  std::vector<EpochMetrics> fresh(2);
  fresh[0].epoch = 2, fresh[0].images = 16;
  fresh[1].epoch = 3, fresh[1].images = 32;
  const std::string merged = resumed_epochs_csv(csv, fresh, 2);
  write_file_atomic(csv, merged);
  const CsvTable t = read_csv(csv);
  ASSERT_EQ(t.rows.size(), 3u);
  EXPECT_EQ(t.get(0, "epoch"), "1");
  EXPECT_EQ(t.get(1, "epoch"), "2");
  EXPECT_EQ(t.get(2, "epoch"), "3");
  EXPECT_EQ(resumed_epochs_csv(csv, fresh, 2), merged) << "resuming twice gives the same table";
  EXPECT_EQ(resumed_epochs_csv(dir / "none.csv", fresh, 2), epochs_csv(fresh));
  std::filesystem::remove_all(dir);
}

TEST(ExperimentsResume, TrainProgramAppendsMetricsOnResume) {
  const auto dir = testing::temp_dir();
  const std::string train = testing::program("minidl-train").string() +
                            " --model smallcnn --image-size 8 --split 16,8,8 --batch-size 8 --quiet --out " +
                            dir.string() + " --synthetic-difficulty 0.2";
  const std::string w = (dir / "w.safetensors").string();
  ASSERT_EQ(testing::run_status(train + " --epochs 2 --save-weights " + w), 0);
  ASSERT_EQ(testing::run_status(train + " --epochs 3 --resume " + w), 0);
  const CsvTable t = read_csv(dir / "metrics.csv");
  ASSERT_EQ(t.rows.size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(t.get(i, "epoch"), std::to_string(i + 1));
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace minidl::harness
