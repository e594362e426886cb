// What a newcomer's first mistakes get: one line and exit status 2 that names the folder and the
// counts (one class, a class of unreadable files (more in unreadable_data_test.cpp), a split that
// empties a class, a file given as --data, an unwritable --manifest, an unknown --config key), no
// source location unless --verbose; '-' and empty fields, never nan or 0.00%, when a run has no
// validation split; and --save-initial-weights, the answer to "--max-steps 0 trains anyway".
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "experiments/harness/results.h"
#include "train/run.h"
#include "nn/safetensors.h"
#include "tests/experiments/helpers.h"
#include "tests/support/holds_all.h"

namespace minidl::harness {
namespace {

namespace fs = std::filesystem;

using ::minidl::testing::holds_all;
using testing::Outcome;
using testing::train;

fs::path photos() { return fs::path(MINIDL_SHARED_DATA_DIR) / "catsdogs"; }

#define NEED_PHOTOS_AND_TRAIN()                                                                    \
  if (!fs::exists(testing::program("minidl-train"))) GTEST_SKIP() << "minidl-train is not built"; \
  if (!fs::is_directory(photos())) GTEST_SKIP() << "no shared photos at " << photos().string()

// A class folder of `n` copies of real photos (cat.1.jpg, ...) and `bad` text files named .jpg.
void make_class(const fs::path& dir, const std::string& from, int n, int bad = 0) {
  fs::create_directories(dir);
  for (int i = 0; i < n; ++i)
    fs::copy_file(photos() / from / (from + "." + std::to_string(i + 1) + ".jpg"), dir / ("p" + std::to_string(i) + ".jpg"));
  for (int i = 0; i < bad; ++i) std::ofstream(dir / ("bad" + std::to_string(i) + ".jpg")) << "not an image";
}

TEST(ExperimentsInputs, OneClassIsRefusedWithTheClassCount) {
  NEED_PHOTOS_AND_TRAIN();
  const Outcome o = train("--data " + (photos() / "cat").string() + " --epochs 1");
  EXPECT_EQ(o.status, 2) << o.output;
  EXPECT_TRUE(holds_all(o.output, {"1 class (cat 1000)", "at least two classes"}));
}

TEST(ExperimentsInputs, AClassOfUnreadableFilesIsRefusedAfterValidation) {
  NEED_PHOTOS_AND_TRAIN();
  const fs::path root = testing::temp_dir();
  make_class(root / "cat", "cat", 3);
  make_class(root / "dog", "dog", 0, 2);
  const std::string common = " --data " + root.string() + " --split 1,0,0 --image-size 8 --max-steps 1 --workers 0";
  const Outcome o = train(common + " --validate-data");
  EXPECT_EQ(o.status, 2) << o.output;
  EXPECT_NE(o.output.find("class 'dog' has no usable images (usable / files: cat 3 / 3, dog 0 / 2; "
                          "2 unreadable files skipped)"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find(root.string()), std::string::npos) << "names the folder: " << o.output;
  // Without --validate-data the header scan finds them too (issue 30): the same refusal.
  const Outcome plain = train(common);
  EXPECT_EQ(plain.status, 2) << plain.output;
  EXPECT_NE(plain.output.find("class 'dog' has no usable images"), std::string::npos) << plain.output;
}

TEST(ExperimentsInputs, ValidatedRunsCountUsableImagesOnly) {
  NEED_PHOTOS_AND_TRAIN();
  const fs::path root = testing::temp_dir();
  make_class(root / "cat", "cat", 3, 1);
  make_class(root / "dog", "dog", 3, 2);
  const Outcome o = train("--data " + root.string() + " --split 2,0,1 --image-size 8 --max-steps 1 --workers 0 "
                          "--batch-size 4 --validate-data");
  EXPECT_EQ(o.status, 0) << o.output;
  EXPECT_NE(o.output.find("(6 usable images, 3 unreadable files skipped)"), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("unreadable (skipped by the loader): 3"), std::string::npos) << "the report: " << o.output;
}

TEST(ExperimentsInputs, ASplitThatEmptiesAClassIsRefused) {
  NEED_PHOTOS_AND_TRAIN();
  const fs::path root = testing::temp_dir();
  make_class(root / "cat", "cat", 12);
  make_class(root / "dog", "dog", 2);
  const Outcome o = train("--data " + root.string() + " --split 0.6,0.2,0.2 --image-size 8 --max-steps 1 --workers 0");
  EXPECT_EQ(o.status, 2) << o.output;
  EXPECT_NE(o.output.find("leaves class 'dog' without"), std::string::npos) << o.output;
}

TEST(ExperimentsInputs, ErrorLinesNameTheProblemWithoutSourceLocations) {
  NEED_PHOTOS_AND_TRAIN();
  const std::string too_many = "--data " + photos().string() + " --split 2000,0,0";
  const Outcome o = train(too_many);
  EXPECT_EQ(o.status, 2);
  EXPECT_NE(o.output.find("class 'cat' has 1000 samples"), std::string::npos) << o.output;
  EXPECT_EQ(o.output.find(".cpp:"), std::string::npos) << "no source location: " << o.output;
  EXPECT_NE(train(too_many + " --verbose").output.find("[data/split.cpp:"), std::string::npos) << "kept with --verbose";

  const Outcome file = train("--data " + (photos() / "cat" / "cat.1.jpg").string());
  EXPECT_EQ(file.status, 2);
  EXPECT_NE(file.output.find("is a file"), std::string::npos) << file.output;

  const Outcome manifest = train("--data " + photos().string() + " --manifest /no/such/folder/m.txt --max-steps 1");
  EXPECT_EQ(manifest.status, 2) << manifest.output;
  EXPECT_NE(manifest.output.find("--manifest '/no/such/folder/m.txt' cannot be written"), std::string::npos)
      << manifest.output;
}

TEST(ExperimentsInputs, AnUnknownConfigKeyIsNamedWithItsFile) {
  if (!fs::exists(testing::program("minidl-train"))) GTEST_SKIP() << "minidl-train is not built";
  const fs::path cfg = testing::temp_dir() / "run.toml";
  std::ofstream(cfg) << "batch-size = 8\nbatchsize = 16\n";
  const Outcome o = train("--config " + cfg.string());
  EXPECT_EQ(o.status, 2);
  EXPECT_NE(o.output.find("--config " + cfg.string() + ": unknown key 'batchsize'"), std::string::npos) << o.output;
}

TEST(ExperimentsInputs, NoValidationSplitShowsDashesAndEmptyFields) {
  TrainConfig c = testing::tiny_config();
  c.split = "16,0,8";
  const RunResult r = run_training(c, {[](const std::string&) {}, {}, {}});
  EXPECT_EQ(r.status, "ok");
  EXPECT_TRUE(std::isnan(r.best_val_acc));
  EXPECT_EQ(r.best_epoch, 0);
  const std::string csv = epochs_csv(r.epochs);
  const std::string row = csv.substr(csv.find('\n') + 1);
  EXPECT_EQ(row.find("nan"), std::string::npos) << row;
  EXPECT_NE(row.find(",,"), std::string::npos) << "empty val_loss and val_acc: " << row;
  const nlohmann::json j = to_json(r);
  EXPECT_TRUE(j["best_val_acc"].is_null());
  EXPECT_TRUE(j["best_epoch"].is_null());
  EXPECT_TRUE(j["epochs"][0]["val_acc"].is_null());
  EXPECT_EQ(value_or_dash(r.best_val_acc, 2, 100.0, "%"), "-");
  EXPECT_EQ(value_or_dash(0.5, 2, 100.0, "%"), "50.00%");
  if (fs::exists(testing::program("minidl-train"))) {
    const Outcome o = train("--model smallcnn --image-size 8 --split 16,0,8 --epochs 1 --batch-size 8");
    EXPECT_TRUE(holds_all(o.output, {"val loss -  val acc -", "best val acc - (epoch -)"}));
    EXPECT_EQ(o.output.find("nan"), std::string::npos) << o.output;
  }
}

TEST(ExperimentsInputs, SaveInitialWeightsKeepsTheUntrainedModel) {
  const fs::path dir = testing::temp_dir();
  TrainConfig c = testing::tiny_config();
  c.max_steps = 2;
  c.save_initial_weights = (dir / "w0.safetensors").string();
  c.save_weights = (dir / "w2.safetensors").string();
  ASSERT_EQ(run_training(c, {[](const std::string&) {}, {}, {}}).steps, 2);
  const auto w0 = nn::load_safetensors(c.save_initial_weights).tensors;
  const auto w2 = nn::load_safetensors(c.save_weights).tensors;
  ASSERT_EQ(w0.size(), w2.size());
  EXPECT_NE(w0.at("fc1.weight").to_vector(), w2.at("fc1.weight").to_vector()) << "two steps changed it";
  // Started again from the saved initial weights, the run takes the same two steps.
  TrainConfig again = c;
  again.init_weights = c.save_initial_weights;
  again.save_initial_weights = (dir / "w0b.safetensors").string();
  again.save_weights = (dir / "w2b.safetensors").string();
  run_training(again, {[](const std::string&) {}, {}, {}});
  EXPECT_EQ(nn::load_safetensors(again.save_initial_weights).tensors.at("fc1.weight").to_vector(),
            w0.at("fc1.weight").to_vector());
  EXPECT_EQ(nn::load_safetensors(again.save_weights).tensors.at("fc1.weight").to_vector(),
            w2.at("fc1.weight").to_vector());
  TrainConfig both = c;
  both.resume = c.save_weights;
  EXPECT_THROW(validate(both), UsageError);
}

}  // namespace
}  // namespace minidl::harness
