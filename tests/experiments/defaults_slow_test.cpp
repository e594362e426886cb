// The first runs a newcomer makes: minidl-train's defaults (the small CNN at 200x200, SGD lr 0.01,
// batch 32) on the synthetic set and on the photos, for a few steps, under the default
// --diverge-loss. Before the Keras initialisation these stopped as "diverged" at step 1 or 2.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <numeric>

#include "train/run.h"

namespace minidl::train {
namespace {

// Each step's own training loss, from the progress lines' running epoch mean ("loss X"), which
// restarts with every epoch.
struct Steps {
  std::vector<double> loss;
  RunResult result;
};

Steps run_steps(TrainConfig c) {
  c.progress_every = 1;
  c.quiet = false;
  Steps out;
  int64_t epoch = 0;
  double prev = 0.0;   // running mean after the previous step of this epoch
  size_t in_epoch = 0;
  RunHooks hooks;
  hooks.log = [&](const std::string& line) {
    const auto at = line.find("  loss ");
    if (line.rfind("epoch ", 0) != 0 || line.find(" step ") == std::string::npos || at == std::string::npos) return;
    const int64_t e = std::stoll(line.substr(6));
    if (e != epoch) epoch = e, prev = 0.0, in_epoch = 0;
    const double running = std::stod(line.substr(at + 7));
    ++in_epoch;
    out.loss.push_back(static_cast<double>(in_epoch) * running - static_cast<double>(in_epoch - 1) * prev);
    prev = running;
  };
  out.result = run_training(c, hooks);
  EXPECT_EQ(out.result.status, "ok") << out.result.note;
  return out;
}

double mean(const std::vector<double>& v, size_t from, size_t to) {
  return std::accumulate(v.begin() + static_cast<std::ptrdiff_t>(from), v.begin() + static_cast<std::ptrdiff_t>(to), 0.0) /
         static_cast<double>(to - from);
}

// The newcomer's first run learns. Before the synthetic noise's std fell as 64/size above 64 px, the
// second step's loss jumped to about 10, the dense units died and the model sat at chance for all
// five epochs (loss ln 2 to four digits, validation 50%). Plain SGD at lr 0.01 needs about two
// epochs of the 1200 images to leave chance, so three epochs run here (a minute on 2 idle cores).
TEST(ExperimentsDefaults, SyntheticDefaultsLearn) {
  TrainConfig c;             // the defaults: smallcnn, 200x200 synthetic, sgd lr 0.01, batch 32
  c.split = "600,100,0";     // the default run's 1200 training images; a smaller validation split
  c.epochs = 3;
  const Steps s = run_steps(c);
  const std::vector<double>& l = s.loss;
  ASSERT_GE(l.size(), 100u);
  const double peak = *std::max_element(l.begin(), l.end());
  EXPECT_LT(peak, 2.5) << "the first steps' spike stays small (it reached ~10 before)";
  EXPECT_LT(mean(l, 15, 20), mean(l, 0, 5)) << "the loss falls within 20 steps";
  EXPECT_LT(mean(l, l.size() - 10, l.size()), std::log(2.0) - 0.15) << "far below chance level (ln 2) by the end";
  EXPECT_GE(s.result.best_val_acc, 0.8) << "validation accuracy after three epochs (NaN: none)";
}

TEST(ExperimentsDefaults, PhotoDefaultsLossFalls) {
  const std::filesystem::path photos = std::filesystem::path(MINIDL_SHARED_DATA_DIR) / "catsdogs";
  if (!std::filesystem::is_directory(photos)) GTEST_SKIP() << "no shared photos at " << photos.string();
  TrainConfig c;
  c.data = photos.string();
  c.split = "320,0,0";
  c.max_steps = 20;
  const std::vector<double> l = run_steps(c).loss;
  ASSERT_EQ(l.size(), 20u);
  EXPECT_LT(*std::max_element(l.begin(), l.end()), c.resolved_diverge_loss() / 2);
  EXPECT_LT(mean(l, 15, 20), mean(l, 0, 5)) << "the loss falls";
  EXPECT_LT(mean(l, 15, 20), 0.75);
}

}  // namespace
}  // namespace minidl::train
