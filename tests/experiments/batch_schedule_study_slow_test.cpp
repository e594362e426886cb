// The quick batch-schedule study end to end through minidl-sweep (about half a minute on 2 idle
// cores, nine runs): its table, its two plots' data and its summary with the means and the
// published claim, and the parameter updates each variant makes by construction.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "experiments/harness/results.h"
#include "tests/experiments/helpers.h"

namespace minidl::harness {
namespace {

TEST(ExperimentsBatchScheduleStudy, QuickStudyWritesItsTablePlotsAndSummary) {
  const auto dir = testing::temp_dir();
  ASSERT_EQ(testing::run_status(testing::program("minidl-sweep").string() +
                                " --study batch-schedule --quick --quiet --out " + dir.string()),
            0);
  const auto out = dir / "batch-schedule-quick-cpu";
  const CsvTable t = read_csv(out / "results.csv");
  ASSERT_EQ(t.rows.size(), 9u);
  std::map<std::string, std::string> steps;
  for (size_t i = 0; i < t.rows.size(); ++i) {
    EXPECT_EQ(t.get(i, "status"), "ok") << t.get(i, "run_id") << ": " << t.get(i, "note");
    steps[t.get(i, "run_id")] = t.get(i, "steps");
    EXPECT_FALSE(t.get(i, "train_seconds").empty());
  }
  // 1024 training images, 18 epochs in thirds: 64 steps per epoch at 16, 16 at 64, 4 at 256.
  EXPECT_EQ(steps["decay-lr-s0"], "1152");
  EXPECT_EQ(steps["grow-batch-s0"], "504");
  EXPECT_EQ(steps["hybrid-s0"], "576");
  EXPECT_EQ(t.get(1, "batch_schedule"), "x4@6,12");
  const std::string phases = t.get(1, "images_per_s_phases");
  EXPECT_EQ(phases.substr(0, 4), "16: ") << phases;
  EXPECT_EQ(std::count(phases.begin(), phases.end(), ';'), 2) << "one rate per phase: " << phases;
  for (const char* axis : {"updates", "time"}) {
    const std::string dat = testing::read_text(out / ("batch-schedule-" + std::string(axis) + ".png.dat"));
    EXPECT_EQ(dat.rfind("# plot: ", 0), 0u) << axis;
    EXPECT_NE(dat.find("\"(a) fixed batch, lr decay\""), std::string::npos) << axis;
    EXPECT_NE(dat.find("\"(b) batch grows, lr kept\""), std::string::npos) << axis;
    EXPECT_NE(dat.find("\"(c) batch grows, then lr decay\""), std::string::npos) << axis;
  }
  const std::string md = testing::read_text(out / "summary.md");
  EXPECT_NE(md.find("| (b) batch grows, lr kept | 3 |"), std::string::npos) << md;
  EXPECT_NE(md.find("| 504 | 44% |"), std::string::npos) << "updates against the decaying run\n" << md;
  EXPECT_NE(md.find("arXiv:1711.00489"), std::string::npos) << "the published claim beside it";
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace minidl::harness
