// The Keras study's small CNN: its parameter count at 200x200 equals the Keras model's, its
// initialisation follows Keras' defaults (Glorot-uniform kernels, zero biases), names are stable,
// bad input sizes are refused with the fix, and it learns (loss falls with SGD on a fixed batch).
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <string>
#include <vector>

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
  EXPECT_EQ(names, (std::vector<std::string>{"conv", "pool", "relu1", "flatten", "fc1", "relu2", "fc2"}));
  EXPECT_EQ(s.rows.back().output_shape, (Shape{1, 1}));
  EXPECT_EQ(s.total_parameters, m.num_parameters());
  // Pooling first, nothing of the conv's full-size output is kept for backward: the pool keeps
  // its i64 indices (32 x 16 x 16 x 8 bytes), the ReLU its pooled output (x 4), the conv its input.
  EXPECT_GE(s.total_saved_bytes_per_sample, 32 * 16 * 16 * (8 + 4));
  EXPECT_LT(s.total_saved_bytes_per_sample, 32 * 32 * 32 * 4);
}

// forward() pools before the ReLU (Keras' model applies the ReLU first): max-pooling commutes with
// any non-decreasing function, so the logits are the same numbers, and so are the gradients (a
// window whose max is positive sends its gradient to the same first argmax either way; one whose
// max is <= 0 sends none, through the ReLU's zero slope). Bit for bit, with ties and all-negative
// windows in the batch; the ReLU then touches a quarter of the elements, forward and backward.
TEST(KerasSmallCnn, PoolingBeforeTheReluGivesTheSameLogitsAndGradientsBitForBit) {
  Generator g(4);
  KerasSmallCnn m(16, &g);
  Tensor x = data::make_synthetic_images(6, 16, 5).images.clone();
  // Ties inside pooling windows and windows that stay negative: a constant image gives a constant
  // conv output per channel away from the border, positive in some channels, negative in others.
  x.slice(0, 0, 1).fill_(0.25);
  std::map<std::string, Tensor> sd;  // the parameters themselves (state_dict() gives detached tensors)
  for (const auto& [name, p] : m.named_parameters()) sd.emplace(name, p);
  // Keras' order with the model's own parameters: conv, ReLU, pool, dense + ReLU, dense.
  auto keras_order = [&] {
    const Tensor h = max_pool2d(relu(conv2d(x, sd.at("conv.weight"), sd.at("conv.bias"), {.padding = {1, 1}})), {});
    return linear(relu(linear(h.flatten(1), sd.at("fc1.weight"), sd.at("fc1.bias"))), sd.at("fc2.weight"),
                  sd.at("fc2.bias"));
  };
  auto logits_and_grads = [&](const Tensor& logits) {
    for (auto [name, p] : m.named_parameters()) p.zero_grad();
    // A loss whose gradient differs per sample, so every window's argmax matters.
    sum(logits * (arange(logits.size(0), {.dtype = DType::f32}).unsqueeze(1) + 1.0)).backward();
    std::vector<std::vector<double>> out{logits.to_vector()};
    for (const auto& [name, p] : m.named_parameters()) out.push_back(p.grad().to_vector());
    return out;
  };
  const auto mine = logits_and_grads(m.forward(x));
  const auto keras = logits_and_grads(keras_order());
  ASSERT_EQ(mine.size(), keras.size());
  for (size_t i = 0; i < mine.size(); ++i) EXPECT_EQ(mine[i], keras[i]) << "tensor " << i << " (0: logits, then parameters)";
  // The batch really has both kinds of windows: pooled conv outputs <= 0 and > 0.
  const Tensor pooled = max_pool2d(conv2d(x, sd.at("conv.weight"), sd.at("conv.bias"), {.padding = {1, 1}}), {});
  EXPECT_GT(sum(gt(pooled, scalar_tensor(0.0, pooled.options())).to(DType::f32)).item(), 0.0);
  EXPECT_GT(sum(le(pooled, scalar_tensor(0.0, pooled.options())).to(DType::f32)).item(), 0.0);
}

}  // namespace
}  // namespace minidl::nn
