// What a first-time user reads while runs go (issue 32): progress lines by time as well as by
// steps, memory labelled allocated and peak, ETAs that count evaluations and leave the warm-up
// out, study summaries and plots that say what ran and mark results at chance.
#include <gtest/gtest.h>

#include <fstream>

#include "train/eta.h"
#include "experiments/harness/results.h"
#include "experiments/harness/sweep.h"
#include "train/run.h"
#include "tests/experiments/helpers.h"

namespace minidl::harness {
namespace {

std::vector<std::string> progress_lines(TrainConfig c) {
  std::vector<std::string> lines;
  c.quiet = false;
  RunHooks hooks;
  hooks.log = [&](const std::string& l) {
    if (l.rfind("epoch ", 0) == 0 && l.find(" step ") != std::string::npos) lines.push_back(l);
  };
  EXPECT_EQ(run_training(c, hooks).status, "ok");
  return lines;
}

TEST(ExperimentsProgress, LinesComeByTimeAndSayWhichMemoryIsWhich) {
  TrainConfig c = testing::tiny_config();
  c.progress_every = 0;          // no lines by steps
  c.progress_seconds = 1e-9;     // so every step is "15 s" after the last line
  const auto lines = progress_lines(c);
  ASSERT_EQ(lines.size(), 4u) << "one line per optimizer step (32 images / batch 8)";
  EXPECT_NE(lines[0].find(" allocated, "), std::string::npos) << lines[0];
  EXPECT_NE(lines[0].find(" peak  ETA "), std::string::npos) << lines[0];
  c.progress_seconds = 0;
  EXPECT_TRUE(progress_lines(c).empty()) << "--progress-every 0 --progress-seconds 0: epoch lines only";
}

TEST(ExperimentsProgress, RunEtaCountsEvaluationsAndLeavesTheWarmUpOut) {
  RunEta eta(10, 2, 100, 100);   // 10 steps over 2 epochs; 100 validation and 100 test images
  eta.stepped(1, 5.0, 10);       // the first step pays 5 s of warm-up
  eta.stepped(2, 6.0, 20);
  eta.stepped(3, 7.0, 30);       // then 1 s per step of 10 images
  // 7 steps left at 1 s, and 2 validations + the test (300 images) at a third of 0.1 s per image.
  EXPECT_NEAR(eta.seconds_left(3, 1), 7.0 + 300 * 0.1 / 3, 1e-9);
  eta.evaluated(20.0, 100);      // the first validation: 0.2 s per image
  eta.stepped(4, 28.0, 40);      // 1 s of training after it: the evaluation is not training time
  EXPECT_NEAR(eta.seconds_left(4, 2), 6.0 + 200 * 0.2, 1e-9);
}

TEST(ExperimentsProgress, SweepEtaUsesEachSeriesRatePerImage) {
  struct Run {
    std::string group;
    TrainConfig config;
  };
  TrainConfig small = testing::tiny_config();   // 16/8/8 per class, 1 epoch: 32 + 16 + 16 images
  TrainConfig big = small;
  big.epochs = 3;                                // 3 x (32 + 16) + 16 images
  EXPECT_EQ(run_work(small), 64.0);
  EXPECT_EQ(run_work(big), 160.0);
  SweepEtaOf<Run> eta;
  const Run fast{"plain", small}, slow{"augmented", small}, slow_big{"augmented", big}, other{"new", big};
  EXPECT_EQ(eta.seconds_for({&fast}), 0.0) << "nothing finished: no ETA";
  eta.finished(fast, 6.4);    // 0.1 s per image
  eta.finished(slow, 19.2);   // 0.3 s per image
  EXPECT_NEAR(eta.seconds_for({&slow_big}), 160 * 0.3, 1e-9) << "its series' rate, its own work";
  EXPECT_NEAR(eta.seconds_for({&other}), 160 * 0.2, 1e-9) << "a series with no finished run: all runs' rate";
}

TEST(ExperimentsProgress, SummaryStatesDifficultyAndSeeds) {
  Study st;
  for (uint64_t seed : {1, 2, 3}) {
    SweepRun r;
    r.config = testing::tiny_config();
    r.config.synthetic_difficulty = 0.85;
    r.config.seed = seed;
    st.runs.push_back(r);
  }
  EXPECT_EQ(data_and_seeds(st), "synthetic difficulty 0.85, 3 seeds");
  st.runs.resize(1);
  st.runs[0].config.data = "/photos";
  EXPECT_EQ(data_and_seeds(st), "1 seed");
}

// CUDA graphs are the default on a CUDA device: the summary says the steps replay, in how many
// runs, and how many runs had a batch shape whose capture did not fit (from runs.jsonl's results).
TEST(ExperimentsProgress, SummarySaysWhetherTheStepsReplayedAndWhereTheyFellBack) {
  Study st;
  for (const std::string id : {"a", "b", "c"}) {
    SweepRun r;
    r.id = id;
    r.config = testing::tiny_config();
    r.config.device = "cuda";
    st.runs.push_back(r);
  }
  std::map<std::string, nlohmann::json> runs;
  runs["a"] = {{"id", "a"}, {"result", {{"graph_fallbacks", 0}}}};
  runs["b"] = {{"id", "b"}, {"result", {{"graph_fallbacks", 1}}}};
  EXPECT_EQ(steps_mode(st, runs),
            "replayed from CUDA graphs after an eager warm-up (partial batches and windows eagerly); in 1 run a "
            "batch shape's capture did not fit and its steps ran eagerly (results.json: "
            "graph_fallbacks)");
  st.runs[2].config.cuda_graphs = false;
  EXPECT_NE(steps_mode(st, {}).find("in 2 of 3 runs, eager in the others"), std::string::npos);
  for (SweepRun& r : st.runs) r.config.device = "cpu";
  EXPECT_EQ(steps_mode(st, runs), "eager");
}

TEST(ExperimentsProgress, AccuracyPlotsShadeTheChanceBandAndCircleThePointsInIt) {
  const auto dir = testing::temp_dir();
  PlotSpec spec;
  spec.series = {{"sgd", {{16, 0.5}, {32, 0.8}}, {}, 0}, {"adam", {{16, 0.56}, {32, 0.46}}, {}, 0}};
  spec.chance_band = 0.05;
  plot_png(spec, dir / "p.png");
  std::ifstream in(dir / "p.png.dat");
  const std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(s.find("band_lo=0.450000; band_hi=0.550000; chance_block=1\n"), std::string::npos) << s;
  EXPECT_NE(s.find("\"at chance (50% +- 5.0 points)\" \"y\"\n16.000000 0.500000\n32.000000 0.460000\n"),
            std::string::npos)
      << s;
  std::filesystem::remove_all(dir);
}

TEST(ExperimentsProgress, ChanceBandWithErrorBarsAndPublishedPoints) {
  // A study with seeds: mean lines with error bars, the published values as point sets, and the
  // chance band: the lines first, then the point sets, the lines' points at chance last (the
  // published ones are not circled), every row with its error column.
  const auto dir = testing::temp_dir();
  PlotSpec spec;
  spec.series = {{"published", {{16, 0.52}}, {}, 1}, {"sgd", {{16, 0.53}, {32, 0.8}}, {0.02, 0.01}, 0}};
  spec.chance_band = 0.05;
  plot_png(spec, dir / "p.png");
  std::ifstream in(dir / "p.png.dat");
  const std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_NE(s.find("errbars=1; nlines=1; pointcolors='1'; band_lo=0.450000; band_hi=0.550000; chance_block=1\n"),
            std::string::npos)
      << s;
  const size_t sgd = s.find("\"sgd\""), published = s.find("\"published\""), chance = s.find("\"at chance");
  EXPECT_LT(sgd, published) << s;
  EXPECT_LT(published, chance) << s;
  EXPECT_NE(s.find("\"at chance (50% +- 5.0 points)\" \"y\" \"error\"\n16.000000 0.530000 0.000000\n"),
            std::string::npos)
      << s;
  EXPECT_EQ(s.find("0.520000", chance), std::string::npos) << "a published value is not circled as at chance";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace minidl::harness
