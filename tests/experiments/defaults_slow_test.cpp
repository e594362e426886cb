// The first runs a newcomer makes: minidl-train's defaults (the small CNN at 200x200, SGD lr 0.01,
// batch 32) on the synthetic set and on the photos, for a few steps, under the default
// --diverge-loss. Before the Keras initialisation these stopped as "diverged" at step 1 or 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>

#include "experiments/harness/train.h"

namespace minidl::harness {
namespace {

// Each step's own training loss, from the progress lines' running epoch mean ("loss X").
std::vector<double> step_losses(TrainConfig c) {
  c.progress_every = 1;
  c.quiet = false;
  std::vector<double> running;
  RunHooks hooks;
  hooks.log = [&](const std::string& line) {
    const auto at = line.find("  loss ");
    if (line.rfind("epoch", 0) == 0 && line.find(" step ") != std::string::npos && at != std::string::npos)
      running.push_back(std::stod(line.substr(at + 7)));
  };
  const RunResult r = run_training(c, hooks);
  EXPECT_EQ(r.status, "ok") << r.note;
  std::vector<double> own;
  for (size_t k = 0; k < running.size(); ++k)
    own.push_back(k == 0 ? running[0] : static_cast<double>(k + 1) * running[k] - static_cast<double>(k) * running[k - 1]);
  return own;
}

double mean(const std::vector<double>& v, size_t from, size_t to) {
  return std::accumulate(v.begin() + static_cast<std::ptrdiff_t>(from), v.begin() + static_cast<std::ptrdiff_t>(to), 0.0) /
         static_cast<double>(to - from);
}

TEST(ExperimentsDefaults, SyntheticDefaultsRunUnderTheDefaultDivergeLoss) {
  TrainConfig c;             // the defaults: smallcnn, 200x200 synthetic, sgd lr 0.01, batch 32
  c.split = "320,0,0";       // only the 640 training images that 20 steps read
  c.max_steps = 20;
  const std::vector<double> l = step_losses(c);
  ASSERT_EQ(l.size(), 20u);
  const double peak = *std::max_element(l.begin(), l.end());
  EXPECT_LT(peak, c.diverge_loss / 2) << "the first steps' spike stays well inside the safety net";
  // After the spike the loss is back at (or below) chance level, ln 2, and stays there.
  EXPECT_LT(mean(l, 10, 20), std::log(2.0) + 0.02);
  EXPECT_LT(mean(l, 10, 20), peak / 5);
}

TEST(ExperimentsDefaults, PhotoDefaultsLossFalls) {
  const std::filesystem::path photos = std::filesystem::path(MINIDL_SHARED_DATA_DIR) / "catsdogs";
  if (!std::filesystem::is_directory(photos)) GTEST_SKIP() << "no shared photos at " << photos.string();
  TrainConfig c;
  c.data = photos.string();
  c.split = "320,0,0";
  c.max_steps = 20;
  const std::vector<double> l = step_losses(c);
  ASSERT_EQ(l.size(), 20u);
  EXPECT_LT(*std::max_element(l.begin(), l.end()), c.diverge_loss / 2);
  EXPECT_LT(mean(l, 15, 20), mean(l, 0, 5)) << "the loss falls";
  EXPECT_LT(mean(l, 15, 20), 0.75);
}

}  // namespace
}  // namespace minidl::harness
