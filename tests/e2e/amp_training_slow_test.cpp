// End to end mixed precision on the CPU: the same small CNN trained on the synthetic task in FP32,
// with AMP (autocast + GradScaler, f32 masters) and in pure f16. AMP must reach FP32's accuracy
// within one point; pure f16 must still learn. Op-level f16 tests can all pass while a training
// loop is still wrong (a stale weight copy, a gradient left scaled). About 40 s on 2 quiet cores, hence
// the slow label; the fast structural checks are in amp_pure_f16_test.cpp.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/generator.h"
#include "core/ops.h"
#include "data/synthetic.h"
#include "nn/autocast.h"
#include "nn/functional_cnn.h"
#include "nn/layers.h"
#include "tests/support/small_cnn.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"

namespace minidl {
namespace {

enum class Mode { Fp32, Amp, PureF16 };

std::shared_ptr<nn::Sequential> make_model(uint64_t seed) { return testing::make_small_bn_cnn(seed); }

struct Result {
  double accuracy = 0.0;
  int64_t skipped = 0;
  double final_scale = 0.0;
  double last_loss = 0.0;
};

Result train(Mode mode, int64_t n_train, int64_t epochs) {
  const auto train_set = data::make_synthetic_images(n_train, 32, 101);
  const auto test_set = data::make_synthetic_images(512, 32, 102);
  auto model = make_model(7);
  if (mode == Mode::PureF16) nn::to_pure_f16(*model);
  optim::SGD sgd(model->parameters(), optim::SgdOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4});
  optim::GradScaler scaler({.enabled = mode != Mode::Fp32});
  const DType in_dtype = mode == Mode::PureF16 ? DType::f16 : DType::f32;
  std::mt19937 rng(3);
  std::vector<int64_t> order(static_cast<size_t>(n_train));
  constexpr int64_t kBatch = 64;
  Result r;
  for (int64_t e = 0; e < epochs; ++e) {
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    for (int64_t b = 0; b < n_train; b += kBatch) {
      const std::vector<int64_t> idx(order.begin() + b, order.begin() + std::min(n_train, b + kBatch));
      const Tensor x = nn::gather_rows(train_set.images, idx).to(in_dtype);
      const Tensor y = nn::gather_rows(train_set.labels, idx);
      sgd.zero_grad();
      Tensor loss;
      {
        AutocastGuard amp(DType::f16, mode == Mode::Amp);
        // Pure f16: the logits are widened for the loss (a loss in f16 would round the gradient).
        const Tensor logits = (*model)(x);
        if (e == 0 && b == 0) {
          EXPECT_EQ(logits.dtype(), mode == Mode::Fp32 ? DType::f32 : DType::f16);
        }
        loss = cross_entropy(logits.to(DType::f32), y);
      }
      scaler.scale(loss).backward();
      if (!scaler.step(sgd)) ++r.skipped;
      r.last_loss = loss.item();
      scaler.update();
    }
  }
  model->eval();
  NoGradGuard ng;
  int64_t correct = 0;
  for (int64_t b = 0; b < test_set.images.size(0); b += 128) {
    const int64_t end = std::min(test_set.images.size(0), b + 128);
    AutocastGuard amp(DType::f16, mode == Mode::Amp);
    const Tensor pred = argmax((*model)(test_set.images.slice(0, b, end).to(in_dtype)), 1);
    correct += static_cast<int64_t>(sum(eq(pred, test_set.labels.slice(0, b, end)).to(DType::i64)).item());
  }
  r.accuracy = static_cast<double>(correct) / static_cast<double>(test_set.images.size(0));
  r.final_scale = scaler.get_scale();
  autocast_clear_cache();
  return r;
}

TEST(AmpTraining, ReachesFp32AccuracyWithinOnePoint) {
  const Result fp32 = train(Mode::Fp32, 768, 3);
  const Result amp = train(Mode::Amp, 768, 3);
  std::printf("[amp] fp32 accuracy %.4f (last loss %.6f), amp accuracy %.4f (last loss %.6f, skipped %lld steps, "
              "final scale %.0f)\n", fp32.accuracy, fp32.last_loss, amp.accuracy, amp.last_loss,
              static_cast<long long>(amp.skipped), amp.final_scale);
  EXPECT_GE(fp32.accuracy, 0.9);
  EXPECT_GE(amp.accuracy, fp32.accuracy - 0.01);
  EXPECT_LT(amp.skipped, 5);  // a few at the start at most, while the scale finds its level
}

TEST(AmpTraining, PureF16StillLearns) {
  const Result r = train(Mode::PureF16, 512, 3);
  std::printf("[amp] pure f16 accuracy %.4f (skipped %lld steps, final scale %.0f)\n", r.accuracy,
              static_cast<long long>(r.skipped), r.final_scale);
  EXPECT_GE(r.accuracy, 0.8);
}

}  // namespace
}  // namespace minidl
