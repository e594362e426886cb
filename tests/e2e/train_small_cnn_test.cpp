// End to end: the whole CPU stack (synthetic data, conv/batch-norm/pool/linear ops, cross entropy,
// autograd, in-place SGD) must actually learn, and reproduce itself bit for bit from a seed. Op-level
// tests can all pass while training still fails (a wrong gradient sign, a stale running stat).
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "core/generator.h"
#include "core/ops.h"
#include "data/synthetic.h"
#include "nn/functional_cnn.h"

namespace minidl {
namespace {

struct RunResult {
  std::vector<double> epoch_losses;
  double test_accuracy = 0.0;
  std::vector<std::vector<double>> params;
};

RunResult train_and_evaluate(uint64_t seed, int64_t n_train, int64_t n_test, int64_t epochs) {
  const auto train = data::make_synthetic_images(n_train, 32, seed * 4 + 1);
  const auto test = data::make_synthetic_images(n_test, 32, seed * 4 + 2);
  Generator init_gen(seed * 4 + 3);
  Generator shuffle_gen(seed * 4 + 4);
  nn::SmallCnn model(nn::SmallCnnOptions{}, init_gen);
  const nn::TrainOptions opts{.batch_size = 64, .lr = 0.05, .momentum = 0.9, .weight_decay = 5e-4};
  std::vector<Tensor> velocities;
  RunResult r;
  for (int64_t e = 0; e < epochs; ++e) {
    const auto er = nn::train_epoch(model, train.images, train.labels, opts, velocities, shuffle_gen);
    std::printf("[e2e] seed %llu epoch %lld: loss %.4f train acc %.3f (%.0f images/s)\n",
                static_cast<unsigned long long>(seed), static_cast<long long>(e + 1), er.mean_loss, er.accuracy,
                static_cast<double>(er.images) / er.seconds);
    r.epoch_losses.push_back(er.mean_loss);
  }
  r.test_accuracy = nn::evaluate_accuracy(model, test.images, test.labels, 128);
  for (const Tensor& p : model.parameters()) r.params.push_back(p.to_vector());
  return r;
}

TEST(SyntheticImages, BalancedDeterministicAndNotConstant) {
  const auto a = data::make_synthetic_images(101, 16, 7);
  const auto b = data::make_synthetic_images(101, 16, 7);
  const auto c = data::make_synthetic_images(101, 16, 8);
  ASSERT_EQ(a.images.shape(), (Shape{101, 3, 16, 16}));
  ASSERT_EQ(a.labels.shape(), (Shape{101}));
  EXPECT_EQ(a.images.dtype(), DType::f32);
  EXPECT_EQ(a.labels.dtype(), DType::i64);
  const std::vector<double> la = a.labels.to_vector();
  int64_t zeros_count = 0;
  for (double v : la) zeros_count += v == 0.0 ? 1 : 0;
  EXPECT_EQ(zeros_count, 51);  // ceil(101 / 2): exactly balanced, class 0 gets the odd image
  EXPECT_EQ(a.images.to_vector(), b.images.to_vector());
  EXPECT_EQ(la, b.labels.to_vector());
  EXPECT_NE(a.images.to_vector(), c.images.to_vector());
  // Roughly zero-mean, unit-scale pixels: the demo trains without a normalisation step.
  const std::vector<double> px = a.images.to_vector();
  double sum = 0.0, sq = 0.0;
  for (double v : px) {
    ASSERT_TRUE(std::isfinite(v));
    sum += v;
    sq += v * v;
  }
  const double mean = sum / static_cast<double>(px.size());
  const double std_dev = std::sqrt(sq / static_cast<double>(px.size()) - mean * mean);
  EXPECT_LT(std::abs(mean), 0.3);
  EXPECT_GT(std_dev, 0.3);
  EXPECT_LT(std_dev, 2.0);
}

// Bit-identical losses and parameters from the same seed: the shuffle, the initialisation and every
// kernel (including OpenMP reductions) must not depend on timing.
TEST(TrainSmallCnn, DeterministicForASeed) {
  const RunResult a = train_and_evaluate(3, 256, 128, 1);
  const RunResult b = train_and_evaluate(3, 256, 128, 1);
  EXPECT_EQ(a.epoch_losses, b.epoch_losses);
  EXPECT_EQ(a.test_accuracy, b.test_accuracy);
  EXPECT_EQ(a.params, b.params);
}

TEST(TrainSmallCnn, ReachesNinetyFivePercentOnSyntheticImages) {
  const RunResult r = train_and_evaluate(0, 2048, 512, 5);
  std::printf("[e2e] test accuracy %.4f\n", r.test_accuracy);
  ASSERT_EQ(r.epoch_losses.size(), 5u);
  EXPECT_LT(r.epoch_losses.back(), r.epoch_losses.front());
  EXPECT_LT(r.epoch_losses.back(), 0.25);
  EXPECT_GE(r.test_accuracy, 0.95);
}

}  // namespace
}  // namespace minidl
