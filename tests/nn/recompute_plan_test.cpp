// Checks the `optimal` recomputation planner (nn/recompute_plan.h): the dynamic program must find
// exactly the brute-force optimum over all 3^L mode assignments under the same simulated model,
// keep everything when memory is plentiful, flag impossible limits, and beat sequential:N plans.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <random>

#include "core/error.h"
#include "nn/recompute_plan.h"

namespace minidl::nn {
namespace {

std::vector<ChainStage> random_chain(std::mt19937& rng, size_t L) {
  std::uniform_real_distribution<double> t(0.1, 5.0);
  std::uniform_int_distribution<int64_t> b(0, 40);
  std::vector<ChainStage> c(L);
  for (auto& s : c) {
    s.forward_time = t(rng);
    s.backward_time = t(rng);
    s.saved_bytes = 256 * b(rng);
    s.output_bytes = 256 * (1 + b(rng));
    s.param_grad_bytes = 256 * (b(rng) / 2);
    s.backward_extra_bytes = 256 * (b(rng) / 4);
  }
  return c;
}

// Minimum over all 3^L assignments evaluated with evaluate(); infinity when none fits.
RecomputePlan brute_force(const std::vector<ChainStage>& c, int64_t in, int64_t limit) {
  const size_t L = c.size();
  size_t total = 1;
  for (size_t i = 0; i < L; ++i) total *= 3;
  RecomputePlan best;
  best.predicted_time = std::numeric_limits<double>::infinity();
  std::vector<StageMode> modes(L);
  for (size_t code = 0; code < total; ++code) {
    size_t x = code;
    for (size_t i = 0; i < L; ++i, x /= 3) modes[i] = static_cast<StageMode>(x % 3);
    RecomputePlan p = evaluate(c, in, modes, limit);
    if (p.feasible && p.predicted_time < best.predicted_time) best = p;
  }
  return best;
}

// Least peak over all valid assignments (brute force), to draw limits around the interesting range.
int64_t least_peak(const std::vector<ChainStage>& c, int64_t in) {
  const RecomputePlan any = brute_force(c, in, -1);
  int64_t least = any.predicted_peak_bytes;
  const size_t L = c.size();
  size_t total = 1;
  for (size_t i = 0; i < L; ++i) total *= 3;
  std::vector<StageMode> modes(L);
  for (size_t code = 0; code < total; ++code) {
    size_t x = code;
    for (size_t i = 0; i < L; ++i, x /= 3) modes[i] = static_cast<StageMode>(x % 3);
    const RecomputePlan p = evaluate(c, in, modes);
    if (p.feasible) least = std::min(least, p.predicted_peak_bytes);
  }
  return least;
}

TEST(RecomputePlan, DynamicProgramMatchesBruteForce) {
  std::mt19937 rng(12345);
  int feasible_cases = 0, infeasible_cases = 0, recomputing_optima = 0;
  for (int trial = 0; trial < 2000; ++trial) {
    const size_t L = 1 + static_cast<size_t>(trial % 8);
    const auto c = random_chain(rng, L);
    const int64_t in = 256 * std::uniform_int_distribution<int64_t>(1, 40)(rng);
    const int64_t keep_all_peak = evaluate(c, in, std::vector<StageMode>(L, StageMode::KeepAll)).predicted_peak_bytes;
    const int64_t least = least_peak(c, in);
    const int64_t limit = std::uniform_int_distribution<int64_t>(least - 1024, keep_all_peak + 256)(rng);
    const RecomputePlan bf = brute_force(c, in, limit);
    const RecomputePlan dp = solve_optimal(c, in, limit);
    SCOPED_TRACE("trial " + std::to_string(trial) + " L=" + std::to_string(L) + " limit=" + std::to_string(limit));
    ASSERT_EQ(dp.feasible, bf.feasible) << dp.str();
    if (!dp.feasible) {
      ++infeasible_cases;
      EXPECT_FALSE(dp.reason.empty());
      continue;
    }
    ++feasible_cases;
    EXPECT_NEAR(dp.predicted_time, bf.predicted_time, 1e-9);
    const RecomputePlan re = evaluate(c, in, dp.modes, limit);
    EXPECT_TRUE(re.feasible);
    EXPECT_NEAR(re.predicted_time, dp.predicted_time, 1e-9);
    EXPECT_EQ(re.predicted_peak_bytes, dp.predicted_peak_bytes);
    EXPECT_LE(dp.predicted_peak_bytes, limit);
    for (StageMode m : dp.modes) {
      if (m != StageMode::KeepAll) {
        ++recomputing_optima;
        break;
      }
    }
  }
  // The random limits cover all regimes: nothing fits, recomputation needed, everything fits.
  EXPECT_GT(feasible_cases, 500);
  EXPECT_GT(infeasible_cases, 50);
  EXPECT_GT(recomputing_optima, 200);
  std::printf("brute force: %d feasible (%d with recomputation), %d infeasible\n", feasible_cases,
              recomputing_optima, infeasible_cases);
}

// Sizes with no common divisor and a huge limit force the rounded slot size: the plan must still
// fit in bytes and can only be as fast as or slower than the exact optimum.
TEST(RecomputePlan, RoundedSlotsStayWithinTheLimit) {
  std::mt19937 rng(99);
  std::uniform_int_distribution<int64_t> b(1000003, 90000007);
  int compared = 0;
  for (int trial = 0; trial < 200; ++trial) {
    const size_t L = 1 + static_cast<size_t>(trial % 7);
    auto c = random_chain(rng, L);
    for (auto& s : c) {
      s.saved_bytes = b(rng);
      s.output_bytes = b(rng);
    }
    const int64_t in = b(rng);
    const int64_t keep_all_peak = evaluate(c, in, std::vector<StageMode>(L, StageMode::KeepAll)).predicted_peak_bytes;
    const int64_t limit = std::uniform_int_distribution<int64_t>(least_peak(c, in), keep_all_peak)(rng);
    const RecomputePlan bf = brute_force(c, in, limit);
    const RecomputePlan dp = solve_optimal(c, in, limit);
    if (!bf.feasible) {
      EXPECT_FALSE(dp.feasible);
      continue;
    }
    if (!dp.feasible) continue;  // rounding may lose a plan right at the limit
    EXPECT_LE(dp.predicted_peak_bytes, limit);
    EXPECT_GE(dp.predicted_time, bf.predicted_time - 1e-9);
    EXPECT_NEAR(evaluate(c, in, dp.modes).predicted_time, dp.predicted_time, 1e-9);
    ++compared;
  }
  EXPECT_GT(compared, 100);
}

TEST(RecomputePlan, UnlimitedBudgetKeepsEverything) {
  std::mt19937 rng(7);
  const auto c = random_chain(rng, 12);
  const RecomputePlan p = solve_optimal(c, 1024, int64_t{1} << 40);
  ASSERT_TRUE(p.feasible);
  double sum = 0.0;
  for (const auto& s : c) sum += s.forward_time + s.backward_time;
  EXPECT_NEAR(p.predicted_time, sum, 1e-9);
  for (StageMode m : p.modes) EXPECT_EQ(m, StageMode::KeepAll);
  EXPECT_NE(p.str().find("keep-all"), std::string::npos);
}

TEST(RecomputePlan, TinyBudgetIsInfeasible) {
  std::mt19937 rng(8);
  const auto c = random_chain(rng, 6);
  const RecomputePlan p = solve_optimal(c, 4096, 100);
  EXPECT_FALSE(p.feasible);
  EXPECT_TRUE(p.modes.empty());
  EXPECT_TRUE(std::isinf(p.predicted_time));
  EXPECT_NE(p.reason.find("least peak"), std::string::npos) << p.reason;
  EXPECT_NE(p.str().find("infeasible"), std::string::npos);
}

TEST(RecomputePlan, NeverWorseThanSequential) {
  std::mt19937 rng(9);
  int compared = 0;
  for (int trial = 0; trial < 50; ++trial) {
    const size_t L = 4 + static_cast<size_t>(trial % 20);  // up to 23 stages
    const auto c = random_chain(rng, L);
    const int64_t in = 256 * 8;
    for (int n = 1; n <= static_cast<int>(L); ++n) {
      const RecomputePlan seq = evaluate(c, in, sequential_modes(L, n));
      ASSERT_TRUE(seq.feasible) << "sequential:" << n;
      const RecomputePlan opt = solve_optimal(c, in, seq.predicted_peak_bytes);
      ASSERT_TRUE(opt.feasible);
      EXPECT_LE(opt.predicted_time, seq.predicted_time + 1e-9) << "sequential:" << n;
      EXPECT_LE(opt.predicted_peak_bytes, seq.predicted_peak_bytes);
      ++compared;
    }
  }
  EXPECT_GT(compared, 500);
}

TEST(RecomputePlan, SequentialModesFollowCheckpointSequential) {
  using M = StageMode;
  EXPECT_EQ(sequential_modes(6, 3), (std::vector<M>{M::KeepInput, M::KeepNothing, M::KeepInput, M::KeepNothing,
                                                     M::KeepAll, M::KeepAll}));
  EXPECT_EQ(sequential_modes(3, 1), (std::vector<M>(3, M::KeepAll)));
  EXPECT_THROW(sequential_modes(3, 4), Error);
  EXPECT_THROW(sequential_modes(3, 0), Error);
}

TEST(RecomputePlan, BadInputIsRefused) {
  std::vector<ChainStage> ok(2, ChainStage{1.0, 2.0, 100, 100});
  auto expect_error = [](auto fn, const std::string& needle) {
    try {
      fn();
      ADD_FAILURE() << "no error, expected one mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error([] { solve_optimal({}, 10, 1000); }, "empty");
  auto neg_time = ok;
  neg_time[1].forward_time = -1.0;
  expect_error([&] { solve_optimal(neg_time, 10, 1000); }, "forward_time");
  auto neg_bwd = ok;
  neg_bwd[0].backward_time = std::nan("");
  expect_error([&] { evaluate(neg_bwd, 10, {StageMode::KeepAll, StageMode::KeepAll}); }, "backward_time");
  auto neg_saved = ok;
  neg_saved[0].saved_bytes = -5;
  expect_error([&] { solve_optimal(neg_saved, 10, 1000); }, "saved_bytes");
  auto neg_out = ok;
  neg_out[1].output_bytes = -5;
  expect_error([&] { solve_optimal(neg_out, 10, 1000); }, "output_bytes");
  expect_error([&] { solve_optimal(ok, -1, 1000); }, "input_bytes");
  expect_error([&] { solve_optimal(ok, 10, -1); }, "memory_limit");
  expect_error([&] { evaluate(ok, 10, {StageMode::KeepAll}); }, "modes");
  // An invalid assignment is reported, not thrown.
  const RecomputePlan bad = evaluate(ok, 10, {StageMode::KeepNothing, StageMode::KeepAll});
  EXPECT_FALSE(bad.feasible);
  EXPECT_NE(bad.reason.find("keeps nothing"), std::string::npos);
}

}  // namespace
}  // namespace minidl::nn
