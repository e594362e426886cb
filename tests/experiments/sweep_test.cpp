// Sweeps: grids and study definitions, resumability (a rerun skips finished runs; a torn row is
// redone), the outputs (results.csv/json, summary.md), and the real maximum-batch finder and
// memory estimator on a tiny model under a CPU budget.
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <map>

#include "core/allocator.h"
#include "experiments/harness/step_runner.h"
#include "experiments/harness/sweep.h"
#include "train/run.h"
#include "nn/safetensors.h"
#include "tests/experiments/helpers.h"

namespace minidl::harness {
namespace {

using testing::Column;
using testing::column;

TEST(ExperimentsSweep, GridIsTheCartesianProductWithStableIds) {
  const Study s = make_grid(testing::tiny_config(), {4, 8}, {"sgd", "adam"}, {}, {});
  ASSERT_EQ(s.runs.size(), 4u);
  EXPECT_EQ(s.runs[0].id, "b4-sgd-none-none");
  EXPECT_EQ(s.runs[3].config.optimizer, "adam");
  EXPECT_EQ(s.runs[3].config.batch_size, 8);
  EXPECT_THROW(make_grid(testing::tiny_config(), {4, 4}, {}, {}, {}), UsageError);
}

TEST(ExperimentsSweep, StudiesHaveThePublishedSettings) {
  const TrainConfig base;
  const Study keras = make_study("keras-batch", false, base);
  ASSERT_EQ(keras.runs.size(), 42u);  // 3 seeds x (SGD 16-128, Adam 16-256, Adam + augmentation 16-256)
  EXPECT_EQ(keras.runs[0].config.image_size, 200);
  EXPECT_EQ(keras.runs[0].config.split, "600,200,200");
  EXPECT_EQ(keras.runs[0].config.epochs, 5);
  const Study tech = make_study("techniques", false, base);
  EXPECT_EQ(tech.runs[0].config.model, "resnet50");
  EXPECT_EQ(tech.runs[0].config.memory_budget, "11GiB");
  EXPECT_DOUBLE_EQ(tech.runs[0].config.momentum, 0.9);
  EXPECT_DOUBLE_EQ(tech.runs[0].config.resolved_weight_decay(), 1e-4);
  EXPECT_EQ(tech.runs[0].config.epochs, 15);
  // AMP in both precisions, beside each other: f16 with the scaler, bf16 without.
  const auto row = [&](const std::string& id) {
    for (const auto& r : tech.runs)
      if (r.id == id) return r.config;
    ADD_FAILURE() << "no techniques row " << id;
    return TrainConfig{};
  };
  EXPECT_TRUE(row("amp").amp && row("amp").uses_grad_scaler() && row("amp").resolved_amp_dtype() == DType::f16);
  EXPECT_TRUE(row("amp-bf16").amp && !row("amp-bf16").uses_grad_scaler());
  EXPECT_EQ(row("amp-bf16").resolved_amp_dtype(), DType::bf16);
  // The -expandable rows repeat their row with --expandable-segments, on a CUDA device only.
  EXPECT_TRUE(row("combined-expandable").expandable_segments && !row("combined").expandable_segments);
  EXPECT_EQ(row("combined-expandable").checkpoint, row("combined").checkpoint);
  EXPECT_EQ(row("combined-expandable").accumulation_steps, 4);
  for (const auto& r : tech.runs)
    EXPECT_EQ(r.unavailable.empty(), !r.config.expandable_segments) << r.id << " on the CPU";
  TrainConfig gpu = base;
  gpu.device = "cuda";
  for (const auto& r : make_study("techniques", false, gpu).runs) EXPECT_TRUE(r.unavailable.empty()) << r.id;
  // The utilization study under --amp bf16 is a table (and a folder) of its own beside f16's.
  TrainConfig bf16 = base;
  bf16.amp = true;
  bf16.amp_dtype = "bf16";
  const Study util_bf16 = make_study("utilization", false, bf16);
  EXPECT_EQ(util_bf16.variant, "amp-bf16");
  EXPECT_EQ(util_bf16.runs.front().group, "cpu, amp bf16");
  EXPECT_EQ(util_bf16.runs.front().config.resolved_amp_dtype(), DType::bf16);
  const Study lr = make_study("lr-scaling", false, base);
  EXPECT_EQ(lr.runs.front().config.batch_size, 32);
  EXPECT_EQ(lr.runs.back().config.batch_size, 1024);
  const Study util = make_study("utilization", false, base);
  EXPECT_EQ(util.runs.front().config.batch_size, 4);
  EXPECT_EQ(util.runs.back().config.batch_size, 1024);
  for (const auto& name : study_names()) {
    const Study q = make_study(name, true, base);
    EXPECT_TRUE(q.quick);
    for (const auto& r : q.runs) {
      if (!r.unavailable.empty()) continue;
      TrainConfig c = r.config;
      EXPECT_NO_THROW(validate(c)) << name << " " << r.id;
      EXPECT_LE(c.resolved_image_size(), 64) << "quick studies use small images";
    }
  }
  EXPECT_THROW(make_study("nosuch", false, base), UsageError);
}

TEST(ExperimentsSweep, ResumesWithoutRepeatingFinishedRuns) {
  const auto dir = testing::temp_dir();
  TrainConfig base = testing::tiny_config();
  Study s = make_grid(base, {8, 16}, {"sgd"}, {}, {});
  SweepOptions o;
  o.out = dir / "grid";
  o.verbose = false;
  const SweepOutcome first = run_sweep(s, o);
  EXPECT_EQ(first.ran, 2);
  EXPECT_EQ(read_csv(o.out / "results.csv").rows.size(), 2u);
  const SweepOutcome again = run_sweep(s, o);
  EXPECT_EQ(again.ran, 0);
  EXPECT_EQ(again.done_before, 2);
  // A third run added to the grid, and a torn row from a killed sweep: only the new one runs.
  s = make_grid(base, {8, 16, 32}, {"sgd"}, {}, {});
  { std::ofstream(o.out / "results.csv", std::ios::app) << "b32-sgd-none-none,grid,par"; }
  const SweepOutcome third = run_sweep(s, o);
  EXPECT_EQ(third.ran, 1);
  EXPECT_EQ(third.done_before, 2);
  const CsvTable t = read_csv(o.out / "results.csv");
  ASSERT_EQ(t.rows.size(), 3u);
  EXPECT_EQ(t.get(2, "run_id"), "b32-sgd-none-none");
  EXPECT_EQ(t.get(2, "status"), "ok");
  EXPECT_EQ(t.get(2, "gpu_busy_pct"), "") << "no busy figure on the CPU";
  EXPECT_EQ(t.get(2, "gpu_busy_source"), "none: cpu device");
  EXPECT_TRUE(std::filesystem::exists(o.out / "results.json"));
  EXPECT_TRUE(std::filesystem::exists(o.out / "summary.md"));
  std::ifstream md(o.out / "summary.md");
  const std::string text((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("| sgd, augment none | 32 |"), std::string::npos) << text;
  std::filesystem::remove_all(dir);
}

TEST(ExperimentsSweep, DivergedAndUnavailableRunsAreRowsNotCrashes) {
  const auto dir = testing::temp_dir();
  TrainConfig base = testing::tiny_config();
  base.lr = 1e6;
  base.momentum = 0.9;
  base.epochs = 3;
  Study s = make_grid(base, {8}, {"sgd"}, {}, {});
  SweepRun skipped = s.runs[0];
  skipped.id = "needs-amp";
  skipped.unavailable = "AMP is not in this build";
  s.runs.push_back(skipped);
  SweepOptions o;
  o.out = dir;
  o.verbose = false;
  run_sweep(s, o);
  const CsvTable t = read_csv(dir / "results.csv");
  ASSERT_EQ(column(t, "status"), (Column{"diverged", "unavailable"}));
  EXPECT_EQ(t.get(1, "note"), "AMP is not in this build");
  std::filesystem::remove_all(dir);
}

// The batch-schedule study: the same model, data and seed in three variants that differ only in
// the batch schedule and the learning-rate decay, at the same epochs and by the same factor.
TEST(ExperimentsSweep, BatchScheduleStudyComparesLikeWithLike) {
  const Study full = make_study("batch-schedule", false, TrainConfig{});
  ASSERT_EQ(full.runs.size(), 3u);
  std::map<std::string, std::pair<std::string, std::string>> by_variant;
  for (const auto& r : full.runs) {
    EXPECT_EQ(r.config.model, "smallcnn");
    EXPECT_EQ(r.config.image_size, 200);
    EXPECT_EQ(r.config.split, "600,200,200");
    EXPECT_EQ(r.config.epochs, 12);
    EXPECT_EQ(r.config.batch_size, 16);
    EXPECT_EQ(r.config.batch_schedule_lr, "keep");
    by_variant[r.id] = {r.config.batch_schedule, r.config.schedule};
  }
  EXPECT_EQ(by_variant.at("decay-lr-s0"), std::make_pair(std::string(""), std::string("multistep:4e,8e:0.25")));
  EXPECT_EQ(by_variant.at("grow-batch-s0"), std::make_pair(std::string("x4@4,8"), std::string("constant")));
  EXPECT_EQ(by_variant.at("hybrid-s0"), std::make_pair(std::string("x4@4"), std::string("multistep:8e:0.25")));
  EXPECT_TRUE(full.extra_outputs) << "its own plots and means";
  TrainConfig photos;
  photos.data = "/photos";
  EXPECT_EQ(make_study("batch-schedule", false, photos).runs[0].config.normalize, "imagenet")
      << "zero-mean photos: at 1/255 plain SGD stays at chance for epochs";
  EXPECT_EQ(make_study("keras-batch", false, photos).runs[0].config.normalize, "unit") << "the article's rescale";
  for (const auto& r : make_study("batch-schedule", false, photos).runs)
    EXPECT_EQ(r.config.diverge_loss, TrainConfig{}.diverge_loss) << "batch-schedule: the default safety net";
  for (const bool quick : {false, true})
    for (const auto& r : make_study("keras-batch", quick, photos).runs)
      EXPECT_EQ(r.config.diverge_loss, kKerasBatchDivergeLoss)
          << r.id << ": Keras does not stop on a high loss; Adam's first steps on the photos reach 34-123 and recover";
  EXPECT_GT(kKerasBatchDivergeLoss, 20 * TrainConfig{}.resolved_diverge_loss());
  const Study quick = make_study("batch-schedule", true, TrainConfig{});
  EXPECT_EQ(quick.runs.size(), 9u) << "three variants x three seeds";
  EXPECT_EQ(quick.runs[3].id, "decay-lr-s1");
  EXPECT_EQ(quick.runs[3].config.seed, 1u);
}

// The utilization study under --amp: the like-for-like row for PyTorch's --best, in a folder of its
// own (the run ids are the fp32 table's).
TEST(ExperimentsSweep, UtilizationTakesAmpIntoItsOwnFolder) {
  TrainConfig base;
  const Study fp32 = make_study("utilization", true, base);
  EXPECT_EQ(study_folder(fp32, "cpu"), "utilization-quick-cpu");
  base.amp = true;
  base.device = "cpu";
  const Study amp = make_study("utilization", false, base);
  EXPECT_EQ(study_folder(amp, "cuda"), "utilization-amp");
  EXPECT_EQ(study_folder(make_study("utilization", true, base), "cpu"), "utilization-amp-quick-cpu");
  for (const auto& r : amp.runs) {
    EXPECT_TRUE(r.config.amp) << r.id;
    EXPECT_EQ(r.group, "cpu, amp");
  }
  EXPECT_EQ(amp.runs.front().id, fp32.runs.front().id);
  EXPECT_EQ(study_folder(make_study("keras-batch", false, TrainConfig{}), "cuda"), "keras-batch");
}

// --retry-failed runs again exactly the rows that say error or crashed (or oom at a recommended
// batch), replacing each in place; finished rows (ok, and results such as diverged) keep their
// bytes and their order.
TEST(ExperimentsSweep, RetryFailedRerunsExactlyTheFailedRows) {
  const auto dir = testing::temp_dir();
  TrainConfig base = testing::tiny_config();
  Study s = make_grid(base, {4, 8, 16}, {"sgd"}, {}, {});
  // b8 cannot load its --init-weights (a file of the wrong tensors): an `error` row.
  const std::string weights = (dir / "init.safetensors").string();
  nn::save_safetensors(weights, {{"not.a.weight", zeros({2})}}, {});
  s.runs[1].config.init_weights = weights;
  SweepOptions o;
  o.out = dir / "grid";
  o.verbose = false;
  ASSERT_EQ(run_sweep(s, o).ran, 3);
  const auto csv = o.out / "results.csv";
  CsvTable t = read_csv(csv);
  ASSERT_EQ(t.rows.size(), 3u);
  EXPECT_EQ(t.get(0, "status"), "ok");
  EXPECT_EQ(t.get(1, "status"), "error");
  // b16 as a crashed --process-per-run child leaves it (the parent's row).
  const auto status = static_cast<size_t>(std::find(t.header.begin(), t.header.end(), "status") - t.header.begin());
  ASSERT_LT(status, t.header.size());
  t.rows[2][status] = "crashed";
  std::string text = csv_line(t.header);
  for (const auto& r : t.rows) text += csv_line(r);
  write_file_atomic(csv, text);
  const std::string first_line = csv_line(t.rows[0]);
  // A plain rerun does not touch them.
  EXPECT_EQ(run_sweep(s, o).ran, 0);
  // The cause fixed (weights of the right model), --retry-failed reruns b8 and b16 only.
  TrainConfig save = base;
  save.batch_size = 8;
  save.save_weights = weights;
  ASSERT_EQ(run_training(save, {[](const std::string&) {}, {}, {}}).status, "ok");
  o.retry_failed = true;
  const SweepOutcome retried = run_sweep(s, o);
  EXPECT_EQ(retried.ran, 2);
  EXPECT_EQ(retried.retried, 2);
  EXPECT_EQ(retried.done_before, 1);
  t = read_csv(csv);
  ASSERT_EQ(t.rows.size(), 3u) << "replaced, not appended";
  EXPECT_EQ(csv_line(t.rows[0]), first_line) << "the finished row is untouched";
  EXPECT_EQ(t.get(1, "run_id"), "b8-sgd-none-none");
  EXPECT_EQ(t.get(1, "status"), "ok");
  EXPECT_EQ(t.get(2, "run_id"), "b16-sgd-none-none");
  EXPECT_EQ(t.get(2, "status"), "ok");
  EXPECT_EQ(run_sweep(s, o).ran, 0) << "nothing failed any more";
  // An oom row is a result, unless the run trained at a maximum-batch search's answer (max_batch
  // set): then the answer failed, and --retry-failed runs it again.
  const auto max_batch = static_cast<size_t>(std::find(t.header.begin(), t.header.end(), "max_batch") - t.header.begin());
  ASSERT_LT(max_batch, t.header.size());
  t.rows[0][status] = "oom";
  t.rows[1][status] = "oom";
  t.rows[1][max_batch] = "12";
  text = csv_line(t.header);
  for (const auto& r : t.rows) text += csv_line(r);
  write_file_atomic(csv, text);
  EXPECT_EQ(run_sweep(s, o).retried, 1);
  t = read_csv(csv);
  EXPECT_EQ(t.get(0, "status"), "oom") << "a configuration that does not fit is a result";
  EXPECT_EQ(t.get(1, "status"), "ok") << "the answer's oom was run again";
  std::filesystem::remove_all(dir);
}

// The same through the program with --process-per-run: each retried row is replaced by its child.
TEST(ExperimentsSweep, RetryFailedWithProcessPerRun) {
  const auto dir = testing::temp_dir();
  const std::string weights = (dir / "init.safetensors").string();
  nn::save_safetensors(weights, {{"not.a.weight", zeros({2})}}, {});
  const std::string sweep = testing::program("minidl-sweep").string() +
                            " --model smallcnn --image-size 8 --split 16,8,8 --epochs 1 --synthetic-difficulty 0.2 "
                            "--batch-sizes 4,8 --quiet --process-per-run --init-weights " + weights + " --out " +
                            dir.string();
  EXPECT_EQ(testing::run_status(sweep), 0);
  const auto csv = dir / "grid" / "results.csv";
  CsvTable t = read_csv(csv);
  EXPECT_EQ(column(t, "status"), (Column{"error", "error"}));
  TrainConfig save = testing::tiny_config();
  save.save_weights = weights;
  ASSERT_EQ(run_training(save, {[](const std::string&) {}, {}, {}}).status, "ok");
  EXPECT_EQ(testing::run_status(sweep + " --retry-failed"), 0);
  t = read_csv(csv);
  ASSERT_EQ(column(t, "status"), (Column{"ok", "ok"}));
  EXPECT_EQ(t.get(0, "run_id"), "b4-sgd-none-none");
  std::filesystem::remove_all(dir);
}

// After a --process-per-run child: a finished row counts even when SIGINT came right after it (the
// sweep used to leave it out of "ran" though results.csv holds it), an interrupted child without
// its row counts for nothing, and a crash without a row is recorded and counted.
TEST(ExperimentsSweep, AProcessPerRunChildCountsByTheRowItWrote) {
  const auto same = [](ChildVerdict a, ChildVerdict b) {
    return a.ran == b.ran && a.record_crash == b.record_crash && a.stop == b.stop;
  };
  EXPECT_TRUE(same(child_verdict(0, false, true), {.ran = true}));
  EXPECT_TRUE(same(child_verdict(0, true, true), {.ran = true, .stop = true})) << "finished, then SIGINT";
  EXPECT_TRUE(same(child_verdict(130, true, false), {.stop = true})) << "interrupted mid-run";
  EXPECT_TRUE(same(child_verdict(130, false, true), {.ran = true, .stop = true}));
  EXPECT_TRUE(same(child_verdict(139, false, false), {.ran = true, .record_crash = true})) << "a crash";
  EXPECT_TRUE(same(child_verdict(1, false, true), {.ran = true})) << "an error row the child wrote itself";
}

// The small CNN at 16 px under 24 MiB, for the maximum-batch searches below.
TrainConfig small_cnn_under_24mib() {
  TrainConfig c = testing::tiny_config();
  c.image_size = 16;
  c.memory_budget = "24MiB";
  return c;
}

// minidl-maxbatch answers from the dry run and confirms with one real trial; the search on real
// trials (what it falls back to) finds the same maximum and recovers from every OOM it meets.
TEST(ExperimentsMaxBatch, DryAnswerHoldsAndRealTrialsRecoverFromOoms) {
  const TrainConfig c = small_cnn_under_24mib();
  MaxBatchOptions o{.steps = 1, .effective_batch = 256};
  const int64_t allocated_before = memory_stats().allocated_bytes;
  const MaxBatchReport rep = run_maxbatch(c, o, false);
  const FinderResult& f = rep.finder;
  ASSERT_GT(f.max_batch, 8);
  EXPECT_TRUE(f.confirmed) << rep.text;
  EXPECT_EQ(f.trials.size(), 1u) << "one real trial";
  EXPECT_EQ(f.max_batch, f.dry_max_batch);
  EXPECT_EQ(f.at_max.peak_reserved, f.dry_at_max.peak_reserved) << "the dry run's peak is the real one";
  EXPECT_EQ(rep.recommended, recommended_batch(f.max_batch, 0.10));
  EXPECT_GE(rep.accumulation.effective(), 256);
  EXPECT_LE(rep.accumulation.micro_batch, rep.recommended);
  EXPECT_LE(f.at_max.peak_reserved, rep.budget_bytes);
  EXPECT_EQ(memory_stats().allocated_bytes, allocated_before) << "everything freed, budget removed";
  EXPECT_EQ(memory_stats().budget_bytes, 0);
  // Independently: the maximum survives and one more does not.
  StepRunner runner(c, rep.budget_bytes);
  EXPECT_TRUE(runner.run(f.max_batch, 1).ok);
  const Trial over = runner.run(f.max_batch + 1, 1);
  EXPECT_FALSE(over.ok);
  EXPECT_TRUE(over.recovered);
  // The search on real trials alone reaches the same answer through OOMs, each recovered.
  FinderOptions fo;
  fo.budget_bytes = rep.budget_bytes;
  const FinderResult real = find_max_batch([&](int64_t b) { return runner.run(b, 1); }, fo);
  EXPECT_EQ(real.max_batch, f.max_batch);
  EXPECT_GT(real.ooms, 0);
  EXPECT_TRUE(real.all_recovered);
}

// --confirm-next: the answer + 1 is tried on the device too, and runs out of memory, as the dry run
// said; the report says the answer was checked both ways.
TEST(ExperimentsMaxBatch, ConfirmNextChecksTheAnswerBothWays) {
  const MaxBatchReport rep = run_maxbatch(small_cnn_under_24mib(), {.steps = 1, .confirm_next = true}, false);
  const FinderResult& f = rep.finder;
  ASSERT_EQ(f.trials.size(), 2u) << rep.text;
  EXPECT_EQ(f.trials[0].first, f.dry_max_batch);
  EXPECT_TRUE(f.trials[0].second.ok);
  EXPECT_EQ(f.trials[1].first, f.dry_max_batch + 1);
  EXPECT_FALSE(f.trials[1].second.ok);
  EXPECT_TRUE(f.trials[1].second.recovered);
  EXPECT_TRUE(f.confirmed && f.next_tried && f.next_failed);
  EXPECT_EQ(f.max_batch, f.dry_max_batch);
  EXPECT_EQ(rep.json["real_next_failed"], true);
  EXPECT_NE(rep.text.find("checked both ways by real trials"), std::string::npos) << rep.text;
}

TEST(ExperimentsMaxBatch, FitBytesLeaveOutTheHostCache) {
  // The CPU allocator keeps freed blocks of 1 MiB and more for later requests (core/allocator.h)
  // and releases them before a request can fail, so what a batch needs is its live blocks: the
  // finder's fit bytes must not count the cache, which inside one step grows to up to 1.5x the live
  // peak. (Fitted on reserved, the finder's first prediction was 36% low.)
  TrainConfig c = testing::tiny_config();
  c.image_size = 64;   // the dense layer's 32768 x 128 weights and their gradient: 16 MiB blocks
  StepRunner runner(c, 0);
  const Trial t = runner.run(8, 2);
  ASSERT_TRUE(t.ok);
  EXPECT_GT(cpu_allocator().cached_bytes(), 0) << "the host cache holds the steps' large blocks";
  EXPECT_GT(t.peak_reserved, t.peak_allocated) << "reserved includes the cache";
  EXPECT_LE(t.fit_bytes(), t.peak_allocated) << "the fit counts live blocks only";
}

TEST(ExperimentsMaxBatch, SigintStopsTheSearchBetweenTrials) {
  // A sweep's deadline (python3 -m lab.gpulab studies) sends SIGINT: the search must not run on to its end.
  TrainConfig c = testing::tiny_config();
  c.memory_budget = "24MiB";
  MaxBatchOptions o;
  o.steps = 1;
  const int64_t allocated_before = memory_stats().allocated_bytes;
  request_stop();
  EXPECT_THROW(run_maxbatch(c, o, false), Interrupted);
  clear_stop();
  EXPECT_EQ(memory_stats().allocated_bytes, allocated_before) << "the trial runner freed everything";
  EXPECT_EQ(memory_stats().budget_bytes, 0) << "the budget is removed on the way out";
}

TEST(ExperimentsMaxBatch, AmpTrialsIncludeTheOptimizerState) {
  // The scaler skips the first steps of a ResNet (its f16 gradients overflow at 65536), and a
  // skipped step creates no momentum: trials measured then would fit a larger batch than a run in
  // its steady state can (ResNet-18 small at 16 px: 42.6 MiB of state measured instead of 85.3).
  TrainConfig c = testing::tiny_config();
  c.model = "resnet18-small";
  c.image_size = 16;
  c.momentum = 0.9;
  c.amp = true;
  StepRunner amp(c, 0);
  EXPECT_GE(amp.baseline_allocated(), 2 * amp.parameter_bytes())
      << "weights + momentum must be allocated before the AMP trials begin";
}

}  // namespace
}  // namespace minidl::harness

namespace minidl::harness {
namespace {

// summary.md's honesty: chance-level accuracies are marked (two binomial standard errors around
// 50%), missing values are '-', and the setting line names data, size, epochs and device.
TEST(ExperimentsSweep, SummaryMarksChanceAndSaysWhatRan) {
  EXPECT_EQ(accuracy_cell("0.5400", 400), "0.5400 (chance)") << "2 x sqrt(0.25 / 400) = 5 points";
  EXPECT_EQ(accuracy_cell("0.5600", 400), "0.5600");
  EXPECT_EQ(accuracy_cell("0.4500", 400), "0.4500 (chance)");
  EXPECT_EQ(accuracy_cell("0.9000", 20), "0.9000");
  EXPECT_EQ(accuracy_cell("", 400), "-");
  const Study quick = make_study("keras-batch", true, TrainConfig{});
  EXPECT_EQ(run_setting(quick, "cpu"), "synthetic images, 32 px, 3 epochs, cpu");
  TrainConfig photos;
  photos.data = "/photos";
  EXPECT_EQ(run_setting(make_study("keras-batch", false, photos), "cuda:0"), "photos in /photos, 200 px, 5 epochs, cuda:0");
  const std::string plan = study_plan(quick, {"b16-sgd-none-s0"});
  EXPECT_NE(plan.find("42 runs (1 already done, 41 to run)"), std::string::npos) << plan;
  EXPECT_NE(plan.find("batch 16,32,64,128,256"), std::string::npos) << plan;
}

}  // namespace
}  // namespace minidl::harness
