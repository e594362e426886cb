// The learning-rate schedules and scaling rules the batch-size studies depend on: each schedule's
// values against its closed form computed here and against numbers printed by torch 1.13's
// schedulers, warmup composition (SequentialLR semantics), the flag parser and its errors.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <numbers>
#include <string>
#include <vector>

#include "tests/support/error_of.h"
#include "core/error.h"
#include "optim/schedule.h"

namespace minidl::optim {
namespace {

using ::minidl::testing::error_of;

void expect_factors(const LrSchedule& s, const std::vector<double>& expected, double tol = 1e-12) {
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(s.factor(static_cast<int64_t>(i)), expected[i], tol) << s.spec() << " at step " << i;
  }
}

// The torch references below were printed by Debian's /usr/bin/python3 (torch 1.13.0a0) with
//   import torch, warnings; warnings.filterwarnings("ignore")
//   L = torch.optim.lr_scheduler
//   def run(make, n):
//       p = torch.zeros(1, requires_grad=True); opt = torch.optim.SGD([p], lr=1.0); s = make(opt); out = []
//       for _ in range(n):
//           out.append(opt.param_groups[0]["lr"]); opt.step(); s.step()
//       return out
// and the per-test `make` lambda quoted in each test (base lr 1.0, so lr == factor).

TEST(ScheduleTest, ConstantIsOne) {
  ConstantSchedule s;
  for (int64_t step : {0, 1, 7, 1000000}) EXPECT_EQ(s.factor(step), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(0.1, 5), 0.1);
}

TEST(ScheduleTest, StepMatchesClosedFormAndTorch) {
  StepSchedule s(3, 0.1);
  for (int64_t step = 0; step < 40; ++step) {
    EXPECT_NEAR(s.factor(step), std::pow(0.1, static_cast<double>(step / 3)), 1e-15) << step;
  }
  // run(lambda o: L.StepLR(o, step_size=3, gamma=0.1), 10)
  expect_factors(s, {1.0, 1.0, 1.0, 0.1, 0.1, 0.1, 0.010000000000000002, 0.010000000000000002,
                     0.010000000000000002, 0.0010000000000000002}, 1e-15);
}

TEST(ScheduleTest, MultiStepMatchesClosedFormAndTorch) {
  MultiStepSchedule s({2, 5, 7}, 0.5);
  for (int64_t step = 0; step < 20; ++step) {
    const int passed = (step >= 2) + (step >= 5) + (step >= 7);
    EXPECT_DOUBLE_EQ(s.factor(step), std::pow(0.5, passed)) << step;
  }
  // run(lambda o: L.MultiStepLR(o, milestones=[2,5,7], gamma=0.5), 10)
  expect_factors(s, {1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25, 0.125, 0.125, 0.125});
}

TEST(ScheduleTest, CosineMatchesClosedFormAndTorch) {
  CosineSchedule s(10, 0.1);
  for (int64_t step = 0; step <= 10; ++step) {
    const double expected = 0.1 + 0.9 * 0.5 * (1.0 + std::cos(std::numbers::pi * static_cast<double>(step) / 10.0));
    EXPECT_NEAR(s.factor(step), expected, 1e-15) << step;
  }
  // run(lambda o: L.CosineAnnealingLR(o, T_max=10, eta_min=0.1), 11)
  expect_factors(s, {1.0, 0.9779754323328191, 0.9140576474687263, 0.8145033635316129, 0.6890576474687263, 0.55,
                     0.41094235253127376, 0.2854966364683872, 0.18594235253127372, 0.12202456766718092, 0.1});
  // Documented difference from PyTorch's closed form: past the end the lr stays at eta_min.
  EXPECT_DOUBLE_EQ(s.factor(11), 0.1);
  EXPECT_DOUBLE_EQ(s.factor(25), 0.1);
  CosineSchedule to_zero(4);
  EXPECT_DOUBLE_EQ(to_zero.factor(2), 0.5);
  EXPECT_NEAR(to_zero.factor(4), 0.0, 1e-16);
}

TEST(ScheduleTest, WarmupThenCosineMatchesSequentialLR) {
  LinearWarmupSchedule s(4, 0.25, std::make_unique<CosineSchedule>(6));
  for (int64_t step = 0; step < 4; ++step) EXPECT_DOUBLE_EQ(s.factor(step), 0.25 + 0.75 * step / 4.0);
  for (int64_t step = 4; step <= 10; ++step) {
    // Shifted: the cosine starts its own step 0 at the end of warmup.
    EXPECT_NEAR(s.factor(step), 0.5 * (1.0 + std::cos(std::numbers::pi * (step - 4) / 6.0)), 1e-15) << step;
  }
  // run(lambda o: L.SequentialLR(o, [L.LinearLR(o, start_factor=0.25, total_iters=4),
  //                                  L.CosineAnnealingLR(o, T_max=6)], milestones=[4]), 11)
  expect_factors(s, {0.25, 0.4375, 0.625, 0.8125, 1.0, 0.9330127018922194, 0.75, 0.5, 0.2500000000000001,
                     0.06698729810778065, 0.0});
}

TEST(ScheduleTest, WarmupThenStepMatchesSequentialLR) {
  LinearWarmupSchedule s(3, 0.1, std::make_unique<StepSchedule>(2, 0.5));
  // run(lambda o: L.SequentialLR(o, [L.LinearLR(o, start_factor=0.1, total_iters=3),
  //                                  L.StepLR(o, step_size=2, gamma=0.5)], milestones=[3]), 9)
  expect_factors(s, {0.1, 0.39999999999999997, 0.7, 1.0, 1.0, 0.5, 0.5, 0.25, 0.25});
}

TEST(ScheduleTest, WarmupThenMultiStepMatchesSequentialLR) {
  LinearWarmupSchedule s(2, 0.5, std::make_unique<MultiStepSchedule>(std::vector<int64_t>{3, 5}, 0.1));
  // run(lambda o: L.SequentialLR(o, [L.LinearLR(o, start_factor=0.5, total_iters=2),
  //                                  L.MultiStepLR(o, milestones=[3,5], gamma=0.1)], milestones=[2]), 9)
  expect_factors(s, {0.5, 0.75, 1.0, 1.0, 1.0, 0.1, 0.1, 0.010000000000000002, 0.010000000000000002});
}

TEST(ScheduleTest, WarmupIsContinuousAndZeroLengthIsTheInnerSchedule) {
  LinearWarmupSchedule s(100, 0.01, std::make_unique<ConstantSchedule>());
  EXPECT_DOUBLE_EQ(s.factor(0), 0.01);
  EXPECT_DOUBLE_EQ(s.factor(50), 0.01 + 0.99 * 0.5);
  for (int64_t step = 1; step < 100; ++step) EXPECT_GT(s.factor(step), s.factor(step - 1)) << step;
  EXPECT_LT(s.factor(99), 1.0);
  EXPECT_DOUBLE_EQ(s.factor(100), 1.0);
  EXPECT_DOUBLE_EQ(s.factor(5000), 1.0);

  LinearWarmupSchedule none(0, 0.5, std::make_unique<StepSchedule>(2, 0.1));
  StepSchedule plain(2, 0.1);
  for (int64_t step = 0; step < 10; ++step) EXPECT_DOUBLE_EQ(none.factor(step), plain.factor(step));
}

TEST(ScheduleTest, LrAndApplyScheduleSetEveryGroup) {
  StepSchedule s(2, 0.1);
  EXPECT_DOUBLE_EQ(s.lr(0.5, 2), 0.05);
  std::vector<double> set(2, -1.0);
  apply_schedule(s, 4, {1.0, 0.2}, [&](size_t g, double lr) { set.at(g) = lr; });
  EXPECT_NEAR(set[0], 0.01, 1e-15);
  EXPECT_NEAR(set[1], 0.002, 1e-15);
}

TEST(ScheduleTest, ParserBuildsEachSchedule) {
  expect_factors(*parse_schedule("constant", 10), {1.0, 1.0, 1.0});
  expect_factors(*parse_schedule("step:3:0.1", 0), {1.0, 1.0, 1.0, 0.1}, 1e-15);
  expect_factors(*parse_schedule("multistep:2,5,7:0.5", 0), {1.0, 1.0, 0.5, 0.5, 0.5, 0.25, 0.25, 0.125});
  const auto cos = parse_schedule("cosine", 4);
  expect_factors(*cos, {1.0, 0.5 * (1.0 + std::cos(std::numbers::pi / 4)), 0.5,
                        0.5 * (1.0 + std::cos(3 * std::numbers::pi / 4)), 0.0}, 1e-15);
  const auto cos_min = parse_schedule("cosine:0.1", 10);
  EXPECT_DOUBLE_EQ(cos_min->factor(5), 0.55);
  EXPECT_DOUBLE_EQ(cos_min->factor(10), 0.1);
}

TEST(ScheduleTest, ParserWarmupShortensTheCosine) {
  // 10 steps in all: 4 of warmup, then a cosine over the remaining 6 (as the SequentialLR test).
  const auto s = parse_schedule("warmup:4:0.25+cosine", 10);
  expect_factors(*s, {0.25, 0.4375, 0.625, 0.8125, 1.0, 0.9330127018922194, 0.75, 0.5, 0.2500000000000001,
                      0.06698729810778065, 0.0});
  const auto def = parse_schedule("warmup:3+constant", 0);
  EXPECT_DOUBLE_EQ(def->factor(0), 1.0 / 3.0);  // PyTorch LinearLR's default start_factor
  EXPECT_DOUBLE_EQ(def->factor(3), 1.0);
}

TEST(ScheduleTest, SpecRoundTrips) {
  for (const std::string spec : {"constant", "step:30:0.1", "multistep:30,60,90:0.1", "cosine", "cosine:0.01",
                                 "warmup:5:0.1+cosine", "warmup:2:0.5+multistep:3,5:0.2", "warmup:0:1+step:7:0.5"}) {
    const auto s = parse_schedule(spec, 100);
    EXPECT_EQ(s->spec(), spec);
    const auto again = parse_schedule(s->spec(), 100);
    for (int64_t step = 0; step < 120; ++step) EXPECT_EQ(again->factor(step), s->factor(step)) << spec << " " << step;
  }
  // The default start factor is spelled out so the spec is exact.
  const auto def = parse_schedule("warmup:5+cosine", 100);
  EXPECT_EQ(parse_schedule(def->spec(), 100)->factor(1), def->factor(1));
}

TEST(ScheduleTest, ParserErrorsNameTheSpecAndTheFix) {
  const auto err = [](const std::string& spec, int64_t total = 100) {
    return error_of([&] { parse_schedule(spec, total); });
  };
  EXPECT_NE(err("").find("empty schedule"), std::string::npos);
  EXPECT_NE(err("linear").find("unknown schedule 'linear'"), std::string::npos);
  EXPECT_NE(err("linear").find("multistep:M1,M2"), std::string::npos);
  EXPECT_NE(err("step:30").find("step:STEP_SIZE:GAMMA"), std::string::npos);
  EXPECT_NE(err("step:x:0.1").find("'x' is not an integer"), std::string::npos);
  EXPECT_NE(err("step:30:abc").find("'abc' is not a number"), std::string::npos);
  EXPECT_NE(err("step:0:0.1").find("step_size 0 must be >= 1"), std::string::npos);
  EXPECT_NE(err("step:30:0").find("gamma 0 must be"), std::string::npos);
  EXPECT_NE(err("step:30:-0.1").find("gamma -0.1 must be"), std::string::npos);
  EXPECT_NE(err("multistep:60,30:0.1").find("strictly increasing"), std::string::npos);
  EXPECT_NE(err("multistep:30,30:0.1").find("strictly increasing"), std::string::npos);
  EXPECT_NE(err("multistep:30,,60:0.1").find("is not an integer"), std::string::npos);
  EXPECT_NE(err("multistep:30:0.1:2").find("multistep:M1,M2,...:GAMMA"), std::string::npos);
  EXPECT_NE(err("cosine:2").find("eta_min_ratio 2 must be in [0, 1]"), std::string::npos);
  EXPECT_NE(err("cosine", 0).find("cosine spanning 0 steps"), std::string::npos);
  EXPECT_NE(err("warmup:10+cosine", 10).find("make the run longer or the warmup shorter"), std::string::npos);
  EXPECT_NE(err("warmup:10").find("no schedule after it"), std::string::npos);
  EXPECT_NE(err("warmup:-1+constant").find("warmup length -1 must be >= 0"), std::string::npos);
  EXPECT_NE(err("warmup:5:0+constant").find("start_factor 0 must be in (0, 1]"), std::string::npos);
  EXPECT_NE(err("warmup:5:1.5+constant").find("start_factor 1.5"), std::string::npos);
  EXPECT_NE(err("warm:5+constant").find("warmup:W or warmup:W:START_FACTOR"), std::string::npos);
  EXPECT_NE(err("warmup:5+").find("nothing after '+'"), std::string::npos);
  EXPECT_NE(err("warmup:5+warmup:5+constant").find("more than one '+'"), std::string::npos);
  EXPECT_NE(err("constant", -1).find("total_steps -1"), std::string::npos);
  // The error names the whole spec so a user finds the flag.
  EXPECT_NE(err("warmup:5+step:30:abc").find("in 'warmup:5+step:30:abc'"), std::string::npos);
}

TEST(ScheduleTest, ConstructorAndStepErrors) {
  EXPECT_NE(error_of([] { StepSchedule(-3, 0.1); }).find("step schedule: step_size -3"), std::string::npos);
  EXPECT_NE(error_of([] { MultiStepSchedule({}, 0.1); }).find("no milestones"), std::string::npos);
  EXPECT_NE(error_of([] { MultiStepSchedule({0, 3}, 0.1); }).find("milestone 0"), std::string::npos);
  EXPECT_NE(error_of([] { MultiStepSchedule({3}, std::nan("")); }).find("gamma"), std::string::npos);
  EXPECT_NE(error_of([] { CosineSchedule(0); }).find("cosine schedule: total_steps 0"), std::string::npos);
  EXPECT_NE(error_of([] { CosineSchedule(10, -0.1); }).find("eta_min_ratio -0.1"), std::string::npos);
  EXPECT_NE(error_of([] { LinearWarmupSchedule(5, 0.1, nullptr); }).find("no schedule to follow"), std::string::npos);
  EXPECT_NE(error_of([] { LinearWarmupSchedule(-5, 0.1, std::make_unique<ConstantSchedule>()); }).find("warmup_steps -5"),
            std::string::npos);
  EXPECT_NE(error_of([] { ConstantSchedule().factor(-1); }).find("constant schedule: step -1 is negative"),
            std::string::npos);
  EXPECT_NE(error_of([] { CosineSchedule(5).factor(-2); }).find("cosine schedule: step -2"), std::string::npos);
  EXPECT_NE(error_of([] { LinearWarmupSchedule(5, 0.1, std::make_unique<ConstantSchedule>()).factor(-1); })
                .find("linear warmup: step -1"),
            std::string::npos);
}

TEST(ScalingTest, LinearAndSqrtRules) {
  EXPECT_DOUBLE_EQ(scaled_lr(0.1, 1024, 256, LrScaling::None), 0.1);
  EXPECT_DOUBLE_EQ(scaled_lr(0.1, 1024, 256, LrScaling::Linear), 0.4);
  EXPECT_DOUBLE_EQ(scaled_lr(0.1, 1024, 256, LrScaling::Sqrt), 0.2);
  EXPECT_DOUBLE_EQ(scaled_lr(0.1, 64, 256, LrScaling::Linear), 0.025);
  EXPECT_DOUBLE_EQ(scaled_lr(0.1, 64, 256, LrScaling::Sqrt), 0.05);
  EXPECT_DOUBLE_EQ(scaled_lr(0.001, 96, 32, LrScaling::Sqrt), 0.001 * std::sqrt(3.0));
  EXPECT_DOUBLE_EQ(scaled_lr(0.001, 32, 32, LrScaling::Linear), 0.001);
}

TEST(ScalingTest, ParseAndErrors) {
  for (LrScaling s : {LrScaling::None, LrScaling::Linear, LrScaling::Sqrt}) EXPECT_EQ(parse_lr_scaling(to_string(s)), s);
  EXPECT_EQ(parse_lr_scaling("linear"), LrScaling::Linear);
  EXPECT_NE(error_of([] { parse_lr_scaling("Linear"); }).find("expected none, linear or sqrt"), std::string::npos);
  EXPECT_NE(error_of([] { scaled_lr(0.1, 64, 0, LrScaling::Linear); }).find("base_batch 0 must be >= 1"),
            std::string::npos);
  EXPECT_NE(error_of([] { scaled_lr(0.1, 0, 32, LrScaling::Linear); }).find("effective_batch 0"), std::string::npos);
  EXPECT_NE(error_of([] { scaled_lr(-0.1, 64, 32, LrScaling::Sqrt); }).find("base_lr -0.1"), std::string::npos);
}

}  // namespace
}  // namespace minidl::optim
