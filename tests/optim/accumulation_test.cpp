// Gradient accumulation semantics: k micro-batches equal one batch of all their samples (to
// rounding, in f64) without batch norm, for SGD with momentum and for Adam, with even and uneven
// windows; with batch norm the difference is measured and reported. The schedule and the EMA
// advance once per optimizer step, and a refused step leaves the parameters alone.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <iostream>

#include "core/generator.h"
#include "core/ops.h"
#include "optim/accumulation.h"
#include "optim/adam.h"
#include "optim/sgd.h"

namespace minidl::optim {
namespace {

const TensorOptions kF64{.dtype = DType::f64};

struct Model {
  Tensor w1, b1, w2, b2, bn_w, bn_b, bn_mean, bn_var;
  bool batch_norm = false;
  std::vector<Tensor> params() const {
    std::vector<Tensor> p{w1, b1, w2, b2};
    if (batch_norm) p.insert(p.end(), {bn_w, bn_b});
    return p;
  }
};

Model make_model(bool with_bn) {
  Generator g(17);
  Model m;
  m.batch_norm = with_bn;
  m.w1 = (randn({4, 3, 3, 3}, kF64, &g) * 0.3).set_requires_grad(true);
  m.b1 = (randn({4}, kF64, &g) * 0.1).set_requires_grad(true);
  m.w2 = (randn({3, 4 * 6 * 6}, kF64, &g) * 0.1).set_requires_grad(true);
  m.b2 = zeros({3}, kF64).set_requires_grad(true);
  m.bn_w = ones({4}, kF64).set_requires_grad(true);
  m.bn_b = zeros({4}, kF64).set_requires_grad(true);
  m.bn_mean = zeros({4}, kF64);
  m.bn_var = ones({4}, kF64);
  return m;
}

Tensor loss_of(const Model& m, const Tensor& x, const Tensor& y) {
  Tensor h = conv2d(x, m.w1, m.b1, {.padding = {1, 1}});
  if (m.batch_norm) h = batch_norm(h, m.bn_w, m.bn_b, m.bn_mean, m.bn_var, true);
  return cross_entropy(linear(relu(h).flatten(1), m.w2, m.b2), y);
}

struct Data {
  Tensor x, y;
};
Data make_data(int64_t n) {
  Generator g(5);
  Data d;
  d.x = randn({n, 3, 6, 6}, kF64, &g);
  d.y = (rand({n}, kF64, &g) * 2.999).to(DType::i64);
  return d;
}

enum class Kind { SgdMomentum, Adam };
std::unique_ptr<Optimizer> make_optimizer(Kind kind, const std::vector<Tensor>& params) {
  if (kind == Kind::SgdMomentum) {
    return std::make_unique<SGD>(params, SgdOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 1e-3});
  }
  return std::make_unique<Adam>(params, AdamOptions{.lr = 0.01, .weight_decay = 1e-3});
}

// Trains over the data once, as consecutive micro-batches of the given sizes, k per window.
std::vector<Tensor> train(Kind kind, bool with_bn, const std::vector<int64_t>& sizes, int64_t k,
                          int64_t* steps = nullptr) {
  Model m = make_model(with_bn);
  int64_t total = 0;
  for (int64_t s : sizes) total += s;
  Data d = make_data(total);
  auto opt = make_optimizer(kind, m.params());
  AccumulatingTrainer trainer(*opt);
  const auto plan = plan_accumulation(sizes, k);
  int64_t at = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    trainer.micro_batch(loss_of(m, d.x.slice(0, at, at + sizes[i]), d.y.slice(0, at, at + sizes[i])), plan[i]);
    at += sizes[i];
  }
  if (steps) *steps = trainer.optimizer_steps();
  return m.params();
}

double max_rel_diff(const std::vector<Tensor>& a, const std::vector<Tensor>& b) {
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const auto va = a[i].to_vector(), vb = b[i].to_vector();
    double scale = 1.0;
    for (double v : vb) scale = std::max(scale, std::abs(v));
    for (size_t j = 0; j < va.size(); ++j) worst = std::max(worst, std::abs(va[j] - vb[j]) / scale);
  }
  return worst;
}

TEST(Accumulation, PlanWeightsBySampleShare) {
  const auto even = plan_accumulation({8, 8, 8, 8}, 2);
  for (const auto& mb : even) EXPECT_DOUBLE_EQ(mb.loss_weight, 0.5);
  EXPECT_FALSE(even[0].steps);
  EXPECT_TRUE(even[1].steps);
  EXPECT_TRUE(even[3].steps);
  // Windows {8, 8, 8} and {8, 5}: the trailing partial window steps, weighted over its 13 samples.
  const auto uneven = plan_accumulation({8, 8, 8, 8, 5}, 3);
  EXPECT_DOUBLE_EQ(uneven[0].loss_weight, 1.0 / 3.0);
  EXPECT_DOUBLE_EQ(uneven[3].loss_weight, 8.0 / 13.0);
  EXPECT_DOUBLE_EQ(uneven[4].loss_weight, 5.0 / 13.0);
  EXPECT_TRUE(uneven[2].steps);
  EXPECT_FALSE(uneven[3].steps);
  EXPECT_TRUE(uneven[4].steps);
  const auto one = plan_accumulation({4, 4}, 1);
  EXPECT_TRUE(one[0].steps && one[1].steps);
  EXPECT_EQ(one[0].loss_weight, 1.0);
}

TEST(Accumulation, MicroBatchesEqualOneBigBatchWithoutBatchNorm) {
  for (Kind kind : {Kind::SgdMomentum, Kind::Adam}) {
    // Three windows of 3 x 8 samples against three batches of 24.
    int64_t steps_acc = 0, steps_big = 0;
    const auto acc = train(kind, false, std::vector<int64_t>(9, 8), 3, &steps_acc);
    const auto big = train(kind, false, {24, 24, 24}, 1, &steps_big);
    EXPECT_EQ(steps_acc, 3);
    EXPECT_EQ(steps_big, 3);
    EXPECT_LT(max_rel_diff(acc, big), 1e-12) << (kind == Kind::Adam ? "adam" : "sgd");
    // And the update is real: parameters moved away from the initial ones.
    EXPECT_GT(max_rel_diff(acc, make_model(false).params()), 1e-3);
  }
}

TEST(Accumulation, UnevenLastWindowEqualsItsOwnBatch) {
  for (Kind kind : {Kind::SgdMomentum, Kind::Adam}) {
    // {8, 8, 8} then the partial {8, 5}: the same as batches of 24 and 13.
    const auto acc = train(kind, false, {8, 8, 8, 8, 5}, 3);
    const auto big = train(kind, false, {24, 13}, 1);
    EXPECT_LT(max_rel_diff(acc, big), 1e-12);
    // An uneven micro-batch inside a window: {10, 6} against one batch of 16.
    EXPECT_LT(max_rel_diff(train(kind, false, {10, 6}, 2), train(kind, false, {16}, 1)), 1e-12);
  }
}

TEST(Accumulation, BatchNormMakesMicroBatchesDifferAndTheDifferenceIsReported) {
  // Batch statistics over 8 samples are not those over 24: the runs differ, by a measured amount.
  const auto acc = train(Kind::SgdMomentum, true, std::vector<int64_t>(9, 8), 3);
  const auto big = train(Kind::SgdMomentum, true, {24, 24, 24}, 1);
  const double diff = max_rel_diff(acc, big);
  std::cout << "[accumulation] batch norm, 3 x 8 vs 24, SGD momentum, 3 steps: max relative parameter "
               "difference "
            << diff << "\n";
  RecordProperty("batch_norm_max_rel_diff", std::to_string(diff));
  EXPECT_GT(diff, 1e-6);
  EXPECT_LT(diff, 0.5);
}

TEST(Accumulation, ScheduleEmaAndClippingAdvanceOncePerOptimizerStep) {
  Model m = make_model(false);
  Data d = make_data(48);
  SGD opt(m.params(), {.lr = 0.1, .momentum = 0.9});
  Ema ema(m.params(), 0.9);
  AccumulatingTrainer trainer(opt, {.max_grad_norm = 1e-3,
                                    .schedule = std::make_shared<StepSchedule>(1, 0.5),
                                    .ema = &ema});
  const auto plan = plan_accumulation(std::vector<int64_t>(12, 4), 4);
  int stepped = 0;
  for (int64_t i = 0; i < 12; ++i) {
    stepped += trainer.micro_batch(loss_of(m, d.x.slice(0, 4 * i, 4 * i + 4), d.y.slice(0, 4 * i, 4 * i + 4)),
                                   plan[i]);
    EXPECT_EQ(ema.num_updates(), (i + 1) / 4);
    EXPECT_DOUBLE_EQ(opt.lr(0), 0.1 * std::pow(0.5, static_cast<double>((i + 1) / 4)));
  }
  EXPECT_EQ(stepped, 3);
  EXPECT_EQ(trainer.optimizer_steps(), 3);
  EXPECT_EQ(opt.step_count(), 3);
  EXPECT_GT(trainer.last_grad_norm(), 1e-3);  // the tiny max norm really clipped
  for (const Tensor& p : m.params()) EXPECT_FALSE(p.grad().defined());  // zero_grad after the step
}

TEST(Accumulation, RefusedStepLeavesParametersAndClearsGradients) {
  Model m = make_model(false);
  Data d = make_data(8);
  const auto before = m.params();
  std::vector<Tensor> copies;
  for (const Tensor& p : before) copies.push_back(p.detach().clone());
  SGD opt(m.params(), {.lr = 0.1});
  AccumulatingTrainer trainer(opt, {.before_step = [] { return false; }});
  const auto plan = plan_accumulation({4, 4}, 2);
  EXPECT_FALSE(trainer.micro_batch(loss_of(m, d.x.slice(0, 0, 4), d.y.slice(0, 0, 4)), plan[0]));
  EXPECT_FALSE(trainer.micro_batch(loss_of(m, d.x.slice(0, 4, 8), d.y.slice(0, 4, 8)), plan[1]));
  EXPECT_EQ(trainer.skipped_steps(), 1);
  EXPECT_EQ(trainer.optimizer_steps(), 0);
  for (size_t i = 0; i < copies.size(); ++i) {
    EXPECT_TRUE(allclose(before[i], copies[i], 0, 0));
    EXPECT_FALSE(before[i].grad().defined());
  }
}

// CUDA graphs' bookkeeping (train/graphed_step.h): a step that only the device ran,
// or that a capture counted on the host without running it, is settled from the counts before it.
TEST(Accumulation, SettledDeviceStepsCountAsTheEagerLoopWould) {
  Model m = make_model(false);
  Data d = make_data(8);
  SGD opt(m.params(), {.lr = 0.1});
  AccumulatingTrainer trainer(opt);
  const auto plan = plan_accumulation({4}, 1);
  const AccumulatingTrainer::Counts before = trainer.counts();
  EXPECT_TRUE(trainer.micro_batch(loss_of(m, d.x.slice(0, 0, 4), d.y.slice(0, 0, 4)), plan[0]));
  trainer.settle_device_step(before, false);   // the step as a capture counted it: unchanged
  EXPECT_EQ(trainer.optimizer_steps(), 1);
  EXPECT_EQ(opt.step_count(), 1);
  const AccumulatingTrainer::Counts replayed = trainer.counts();
  trainer.settle_device_step(replayed, false);   // a replay: nothing ran on the host
  EXPECT_EQ(trainer.optimizer_steps(), 2);
  EXPECT_EQ(opt.step_count(), 2);
  EXPECT_EQ(trainer.skipped_steps(), 0);
  // Only the scaler's device state can skip a step the host did not see.
  EXPECT_THROW(trainer.settle_device_step(trainer.counts(), true), Error);
  EXPECT_THROW(opt.set_step_count(-1), Error);
}

// Optimizer::set_grads_to_none(false) (a graphed accumulation window, train/graphed_step.h): the
// gradients keep their memory from window to window, zeroed in place, and training is the same.
TEST(Accumulation, KeptGradientsKeepTheirMemoryAndTrainTheSame) {
  const std::vector<int64_t> sizes{4, 4, 4, 4};
  const std::vector<Tensor> reference = train(Kind::SgdMomentum, false, sizes, 2);
  Model m = make_model(false);
  Data d = make_data(16);
  auto opt = make_optimizer(Kind::SgdMomentum, m.params());
  opt->set_grads_to_none(false);
  AccumulatingTrainer trainer(*opt);
  const auto plan = plan_accumulation(sizes, 2);
  std::vector<const void*> storage;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const int64_t at = static_cast<int64_t>(i) * 4;
    EXPECT_EQ(trainer.window_open(), i % 2 == 1);
    trainer.micro_batch(loss_of(m, d.x.slice(0, at, at + 4), d.y.slice(0, at, at + 4)), plan[i]);
    if (i == 1) {   // the first window made them; its end zeroed them in place
      for (const Tensor& p : m.params()) {
        ASSERT_TRUE(p.grad().defined());
        EXPECT_EQ(max(abs(p.grad())).item(), 0.0);
        storage.push_back(p.grad().data_ptr());
      }
    }
  }
  for (size_t i = 0; i < storage.size(); ++i) EXPECT_EQ(m.params()[i].grad().data_ptr(), storage[i]);
  EXPECT_EQ(trainer.optimizer_steps(), 2);
  EXPECT_EQ(max_rel_diff(m.params(), reference), 0.0);
  // Back to the default: the next zero_grad drops them.
  opt->set_grads_to_none(true);
  opt->zero_grad();
  for (const Tensor& p : m.params()) EXPECT_FALSE(p.grad().defined());
  // A replayed micro-batch that does not step opens its window on the host, as its code would have.
  trainer.settle_device_micro_batch();
  EXPECT_TRUE(trainer.window_open());
  trainer.settle_device_step(trainer.counts(), false);
  EXPECT_FALSE(trainer.window_open());
  EXPECT_EQ(trainer.optimizer_steps(), 3);
}

TEST(Accumulation, BadInputIsRefusedClearly) {
  auto msg = [](const std::function<void()>& f) {
    try {
      f();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(msg([] { plan_accumulation({8}, 0); }).find("accumulation_steps must be >= 1"), std::string::npos);
  EXPECT_NE(msg([] { plan_accumulation({8, 0}, 2); }).find("micro-batch 1 has 0 samples"), std::string::npos);
  Model m = make_model(false);
  SGD opt(m.params(), {.lr = 0.1});
  AccumulatingTrainer trainer(opt);
  EXPECT_NE(msg([&] { trainer.micro_batch(m.w2, {}); }).find("must be a scalar"), std::string::npos);
  EXPECT_NE(msg([] {
              Model m2 = make_model(false);
              SGD o(m2.params(), {.lr = 0.1});
              AccumulatingTrainer t(o, {.max_grad_norm = -1});
            }).find("max_grad_norm"),
            std::string::npos);
}

}  // namespace
}  // namespace minidl::optim
