// The Keras study's small CNN: its parameter count at 200x200 equals the Keras model's, its
// initialisation follows Keras' defaults (Glorot-uniform kernels, zero biases), names are stable,
// bad input sizes are refused with the fix, and it learns (loss falls with SGD on a fixed batch).
#include <gtest/gtest.h>

#include <cmath>

#include "core/generator.h"
#include "core/ops.h"
#include "data/synthetic.h"
#include "nn/keras_cnn.h"
#include "optim/sgd.h"

namespace minidl::nn {
namespace {

TEST(KerasSmallCnn, ParameterCountAndNamesMatchTheStudyModel) {
  Generator g(1);
  KerasSmallCnn m(200, &g);
  // Keras' summary of the one-block VGG model at 200x200x3: 896 + 40,960,128 + 129.
  EXPECT_EQ(m.num_parameters(), 40961153);
  std::vector<std::string> names;
  for (const auto& [name, t] : m.named_parameters()) names.push_back(name);
  EXPECT_EQ(names, (std::vector<std::string>{"conv.weight", "conv.bias", "fc1.weight", "fc1.bias", "fc2.weight",
                                             "fc2.bias"}));
  EXPECT_EQ(m.state_dict().at("fc1.weight").shape(), (Shape{128, 32 * 100 * 100}));
}

TEST(KerasSmallCnn, InitialisationFollowsKeras) {
  Generator g(2);
  KerasSmallCnn m(32, &g);
  const auto sd = m.state_dict();
  auto check_uniform = [](const Tensor& w, double bound, const char* what) {
    const auto v = w.to_vector();
    double lo = 0, hi = 0, sq = 0;
    for (double x : v) {
      lo = std::min(lo, x);
      hi = std::max(hi, x);
      sq += x * x;
    }
    EXPECT_GE(lo, -bound) << what;
    EXPECT_LE(hi, bound) << what;
    // A uniform(-b, b) has standard deviation b / sqrt(3).
    EXPECT_NEAR(std::sqrt(sq / static_cast<double>(v.size())), bound / std::sqrt(3.0), 0.1 * bound) << what;
    EXPECT_GT(hi, 0.9 * bound) << what;
  };
  // glorot_uniform: fan_in + fan_out, with the receptive field in both for the convolution.
  check_uniform(sd.at("conv.weight"), std::sqrt(6.0 / (27.0 + 288.0)), "conv glorot_uniform");
  check_uniform(sd.at("fc1.weight"), std::sqrt(6.0 / (32.0 * 16 * 16 + 128.0)), "fc1 glorot_uniform");
  check_uniform(sd.at("fc2.weight"), std::sqrt(6.0 / 129.0), "fc2 glorot_uniform");
  for (const char* b : {"conv.bias", "fc1.bias", "fc2.bias"}) {
    for (double x : sd.at(b).to_vector()) ASSERT_EQ(x, 0.0) << b;
  }
}

TEST(KerasSmallCnn, RefusesOtherImageSizesWithTheFix) {
  KerasSmallCnn m(64);
  try {
    m.forward(zeros({1, 3, 32, 32}));
    FAIL() << "expected minidl::Error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("[1, 3, 32, 32]"), std::string::npos) << msg;
    EXPECT_NE(msg.find("image_size=32"), std::string::npos) << msg;
  }
  EXPECT_THROW(KerasSmallCnn(33), Error);
}

TEST(KerasSmallCnn, LearnsTheSyntheticTaskOnAFixedBatch) {
  Generator g(3);
  KerasSmallCnn m(32, &g);
  const auto data = data::make_synthetic_images(64, 32, 11);
  const Tensor y = data.labels.to(DType::f32).unsqueeze(1);
  optim::SGD opt(m.parameters(), {.lr = 0.01, .momentum = 0.9});
  double first = 0, last = 0;
  for (int step = 0; step < 30; ++step) {
    opt.zero_grad();
    Tensor loss = binary_cross_entropy_with_logits(m.forward(data.images), y);
    loss.backward();
    opt.step();
    (step == 0 ? first : last) = loss.item();
  }
  EXPECT_LT(last, 0.5 * first) << "first " << first << " last " << last;
  const Tensor p = m.predict(data.images);
  EXPECT_EQ(p.shape(), (Shape{64, 1}));
  EXPECT_GE(min(p).item(), 0.0);
  EXPECT_LE(max(p).item(), 1.0);
}

TEST(KerasSmallCnn, SummaryShowsEveryLayer) {
  KerasSmallCnn m(32);
  const Summary s = m.summary({8, 3, 32, 32});
  std::vector<std::string> names;
  for (const auto& r : s.rows) names.push_back(r.name);
  EXPECT_EQ(names, (std::vector<std::string>{"conv", "relu1", "pool", "flatten", "fc1", "relu2", "fc2"}));
  EXPECT_EQ(s.rows.back().output_shape, (Shape{1, 1}));
  EXPECT_EQ(s.total_parameters, m.num_parameters());
  EXPECT_GT(s.total_saved_bytes_per_sample, 32 * 32 * 32 * 4);  // at least the conv output the ReLU keeps
}

}  // namespace
}  // namespace minidl::nn
