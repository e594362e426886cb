// Pure-f16 mode (nn::to_pure_f16) at the module level: which tensors become f16, that parameters
// stay leaves requiring grad, and that a forward runs f16 end to end with batch norm in f32; and
// pure bf16 (nn::to_pure_bf16), which steps without a gradient scaler.
#include <gtest/gtest.h>

#include <memory>

#include "core/autocast.h"
#include "core/error.h"
#include "core/generator.h"
#include "core/ops.h"
#include "nn/autocast.h"
#include "nn/layers.h"
#include "tests/support/small_cnn.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"

namespace minidl {
namespace {

std::shared_ptr<nn::Sequential> make_model(uint64_t seed) { return testing::make_small_bn_cnn(seed); }

TEST(PureF16, KeepsBatchNormInF32) {
  auto model = make_model(1);
  const int64_t converted = nn::to_pure_f16(*model);
  EXPECT_EQ(converted, 4);  // two conv weights, linear weight and bias
  for (const auto& [name, t] : model->named_parameters()) {
    const bool bn = name.rfind("1.", 0) == 0 || name.rfind("5.", 0) == 0;
    EXPECT_EQ(t.dtype(), bn ? DType::f32 : DType::f16) << name;
    EXPECT_TRUE(t.requires_grad() && t.is_leaf()) << name;
  }
  for (const auto& [name, t] : model->named_buffers()) {
    if (is_floating(t.dtype())) {
      EXPECT_EQ(t.dtype(), DType::f32) << name;
    }
  }
  const Tensor y = (*model)(randn(Shape{2, 3, 8, 8}).to(DType::f16));
  EXPECT_EQ(y.dtype(), DType::f16);
}

// The optimizer's math runs in f16 on f16 parameters (state too); the scaler unscales f16 grads.
TEST(PureF16, OptimizerStepsInF16WithTheScaler) {
  auto model = make_model(2);
  nn::to_pure_f16(*model);
  optim::SGD sgd(model->parameters(), optim::SgdOptions{.lr = 0.1, .momentum = 0.9});
  optim::GradScaler scaler;
  const Tensor x = randn(Shape{4, 3, 8, 8}).to(DType::f16);
  const Tensor y = from_vector({0, 1, 0, 1}, {4}, {.dtype = DType::i64});
  const Tensor w = model->parameters()[0];
  const std::vector<double> before = w.to_vector();
  scaler.scale(cross_entropy((*model)(x).to(DType::f32), y)).backward();
  EXPECT_EQ(w.grad().dtype(), DType::f16);
  EXPECT_TRUE(scaler.step(sgd));
  scaler.update();
  EXPECT_EQ(w.dtype(), DType::f16);
  EXPECT_EQ(sgd.state(0, 0).buffers.at("momentum_buffer").dtype(), DType::f16);
  EXPECT_NE(w.to_vector(), before);
}

// bf16: the same tensors convert, and SGD steps in bf16 with no scaler (the gradients keep f32's
// exponent range); the loss falls over a few steps on a fixed batch.
TEST(PureBf16, StepsInBf16WithoutAScaler) {
  auto model = make_model(3);
  EXPECT_EQ(nn::to_pure_bf16(*model), 4);
  for (const auto& [name, t] : model->named_parameters()) {
    const bool bn = name.rfind("1.", 0) == 0 || name.rfind("5.", 0) == 0;
    EXPECT_EQ(t.dtype(), bn ? DType::f32 : DType::bf16) << name;
  }
  optim::SGD sgd(model->parameters(), optim::SgdOptions{.lr = 0.05, .momentum = 0.9});
  Generator g(4);
  const Tensor x = randn(Shape{8, 3, 8, 8}, {}, &g).to(DType::bf16);
  const Tensor y = from_vector({0, 1, 0, 1, 1, 0, 1, 0}, {8}, {.dtype = DType::i64});
  std::vector<double> losses;
  for (int i = 0; i < 6; ++i) {
    const Tensor out = (*model)(x);
    EXPECT_EQ(out.dtype(), DType::bf16);
    const Tensor loss = cross_entropy(out.to(DType::f32), y);
    losses.push_back(loss.item());
    loss.backward();
    sgd.step();
    sgd.zero_grad();
  }
  const Tensor w = model->parameters()[0];
  EXPECT_EQ(w.dtype(), DType::bf16);
  EXPECT_EQ(sgd.state(0, 0).buffers.at("momentum_buffer").dtype(), DType::bf16);
  EXPECT_LT(losses.back(), losses.front());
  EXPECT_THROW(nn::to_pure(*model, DType::f32), Error);
}

}  // namespace
}  // namespace minidl
