// ResNets must be torchvision's models in all but implementation: these tests pin parameter counts,
// state_dict keys/shapes/dtypes (tests/golden/nn/resnet_keys.json), and logits, a train step's
// gradients and running statistics under deterministic weights (resnet_forward.safetensors), both
// written by tools/make_golden_resnet.py. ResNet-50's train step is compared in float64, where a
// ReLU input that float32 cannot resolve no longer decides the outcome.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "core/autograd.h"
#include "core/ops.h"
#include "nn/resnet.h"
#include "nn/safetensors.h"
#include "tests/support/golden_weights.h"
#include "tests/support/safetensors_reader.h"

namespace minidl::nn {
namespace {

using minidl::testing::golden_weights;
using minidl::testing::hash_unit;

using nlohmann::json;

std::shared_ptr<ResNet> build(const std::string& name, Generator* gen) {
  if (name == "resnet18") return resnet18(1000, gen);
  if (name == "resnet34") return resnet34(1000, gen);
  return resnet50(1000, gen);
}

TEST(ResNetTest, ParameterCountsMatchTorchvision) {
  Generator gen(1);
  EXPECT_EQ(resnet18(1000, &gen)->num_parameters(), 11689512);
  EXPECT_EQ(resnet34(1000, &gen)->num_parameters(), 21797672);
  EXPECT_EQ(resnet50(1000, &gen)->num_parameters(), 25557032);
  // small_input only shrinks the stem: 64*3*(49-9) fewer weights.
  EXPECT_EQ(resnet18(1000, &gen, false, true)->num_parameters(), 11689512 - 64 * 3 * 40);
}

TEST(ResNetTest, StateDictMatchesTorchvisionKeys) {
  std::ifstream f(testing::golden_path("nn/resnet_keys.json"));
  ASSERT_TRUE(f.good()) << "missing tests/golden/nn/resnet_keys.json: run tools/make_golden_resnet.py";
  const json golden = json::parse(f);
  Generator gen(2);
  for (const char* name : {"resnet18", "resnet34", "resnet50"}) {
    SCOPED_TRACE(name);
    auto model = build(name, &gen);
    const json& ref = golden.at(name);
    EXPECT_EQ(model->num_parameters(), ref.at("num_parameters").get<int64_t>());
    const auto mine = model->ordered_state_dict();
    const json& keys = ref.at("state_dict");
    ASSERT_EQ(mine.size(), keys.size());
    for (size_t i = 0; i < mine.size(); ++i) {
      const json& e = keys[i];
      ASSERT_EQ(mine[i].first, e.at("key").get<std::string>()) << "entry " << i;  // same order too
      EXPECT_EQ(mine[i].second.shape(), e.at("shape").get<Shape>()) << mine[i].first;
      EXPECT_EQ(dtype_name(mine[i].second.dtype()), e.at("dtype").get<std::string>()) << mine[i].first;
    }
  }
}

TEST(ResNetTest, ForwardShapesAndBottleneckStride) {
  Generator gen(3);
  NoGradGuard no_grad;
  auto r18 = resnet18(10, &gen);
  r18->eval();
  EXPECT_EQ((*r18)(randn({1, 3, 64, 64}, {}, &gen)).shape(), (Shape{1, 10}));
  auto small = resnet18(7, &gen, false, true);
  EXPECT_EQ((*small)(randn({2, 3, 32, 32}, {}, &gen)).shape(), (Shape{2, 7}));
  auto r50 = resnet50(5, &gen);
  r50->eval();
  EXPECT_EQ((*r50)(randn({1, 3, 32, 32}, {}, &gen)).shape(), (Shape{1, 5}));
  // v1.5: the stride sits on the 3x3 of the first bottleneck of layer2..4.
  auto block = r50->stage(2)->named_children()[0].second;
  auto conv1 = std::dynamic_pointer_cast<Conv2d>(block->child("conv1"));
  auto conv2 = std::dynamic_pointer_cast<Conv2d>(block->child("conv2"));
  ASSERT_TRUE(conv1 && conv2);
  EXPECT_EQ(conv1->options().stride[0], 1);
  EXPECT_EQ(conv2->options().stride[0], 2);
  auto ds = std::dynamic_pointer_cast<Sequential>(block->child("downsample"));
  ASSERT_TRUE(ds);
  EXPECT_EQ((*ds)[0]->type_name(), "Conv2d");
  EXPECT_EQ((*ds)[1]->type_name(), "BatchNorm2d");
}

TEST(ResNetTest, InitialisationAsTorchvision) {
  Generator gen(4);
  auto model = resnet18(10, &gen, /*zero_init_residual=*/true);
  const auto sd = model->state_dict();
  // Kaiming normal, fan_out, ReLU gain: std sqrt(2 / (out * k * k)).
  const Tensor w = sd.at("layer3.0.conv1.weight");
  EXPECT_NEAR(std::sqrt(mean(square(w)).item()), std::sqrt(2.0 / (256 * 9)), 0.02 * std::sqrt(2.0 / (256 * 9)));
  EXPECT_EQ(max(abs(sd.at("layer1.0.bn2.weight"))).item(), 0.0);
  EXPECT_EQ(max(abs(sd.at("layer4.1.bn2.weight"))).item(), 0.0);
  EXPECT_EQ(min(sd.at("layer1.0.bn1.weight")).item(), 1.0);
  EXPECT_EQ(max(abs(sd.at("bn1.bias"))).item(), 0.0);
  EXPECT_LE(max(abs(sd.at("fc.weight"))).item(), 1.0 / std::sqrt(512.0));
}

TEST(ResNetTest, ChainAndStagesComposeToForward) {
  Generator gen(5);
  auto model = resnet18(10, &gen, false, true);
  model->eval();
  NoGradGuard no_grad;
  const Tensor x = randn({1, 3, 32, 32}, {}, &gen);
  const Tensor ref = (*model)(x);
  const auto stages = model->stages();
  ASSERT_EQ(stages.size(), 6u);
  EXPECT_EQ(stages[0].name, "stem");
  EXPECT_EQ(stages[5].name, "head");
  const auto links = model->chain();
  ASSERT_EQ(links.size(), 10u);  // stem, 8 blocks, head
  EXPECT_EQ(links[1].name, "layer1.0");
  Tensor h = x;
  for (const auto& link : links) h = link.run(h);
  EXPECT_TRUE(allclose(h, ref, 0, 0));
}

TEST(ResNetTest, TrainingStepReducesLoss) {
  Generator gen(6);
  auto model = resnet18(10, &gen, false, true);
  model->train();
  const Tensor x = randn({4, 3, 32, 32}, {}, &gen);
  const Tensor y = from_vector({1, 3, 5, 7}, {4}, {.dtype = DType::i64});
  std::vector<double> losses;
  for (int step = 0; step < 4; ++step) {
    model->zero_grad();
    Tensor loss = cross_entropy((*model)(x), y);
    losses.push_back(loss.item());
    loss.backward();
    NoGradGuard no_grad;
    for (Tensor& p : model->parameters()) p.add_(p.grad(), -0.05);
  }
  EXPECT_LT(losses.back(), losses.front() * 0.8) << losses.front() << " -> " << losses.back();
  EXPECT_EQ(model->state_dict().at("bn1.num_batches_tracked").item<int64_t>(), 4);
}

TEST(ResNetTest, SummaryOfSmallResNet) {
  Generator gen(7);
  auto model = resnet18(10, &gen, false, true);
  const Summary s = model->summary({8, 3, 32, 32});
  ASSERT_FALSE(s.rows.empty());
  EXPECT_EQ(s.rows.front().name, "conv1");
  EXPECT_EQ(s.rows.front().output_shape, (Shape{1, 64, 32, 32}));
  EXPECT_EQ(s.rows.front().saved_bytes_per_sample, 3 * 32 * 32 * 4);  // conv1 saves the image
  // stem 3, 8 blocks of 6 calls (the shared ReLU twice), 3 downsample pairs, avgpool, fc.
  EXPECT_EQ(s.rows.size(), 3u + 8 * 6 + 3 * 2 + 2);
  EXPECT_EQ(s.rows.back().name, "fc");
  EXPECT_EQ(s.rows.back().output_shape, (Shape{1, 10}));
  EXPECT_EQ(s.rows[3].name, "layer1.0.conv1");
  EXPECT_EQ(s.total_parameters, model->num_parameters());
  // At least every stage output once: 64x32x32 maps dominate.
  EXPECT_GT(s.total_saved_bytes_per_sample, 10 * 64 * 32 * 32 * 4);
  EXPECT_EQ(model->state_dict().at("bn1.num_batches_tracked").item<int64_t>(), 0);
}

// max|a - b| <= 1e-4 * max|b|: relative to the tensor's scale, f32 against a f64 reference (or f64
// against f64). `worst`, when given, receives the largest err / scale seen, for reporting.
void expect_close(const Tensor& out, const Tensor& ref, const std::string& what, double* worst = nullptr) {
  ASSERT_EQ(out.shape(), ref.shape()) << what;
  const double scale = max(abs(ref)).item();
  const double err = max(abs(out.detach() - ref)).item();
  EXPECT_LE(err, 1e-4 * scale) << what << ": max abs error " << err << " vs max |reference| " << scale;
  if (worst != nullptr) *worst = std::max(*worst, err / scale);
}

// After one train step of `model`: every golden `prefix`grad.<name> against that parameter's
// gradient (which must exist and be of `dtype`) and every `prefix`after_train.<name> against the
// buffer; 8 gradients and 3 buffers in the golden file.
void expect_train_step_state(const Module& model, const std::map<std::string, Tensor>& golden,
                             const std::string& prefix, DType dtype, double* worst = nullptr) {
  const auto params = model.named_parameters();
  const auto state = model.state_dict();
  const std::string grad_prefix = prefix + "grad.", buf_prefix = prefix + "after_train.";
  int checked = 0;
  for (const auto& [key, ref] : golden) {
    if (key.rfind(grad_prefix, 0) == 0) {
      const std::string name = key.substr(grad_prefix.size());
      bool found = false;
      for (const auto& [pname, p] : params) {
        if (pname != name) continue;
        found = true;
        EXPECT_EQ(p.grad().dtype(), dtype) << name;
        expect_close(p.grad(), ref, "gradient of " + name, worst);
      }
      EXPECT_TRUE(found) << name;
      ++checked;
    } else if (key.rfind(buf_prefix, 0) == 0) {
      const std::string name = key.substr(buf_prefix.size());
      expect_close(state.at(name), ref, name + " after one train-mode forward", worst);
      ++checked;
    }
  }
  EXPECT_EQ(checked, 11);  // 8 gradients, 3 buffers
  EXPECT_EQ(state.at("bn1.num_batches_tracked").dtype(), DType::i64);
  EXPECT_EQ(state.at("bn1.num_batches_tracked").item<int64_t>(), 1);
}

TEST(ResNetTest, GoldenMatchesTorchvision) {
  const auto golden = testing::read_safetensors(testing::golden_path("nn/resnet_forward.safetensors"));
  const Tensor& x = golden.at("input");
  std::vector<double> xv(static_cast<size_t>(x.numel()));
  for (size_t i = 0; i < xv.size(); ++i) xv[i] = hash_unit(static_cast<uint32_t>(i), 1000003u);
  EXPECT_TRUE(allclose(from_vector(xv, x.shape()), x, 0, 0)) << "the input formula drifted from the script";
  for (const std::string arch : {"resnet18", "resnet50"}) {
    SCOPED_TRACE(arch);
    Generator gen(8);
    auto model = arch == "resnet18" ? resnet18(10, &gen) : resnet50(10, &gen);
    model->load_state_dict(golden_weights(*model));
    model->eval();
    {
      NoGradGuard no_grad;
      expect_close((*model)(x), golden.at(arch + ".eval_logits"), "eval logits");
    }
    // ResNet-50's train step is ill-conditioned in f32 (see the script); GoldenResNet50TrainStepInFloat64
    // compares it in f64.
    if (arch != "resnet18") continue;
    model->train();
    const Tensor logits = (*model)(x);
    const Tensor loss = cross_entropy(logits, golden.at("target"));
    loss.backward();
    expect_close(logits, golden.at(arch + ".train_logits"), "train logits");
    expect_close(loss.reshape({1}), golden.at(arch + ".loss"), "loss");
    expect_train_step_state(*model, golden, arch + ".", DType::f32);
  }
}

// ResNet-50's train step in float64 against PyTorch's in float64. In float32 it cannot match to
// 1e-4: one ReLU input in layer2.1 lies within float32 rounding of zero, and the side it falls on
// changes early-layer gradients by up to 2e-3. In float64 that input is resolved on both sides.
TEST(ResNetTest, GoldenResNet50TrainStepInFloat64) {
  const auto golden = testing::read_safetensors(testing::golden_path("nn/resnet_forward.safetensors"));
  const std::string prefix = "resnet50.train64.";
  ASSERT_EQ(golden.at(prefix + "logits").dtype(), DType::f64) << "rerun tools/make_golden_resnet.py";
  Generator gen(8);
  auto model = resnet50(10, &gen);
  // Weights are set while the model is f32 and then converted: the script rounds golden_value() to
  // float32 before its float64 run, and f32 -> f64 is exact, so both sides start from equal values.
  model->load_state_dict(golden_weights(*model));
  model->to(DType::f64).train();
  const Tensor logits = (*model)(golden.at("input").to(DType::f64));
  const Tensor loss = cross_entropy(logits, golden.at("target"));
  loss.backward();
  ASSERT_EQ(logits.dtype(), DType::f64);
  double worst = 0.0;
  expect_close(logits, golden.at(prefix + "logits"), "train logits", &worst);
  expect_close(loss.reshape({1}), golden.at(prefix + "loss"), "loss", &worst);
  expect_train_step_state(*model, golden, prefix, DType::f64, &worst);
  std::printf("resnet50 f64 train step: worst max|error| / max|reference| = %.3g\n", worst);
}

TEST(ResNetTest, SafetensorsRoundTrip) {
  Generator g1(9), g2(10);
  auto a = resnet18(10, &g1, false, true);
  auto b = resnet18(10, &g2, false, true);
  const std::string path =
      (std::filesystem::temp_directory_path() / "minidl_resnet_test_roundtrip.safetensors").string();
  save_safetensors(path, a->state_dict(), {{"arch", "resnet18"}});
  b->load_state_dict(load_safetensors(path).tensors);
  std::filesystem::remove(path);
  const auto sa = a->state_dict();
  for (const auto& [name, t] : b->state_dict()) {
    EXPECT_EQ(t.dtype(), sa.at(name).dtype()) << name;
    EXPECT_TRUE(allclose(t, sa.at(name), 0, 0)) << name;
  }
}

}  // namespace
}  // namespace minidl::nn
