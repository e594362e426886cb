// Issue 19's check through the program itself: minidl-train's whole pipeline (class folders,
// split, loader, default --resize, model, loss, SGD) on eight real photos, from the golden's
// weights, must end its first step where torchvision does (tools/make_golden_e2e.py). The
// stage-by-stage comparison lives in tests/e2e/e2e_golden_test.cpp; this one catches a program
// default (a resize convention, a normalisation, an optimizer setting) drifting from it.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "train/run.h"
#include "nn/resnet.h"
#include "nn/safetensors.h"
#include "tests/experiments/helpers.h"
#include "tests/support/e2e_golden.h"

namespace minidl::harness {
namespace {

TEST(ExperimentsTrainGolden, OneSgdStepOnRealPhotosEndsWhereTorchvisionDoes) {
  if (!e2e::photos_present()) GTEST_SKIP() << e2e::kNoPhotos;
  const auto dir = testing::temp_dir();
  const auto photos = e2e::photo_folder();
  const auto& g = e2e::golden();
  Generator gen(0);
  const auto start = e2e::golden_weights_of(*nn::resnet18(2, &gen));
  nn::save_safetensors((dir / "w0.safetensors").string(), start);

  // The command: --model resnet18 --split 4,0,0 --no-shuffle --augment none --normalize
  // imagenet --workers 0 --image-size 64 --init-weights W0, one batch of 8, SGD lr 0.1.
  TrainConfig c;
  c.model = "resnet18";
  c.data = photos.string();
  c.split = "4,0,0";
  c.no_shuffle = true;
  c.augment = "none";
  c.normalize = "imagenet";
  c.workers = 0;
  c.image_size = e2e::kSize;
  c.init_weights = (dir / "w0.safetensors").string();
  c.batch_size = 8;
  c.epochs = 1;
  c.lr = 0.1;
  c.momentum = 0.0;
  c.weight_decay = 0.0;
  c.save_weights = (dir / "w1.safetensors").string();
  c.quiet = true;
  const RunResult r = run_training(c, {[](const std::string&) {}, {}, {}});
  ASSERT_EQ(r.status, "ok");
  ASSERT_EQ(r.epochs.size(), 1u);
  EXPECT_EQ(r.epochs[0].steps, 1);
  const double ref_loss = g.at("resnet18.loss").to_vector()[0];
  EXPECT_NEAR(r.epochs[0].train_loss, ref_loss, 1e-5 * std::abs(ref_loss)) << "training loss of the first step";

  const auto after = nn::load_safetensors(c.save_weights).tensors;
  for (const std::string key : {"conv1.weight", "bn1.weight", "bn1.bias", "layer1.0.bn1.bias", "layer3.1.bn1.bias",
                                "fc.weight", "fc.bias"}) {
    const auto got = after.at(key).to_vector();
    const auto ref = g.at("resnet18.sgd." + key).to_vector();
    ASSERT_EQ(got.size(), ref.size()) << key;
    double scale = 1e-30, err = 0;
    for (size_t i = 0; i < ref.size(); ++i) {
      scale = std::max(scale, std::abs(ref[i]));
      err = std::max(err, std::abs(got[i] - ref[i]));
    }
    EXPECT_LE(err / scale, 1e-4) << key << " after one SGD step: max |diff| " << err << " (relative " << err / scale << ")";
  }
  std::filesystem::remove_all(photos);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace minidl::harness
