// From photo file to weight update against PyTorch (issue 19), stage by stage, so a failure names
// the first stage that differs: decoded pixels, the resize/crop of each --resize setting, the
// normalised batch the loader assembles, logits, loss, gradients, and the weights after one SGD
// and one Adam step, and a bf16 autocast step. The reference is tests/golden/e2e/e2e.safetensors from
// tools/make_golden_e2e.py (Pillow, torchvision, torch); the script's header says what each entry
// is. Real photos come from ../shared/data/catsdogs and the golden keeps only hashes and samples
// of their pixels; the format files (grayscale, CMYK, progressive, PNG kinds) are committed.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <map>
#include <optional>
#include <sstream>
#include <string>
#include <unistd.h>
#include <vector>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/generator.h"
#include "core/ops.h"
#include "data/dataset.h"
#include "data/decode.h"
#include "data/loader.h"
#include "data/transform.h"
#include "nn/keras_cnn.h"
#include "nn/resnet.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "tests/support/e2e_golden.h"
#include "tests/support/golden_weights.h"

namespace minidl::e2e {
namespace {

namespace fs = std::filesystem;

// Tolerances relative to the largest magnitude of each reference (tools/make_golden_e2e.py's TOL,
// which also checks that PyTorch's own float32 stays within a tenth of them).
constexpr double kLogits = 1e-4, kLoss = 1e-5, kGrad = 2e-3, kStep = 1e-4, kRunning = 1e-4;

void expect_close(const Tensor& got, const Tensor& ref, double tol, const std::string& stage) {
  ASSERT_EQ(got.numel(), ref.numel()) << stage << ": " << shape_str(got.shape()) << " vs " << shape_str(ref.shape());
  const auto g = got.to_vector();
  const auto r = ref.to_vector();
  double scale = 1e-30, err = 0;
  size_t at = 0;
  for (size_t i = 0; i < r.size(); ++i) {
    scale = std::max(scale, std::abs(r[i]));
    if (std::abs(g[i] - r[i]) > err) err = std::abs(g[i] - r[i]), at = i;
  }
  EXPECT_LE(err / scale, tol) << "stage '" << stage << "' differs from PyTorch: max |diff| " << err << " at element "
                              << at << " (minidl " << g[at] << ", PyTorch " << r[at] << "), relative "
                              << err / scale;
}

// The transform of one --resize setting (docs/data.md, "Resizing").
data::TransformOptions setting_options(const std::string& setting) {
  data::TransformOptions t;
  t.size = kSize;
  t.augment = data::Augment::None;
  if (setting == "imagenet") t.resize = data::imagenet_resize(kSize);
  if (setting == "squash" || setting == "keras") t.fit = data::Fit::Squash;
  if (setting == "keras") t.interpolation = data::Interpolation::Nearest;
  return t;
}

TEST(E2eGolden, FormatFilesDecodeAsPillow) {
  const Golden& g = golden();
  int files = 0;
  for (const auto& [key, t] : g.tensors) {
    const std::string prefix = "decoded.formats/";
    if (key.rfind(prefix, 0) != 0 || key.size() < 7 || key.compare(key.size() - 6, 6, ".shape") != 0) continue;
    const std::string name = key.substr(prefix.size(), key.size() - prefix.size() - 6);
    SCOPED_TRACE(name);
    const data::DecodeResult r = data::decode_file(golden_dir() / "formats" / name);
    ASSERT_TRUE(r.ok()) << name << ": " << r.error;
    expect_image(g, "decoded.formats/" + name, *r.image);
    ++files;
  }
  EXPECT_GE(files, 8) << "the golden lists the format files; was tools/make_golden_e2e.py run?";
}

TEST(E2eGolden, PhotosDecodeAsPillow) {
  if (!photos_present()) GTEST_SKIP() << kNoPhotos;
  for (const std::string& rel : photo_list()) {
    SCOPED_TRACE(rel);
    const data::DecodeResult r = data::decode_file(photos_dir() / rel);
    ASSERT_TRUE(r.ok()) << rel << ": " << r.error;
    expect_image(golden(), "decoded." + rel, *r.image);
  }
}

TEST(E2eGolden, EveryResizeSettingMatchesTorchvisionOrKeras) {
  if (!photos_present()) GTEST_SKIP() << kNoPhotos;
  for (const std::string setting : {"center", "imagenet", "squash", "keras"}) {
    const data::TransformOptions t = setting_options(setting);
    for (const std::string& rel : photo_list()) {
      SCOPED_TRACE(setting + " " + rel);
      const data::DecodeResult r = data::decode_file(photos_dir() / rel);
      ASSERT_TRUE(r.ok()) << r.error;
      const data::Image base = data::make_base(*r.image, t);
      data::Image out{kSize, kSize, std::vector<uint8_t>(static_cast<size_t>(kSize * kSize * 3))};
      data::apply_transform(base, t, 0, 0, out.pixels.data());
      expect_image(golden(), setting + "." + rel, out);
    }
  }
}

// The loader's batch of the eight photos under one --resize setting (ImageNet normalisation or not).
std::optional<data::Batch> photo_batch(const std::string& setting, bool imagenet) {
  const fs::path folder = photo_folder();
  data::LoaderOptions o;
  o.batch_size = 8;
  o.workers = 0;
  o.shuffle = false;
  o.transform = setting_options(setting);
  o.transform.normalize = imagenet;
  data::Loader loader(data::open_image_folder(folder), o);
  loader.start_epoch(0);
  std::optional<data::Batch> batch = loader.next();
  fs::remove_all(folder);
  return batch;
}

// One training step of `model` on the loader's batch of the eight photos, compared stage by stage
// with the golden entries "<name>.*"; `loss_of` is the model's loss on (logits, labels).
template <typename LossFn>
void expect_step_as_torch(nn::Module& model, const std::string& name, const std::string& setting, bool imagenet,
                          const std::vector<std::string>& keys, LossFn loss_of) {
  const Golden& g = golden();
  const std::optional<data::Batch> batch = photo_batch(setting, imagenet);
  ASSERT_TRUE(batch.has_value());
  expect_close(batch->labels, g.at("labels"), 0, "labels (class folders cat, dog)");
  expect_close(mean(batch->images, {2, 3}), g.at("input." + name + ".mean"), 1e-6, "normalised batch (channel means)");
  if (::testing::Test::HasFailure()) return;  // the later stages would only repeat it

  const auto start = golden_weights_of(model);
  model.load_state_dict(start);
  model.train();
  const Tensor logits = model(batch->images);
  const Tensor loss = loss_of(logits, batch->labels);
  loss.backward();
  expect_close(logits, g.at(name + ".logits"), kLogits, "logits");
  expect_close(loss.reshape({1}), g.at(name + ".loss"), kLoss, "loss");
  std::map<std::string, Tensor> params;
  for (const auto& [k, p] : model.named_parameters()) params[k] = p;
  for (const std::string& k : keys) expect_close(params.at(k).grad(), g.at(name + ".grad." + k), kGrad, "gradient of " + k);
  if (name == "resnet18") {
    expect_close(model.state_dict().at("bn1.running_mean"), g.at(name + ".running_mean.bn1"), kRunning,
                 "bn1 running mean after the forward");
  }
  std::vector<Tensor> all;
  for (const auto& [k, p] : model.named_parameters()) all.push_back(p);
  {
    optim::SGD sgd(all, {.lr = 0.1});
    sgd.step();
    for (const std::string& k : keys) expect_close(params.at(k), g.at(name + ".sgd." + k), kStep, "SGD step of " + k);
  }
  // Adam from the same start and the same gradients.
  {
    NoGradGuard no_grad;
    for (const auto& [k, p] : model.named_parameters()) params.at(k).copy_(start.at(k));
  }
  optim::Adam adam(all, {.lr = 1e-3});
  adam.step();
  for (const std::string& k : keys) expect_close(params.at(k), g.at(name + ".adam." + k), kStep, "Adam step of " + k);
}

TEST(E2eGolden, ResNet18TrainingStepOnPhotosMatchesTorch) {
  if (!photos_present()) GTEST_SKIP() << kNoPhotos;
  Generator gen(0);
  auto model = nn::resnet18(2, &gen);
  expect_step_as_torch(*model, "resnet18", "center", true,
                       {"conv1.weight", "bn1.weight", "bn1.bias", "layer1.0.bn1.bias", "layer3.1.bn1.bias", "fc.weight",
                        "fc.bias"},
                       [](const Tensor& logits, const Tensor& labels) { return cross_entropy(logits, labels); });
}

// --amp bf16's step against torch.autocast("cpu", dtype=torch.bfloat16) on the same photos and
// weights (the golden's "resnet18.bf16.*"): bf16 logits, and the logits, the loss and the
// gradients as close to PyTorch's bf16 step as minidl's own f32 step is, within half as much
// again: what is left is where each library rounds to bf16.
TEST(E2eGolden, ResNet18Bf16AutocastStepOnPhotosMatchesTorch) {
  if (!photos_present()) GTEST_SKIP() << kNoPhotos;
  const Golden& g = golden();
  const std::optional<data::Batch> batch = photo_batch("center", true);
  ASSERT_TRUE(batch.has_value());
  const std::vector<std::string> keys{"conv1.weight", "bn1.weight", "bn1.bias", "layer1.0.bn1.bias",
                                      "layer3.1.bn1.bias", "fc.weight", "fc.bias"};
  const auto step = [&](bool bf16) {
    Generator gen(0);
    auto model = nn::resnet18(2, &gen);
    model->load_state_dict(golden_weights_of(*model));
    model->train();
    Tensor logits;
    {
      AutocastGuard autocast(DType::bf16, bf16);
      logits = (*model)(batch->images);
    }
    EXPECT_EQ(logits.dtype(), bf16 ? DType::bf16 : DType::f32);
    const Tensor loss = cross_entropy(logits.to(DType::f32), batch->labels);
    loss.backward();
    std::map<std::string, Tensor> out{{"logits", logits.to(DType::f32)}, {"loss", loss.reshape({1})}};
    std::map<std::string, Tensor> params;
    for (const auto& [k, p] : model->named_parameters()) params[k] = p;
    for (const std::string& k : keys) out["grad." + k] = params.at(k).grad();
    return out;
  };
  const auto ours = step(true), f32 = step(false);
  const auto rel = [&](const Tensor& got, const std::string& key) {
    const Tensor ref = g.at("resnet18.bf16." + key).to(DType::f64);
    return max(abs(got.to(DType::f64) - ref)).item() / std::max(1e-30, max(abs(ref)).item());
  };
  // bf16 keeps 8 significant bits: through 18 layers the two libraries' roundings, made at other
  // points, leave the gradients up to about 40% apart at their largest element (logits about 2%),
  // as far as exact f32 arithmetic lands from PyTorch's bf16 step. A wrong op list or a bf16
  // statistic would land much further; an f32 run is caught by the dtype above.
  for (const auto& [key, t] : ours) {
    const double got = rel(t, key), floor = rel(f32.at(key), key);
    EXPECT_LE(got, 1.5 * floor + 1e-6) << "stage '" << key << "': minidl's bf16 step is " << got
                                       << " from PyTorch's bf16 step, its f32 step " << floor;
  }
}

TEST(E2eGolden, KerasSmallCnnTrainingStepOnPhotosMatchesTorch) {
  if (!photos_present()) GTEST_SKIP() << kNoPhotos;
  Generator gen(0);
  nn::KerasSmallCnn model(kSize, &gen);
  expect_step_as_torch(model, "smallcnn", "keras", false, {"conv.weight", "conv.bias", "fc2.weight", "fc2.bias"},
                       [](const Tensor& logits, const Tensor& labels) {
                         return binary_cross_entropy_with_logits(logits, labels.to(DType::f32).reshape({-1, 1}));
                       });
}

}  // namespace
}  // namespace minidl::e2e
