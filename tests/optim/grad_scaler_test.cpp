// GradScaler against PyTorch's GradScaler semantics (init 65536, x2 after 2000 clean steps, x0.5
// and a skipped step on inf/NaN, one unscale per step), its state saved with the optimizer's, and
// its use inside gradient accumulation: one scale per window, a NaN in any micro-batch skips the
// whole effective batch, clipping sees unscaled gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "optim/accumulation.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "tests/support/error_of.h"

namespace minidl::optim {
namespace {

using minidl::testing::error_of;

// loss = sum(w * c): the gradient of w is exactly c (times the scale).
struct Tiny {
  Tensor w = from_vector({1.0, -2.0, 3.0}, {3}).set_requires_grad(true);
  SGD sgd{std::vector<Tensor>{w}, SgdOptions{.lr = 0.5}};
  Tensor loss(double c) const { return sum(w * c); }
};

TEST(GradScaler, DefaultsAreTorchs) {
  GradScaler s;
  EXPECT_EQ(s.get_scale(), 65536.0);
  EXPECT_EQ(s.options().growth_factor, 2.0);
  EXPECT_EQ(s.options().backoff_factor, 0.5);
  EXPECT_EQ(s.options().growth_interval, 2000);
  EXPECT_EQ(s.scale(scalar_tensor(1.5)).item(), 1.5 * 65536);
  // An f16 loss is widened: 65536 does not fit in f16.
  const Tensor l16 = scalar_tensor(2.0, {.dtype = DType::f16});
  EXPECT_EQ(s.scale(l16).dtype(), DType::f32);
  EXPECT_EQ(s.scale(l16).item(), 131072.0);
}

TEST(GradScaler, CleanStepUnscalesExactlyAndSteps) {
  Tiny t;
  GradScaler s;
  s.scale(t.loss(0.25)).backward();
  EXPECT_EQ(t.w.grad().to_vector(), (std::vector<double>{16384, 16384, 16384}));
  EXPECT_TRUE(s.step(t.sgd));
  EXPECT_EQ(t.w.grad().to_vector(), (std::vector<double>{0.25, 0.25, 0.25}));  // unscaled in place
  EXPECT_EQ(t.w.to_vector(), (std::vector<double>{0.875, -2.125, 2.875}));
  s.update();
  EXPECT_EQ(s.get_scale(), 65536.0);
  EXPECT_EQ(s.growth_tracker(), 1);
}

TEST(GradScaler, ForcedOverflowSkipsTheStepLeavesWeightsAndHalvesTheScale) {
  Tiny t;
  GradScaler s;
  for (int i = 0; i < 5; ++i) {  // some clean steps first: the overflow must reset the tracker
    t.sgd.zero_grad();
    s.scale(t.loss(1e-3)).backward();
    s.step(t.sgd);
    s.update();
  }
  EXPECT_EQ(s.growth_tracker(), 5);
  const std::vector<double> before = t.w.to_vector();
  t.sgd.zero_grad();
  s.scale(t.loss(1e36)).backward();  // 1e36 * 65536 overflows f32: inf gradients
  EXPECT_TRUE(std::isinf(t.w.grad().to_vector()[0]));
  EXPECT_FALSE(s.step(t.sgd));
  EXPECT_TRUE(s.found_inf(t.sgd));
  EXPECT_EQ(t.w.to_vector(), before);
  EXPECT_EQ(t.sgd.step_count(), 5);
  s.update();
  EXPECT_EQ(s.get_scale(), 32768.0);
  EXPECT_EQ(s.growth_tracker(), 0);
  // NaN does the same.
  t.sgd.zero_grad();
  s.scale(t.loss(std::nan(""))).backward();
  EXPECT_FALSE(s.step(t.sgd));
  s.update();
  EXPECT_EQ(s.get_scale(), 16384.0);
  EXPECT_EQ(t.w.to_vector(), before);
}

TEST(GradScaler, TwoThousandCleanStepsDoubleTheScale) {
  Tiny t;
  GradScaler s;
  for (int i = 0; i < 1999; ++i) {
    t.sgd.zero_grad();
    s.scale(t.loss(1e-6)).backward();
    ASSERT_TRUE(s.step(t.sgd));
    s.update();
  }
  EXPECT_EQ(s.get_scale(), 65536.0);
  EXPECT_EQ(s.growth_tracker(), 1999);
  t.sgd.zero_grad();
  s.scale(t.loss(1e-6)).backward();
  s.step(t.sgd);
  s.update();
  EXPECT_EQ(s.get_scale(), 131072.0);
  EXPECT_EQ(s.growth_tracker(), 0);
}

TEST(GradScaler, GrowthStopsShortOfInfinity) {
  GradScaler s({.init_scale = 3e38, .growth_interval = 1});
  Tiny t;
  s.scale(t.loss(1e-30)).backward();
  s.step(t.sgd);
  s.update();
  EXPECT_EQ(s.get_scale(), static_cast<double>(3e38f));  // x2 would be inf in f32: kept
}

TEST(GradScaler, UnscaleAtMostOncePerStepAndOrderErrors) {
  Tiny t;
  GradScaler s;
  s.scale(t.loss(1.0)).backward();
  s.unscale_(t.sgd);
  EXPECT_NE(error_of([&] { s.unscale_(t.sgd); }).find("unscale_() has already been called"), std::string::npos);
  EXPECT_TRUE(s.step(t.sgd));  // uses the earlier unscale, does not unscale again
  EXPECT_EQ(t.w.grad().to_vector(), (std::vector<double>{1, 1, 1}));
  EXPECT_NE(error_of([&] { s.step(t.sgd); }).find("step() has already been called"), std::string::npos);
  EXPECT_NE(error_of([&] { s.unscale_(t.sgd); }).find("after step()"), std::string::npos);
  s.update();
  EXPECT_NE(error_of([&] { s.update(); }).find("no inf checks were recorded"), std::string::npos);
  EXPECT_NE(error_of([] { GradScaler({.backoff_factor = 1.5}); }).find("backoff_factor"), std::string::npos);
  // No gradient at all: nothing was checked, as PyTorch's "No inf checks were recorded".
  t.sgd.zero_grad();
  EXPECT_NE(error_of([&] { s.step(t.sgd); }).find("no inf checks were recorded for this optimizer"),
            std::string::npos);
  EXPECT_NE(error_of([&] { s.update(); }).find("no inf checks were recorded prior to update"), std::string::npos);
}

TEST(GradScaler, DisabledIsAPassThrough) {
  Tiny t;
  GradScaler s({.enabled = false});
  const Tensor l = t.loss(1.0);
  EXPECT_TRUE(s.scale(l).same(l));
  l.backward();
  s.unscale_(t.sgd);
  s.unscale_(t.sgd);  // nothing to check when off
  EXPECT_TRUE(s.step(t.sgd));
  s.update();
  EXPECT_EQ(s.get_scale(), 1.0);
  EXPECT_TRUE(s.state_dict().empty());
  EXPECT_EQ(t.w.to_vector(), (std::vector<double>{0.5, -2.5, 2.5}));
}

TEST(GradScaler, StateIsSavedAndRestoredWithTheOptimizer) {
  auto train = [](Tiny& t, GradScaler& s, int steps, double c) {
    for (int i = 0; i < steps; ++i) {
      t.sgd.zero_grad();
      s.scale(t.loss(i == 1 ? 1e36 : c)).backward();
      s.step(t.sgd);
      s.update();
    }
  };
  Tiny a;
  GradScaler sa({.growth_interval = 3});
  train(a, sa, 6, 0.1);  // one overflow, then 4 clean steps: scale 65536 -> 32768 -> 65536, tracker 1
  EXPECT_EQ(sa.get_scale(), 65536.0);
  EXPECT_EQ(sa.growth_tracker(), 1);
  const auto dict = training_state_dict(a.sgd, sa);
  EXPECT_EQ(dict.at("scaler.scale").item(), 65536.0);
  EXPECT_EQ(dict.at("scaler._growth_tracker").item(), 1.0);
  EXPECT_EQ(dict.at("scaler.growth_interval").item(), 3.0);
  EXPECT_TRUE(dict.count("state.step"));

  Tiny b;
  GradScaler sb;  // defaults; everything comes from the dict
  {
    NoGradGuard ng;
    b.w.copy_(a.w);
  }
  load_training_state(b.sgd, sb, dict);
  EXPECT_EQ(sb.get_scale(), 65536.0);
  EXPECT_EQ(sb.growth_tracker(), 1);
  EXPECT_EQ(sb.options().growth_interval, 3);
  EXPECT_EQ(b.sgd.step_count(), a.sgd.step_count());
  train(a, sa, 3, 0.2);
  train(b, sb, 3, 0.2);
  EXPECT_EQ(sa.get_scale(), sb.get_scale());
  EXPECT_EQ(sa.growth_tracker(), sb.growth_tracker());
  EXPECT_EQ(a.w.to_vector(), b.w.to_vector());

  // A dict saved with the scaler off cannot restore an enabled one; a bad dict changes nothing.
  GradScaler sc;
  EXPECT_NE(error_of([&] { sc.load_state_dict({}); }).find("empty"), std::string::npos);
  auto bad = dict;
  bad["scaler.scale"] = scalar_tensor(-1.0, {.dtype = DType::f64});
  const int64_t steps_before = b.sgd.step_count();
  EXPECT_NE(error_of([&] { load_training_state(b.sgd, sc, bad); }).find("invalid"), std::string::npos);
  EXPECT_EQ(sc.get_scale(), 65536.0);
  EXPECT_EQ(b.sgd.step_count(), steps_before);
}

// A model without batch norm for the accumulation cases: y = x . w + b.
struct Linear1 {
  Tensor w = from_vector({0.5, -0.25, 1.0, 0.75}, {4, 1}).set_requires_grad(true);
  Tensor b = zeros({1}).set_requires_grad(true);
  SGD sgd{std::vector<Tensor>{w, b}, SgdOptions{.lr = 0.1, .momentum = 0.9}};
  Tensor loss(const Tensor& x, const Tensor& y) const {
    const Tensor d = linear(x, w.t(), b).flatten() - y;
    return mean(d * d);
  }
};

TEST(GradScalerAccumulation, NanInOneMicroBatchSkipsTheWholeEffectiveBatch) {
  Linear1 m;
  GradScaler s;
  AccumulatingTrainer trainer(m.sgd, {.scaler = &s});
  const auto plan = plan_accumulation({2, 2, 2, 2, 2, 2}, 3);
  const Tensor x = randn(Shape{2, 4}), y = randn(Shape{2});
  Tensor xnan = x.clone();
  xnan.select(0, 1).select(0, 2).fill_(std::nan(""));
  const std::vector<double> w0 = m.w.to_vector();
  // Window 1: micro-batch 2 of 3 is poisoned.
  EXPECT_FALSE(trainer.micro_batch(m.loss(x, y), plan[0]));
  EXPECT_FALSE(trainer.micro_batch(m.loss(xnan, y), plan[1]));
  EXPECT_FALSE(trainer.micro_batch(m.loss(x, y), plan[2]));  // closes the window: skipped
  EXPECT_EQ(trainer.skipped_steps(), 1);
  EXPECT_EQ(trainer.optimizer_steps(), 0);
  EXPECT_EQ(m.w.to_vector(), w0);
  EXPECT_EQ(s.get_scale(), 32768.0);
  EXPECT_FALSE(m.w.grad().defined());  // the poisoned gradients are dropped
  // Window 2 is clean and steps.
  for (int i = 3; i < 6; ++i) trainer.micro_batch(m.loss(x, y), plan[i]);
  EXPECT_EQ(trainer.optimizer_steps(), 1);
  EXPECT_NE(m.w.to_vector(), w0);
  EXPECT_EQ(s.get_scale(), 32768.0);
  EXPECT_EQ(s.growth_tracker(), 1);
}

TEST(GradScalerAccumulation, ScaleIsFixedWithinAWindow) {
  Linear1 m;
  GradScaler s;
  AccumulatingTrainer trainer(m.sgd, {.scaler = &s});
  const auto plan = plan_accumulation({2, 2}, 2);
  const Tensor x = randn(Shape{2, 4}), y = randn(Shape{2});
  trainer.micro_batch(m.loss(x, y), plan[0]);
  s.update(1024.0);  // changing it mid-window is refused
  EXPECT_NE(error_of([&] { trainer.micro_batch(m.loss(x, y), plan[1]); }).find("loss scale changed inside"),
            std::string::npos);
}

// Same data as one batch of 6 or as 3 micro-batches of 2, both with AMP (autocast + scaler), on a
// model without batch norm: the same update within f16 tolerance. Clipping sees the unscaled norm.
TEST(GradScalerAccumulation, AmpWithAccumulationMatchesAmpWithout) {
  const Tensor x = randn(Shape{6, 4}), y = randn(Shape{6});
  Linear1 full, acc;
  // An initial scale that does not overflow f16 here: at 65536 the first steps are skipped (the
  // scaler doing its job), and a batch of 6 and micro-batches of 2 need not overflow alike.
  GradScaler s1({.init_scale = 1024.0}), s2({.init_scale = 1024.0});
  AccumulatingTrainer t1(full.sgd, {.max_grad_norm = 1e6, .scaler = &s1});
  AccumulatingTrainer t2(acc.sgd, {.max_grad_norm = 1e6, .scaler = &s2});
  const auto one = plan_accumulation({6}, 1);
  const auto three = plan_accumulation({2, 2, 2}, 3);
  for (int step = 0; step < 3; ++step) {
    AutocastGuard amp;
    EXPECT_TRUE(t1.micro_batch(full.loss(x, y), one[0]));
    for (int i = 0; i < 3; ++i) {
      t2.micro_batch(acc.loss(x.slice(0, 2 * i, 2 * i + 2), y.slice(0, 2 * i, 2 * i + 2)), three[i]);
    }
  }
  EXPECT_EQ(t2.optimizer_steps(), 3);
  EXPECT_EQ(s1.get_scale(), s2.get_scale());
  EXPECT_LT(t1.last_grad_norm(), 100.0);  // unscaled: a scaled norm would be ~65536 times larger
  EXPECT_NEAR(t1.last_grad_norm(), t2.last_grad_norm(), 5e-3 * t1.last_grad_norm());
  const auto a = full.w.to_vector(), b = acc.w.to_vector();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], 2e-3 * (1.0 + std::abs(a[i]))) << i;
  EXPECT_NEAR(full.b.item(), acc.b.item(), 2e-3);
  EXPECT_EQ(full.w.dtype(), DType::f32);  // masters stay f32
}

}  // namespace
}  // namespace minidl::optim
