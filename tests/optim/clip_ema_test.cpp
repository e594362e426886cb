// Gradient clipping by global norm (against torch.nn.utils.clip_grad_norm_ numbers and hand
// computation) and the EMA of the weights (values after a few updates, state round trip, errors):
// both run once per optimizer step in the training loop, so their exact numbers matter for resume.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "tests/support/error_of.h"
#include "core/autograd.h"
#include "core/error.h"
#include "core/tensor.h"
#include "optim/clip.h"
#include "optim/ema.h"

namespace minidl::optim {
namespace {

using ::minidl::testing::error_of;

void expect_values(const Tensor& t, const std::vector<double>& expected, double tol) {
  ASSERT_TRUE(t.defined());
  const std::vector<double> v = t.to_vector();
  ASSERT_EQ(v.size(), expected.size());
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(v[i], expected[i], tol) << "element " << i;
}

Tensor param(const std::vector<double>& v, const Shape& s, DType dtype = DType::f64) {
  Tensor t = from_vector(v, s, {.dtype = dtype});
  t.set_requires_grad(true);
  return t;
}

// Two parameters with gradients [3, -4] and [[1, 2], [-2, 10]], and a third without a gradient.
std::vector<Tensor> clip_params(DType dtype = DType::f64) {
  Tensor a = param({0.0, 0.0}, {2}, dtype);
  a.set_grad(from_vector({3.0, -4.0}, {2}, {.dtype = dtype}));
  Tensor b = param({0.0, 0.0, 0.0, 0.0}, {2, 2}, dtype);
  b.set_grad(from_vector({1.0, 2.0, -2.0, 10.0}, {2, 2}, {.dtype = dtype}));
  Tensor c = param({1.0, 1.0, 1.0}, {3}, dtype);
  return {a, b, c};
}

// The torch numbers come from Debian's /usr/bin/python3 (torch 1.13.0a0):
//   import torch
//   def mk():
//       a = torch.zeros(2, dtype=torch.float64, requires_grad=True); a.grad = torch.tensor([3.0, -4.0], dtype=torch.float64)
//       b = torch.zeros(2, 2, dtype=torch.float64, requires_grad=True)
//       b.grad = torch.tensor([[1.0, 2.0], [-2.0, 10.0]], dtype=torch.float64)
//       c = torch.zeros(3, dtype=torch.float64, requires_grad=True)  # no grad
//       return [a, b, c]
//   for max_norm, nt in [(2.0, 2.0), (100.0, 2.0), (4.0, float("inf")), (1.0, 1.0), (3.0, 3.0)]:
//       ps = mk(); n = torch.nn.utils.clip_grad_norm_(ps, max_norm, nt)
//       print(max_norm, nt, repr(n.item()), [p.grad.flatten().tolist() for p in ps[:2]])

TEST(ClipTest, TwoNormClipsAndReturnsThePreClipNorm) {
  auto ps = clip_params();
  const double total = clip_grad_norm(ps, 2.0);
  const double hand = std::sqrt(9.0 + 16.0 + 1.0 + 4.0 + 4.0 + 100.0);  // sqrt(134)
  EXPECT_NEAR(total, hand, 1e-12);
  EXPECT_NEAR(total, 11.575836902790225, 1e-12);  // torch
  const double coef = 2.0 / (hand + 1e-6);
  expect_values(ps[0].grad(), {3.0 * coef, -4.0 * coef}, 1e-14);
  expect_values(ps[1].grad(), {coef, 2.0 * coef, -2.0 * coef, 10.0 * coef}, 1e-14);
  // torch's clipped gradients
  expect_values(ps[0].grad(), {0.5183210105727005, -0.6910946807636007}, 1e-14);
  expect_values(ps[1].grad(), {0.17277367019090017, 0.34554734038180035, -0.34554734038180035, 1.7277367019090017},
                1e-14);
  EXPECT_FALSE(ps[2].grad().defined());  // skipped, not created
  // After clipping, the global norm is max_norm (up to the 1e-6 guard).
  EXPECT_NEAR(clip_grad_norm(ps, 1e9), 2.0, 1e-6);
}

TEST(ClipTest, NoClipWhenUnderTheLimit) {
  auto ps = clip_params();
  EXPECT_NEAR(clip_grad_norm(ps, 100.0), 11.575836902790225, 1e-12);
  expect_values(ps[0].grad(), {3.0, -4.0}, 0.0);
  expect_values(ps[1].grad(), {1.0, 2.0, -2.0, 10.0}, 0.0);
}

TEST(ClipTest, InfNormUsesTheLargestMagnitude) {
  auto ps = clip_params();
  const double total = clip_grad_norm(ps, 4.0, std::numeric_limits<double>::infinity());
  EXPECT_EQ(total, 10.0);
  const double coef = 4.0 / (10.0 + 1e-6);
  expect_values(ps[1].grad(), {coef, 2.0 * coef, -2.0 * coef, 10.0 * coef}, 1e-14);
  // torch
  expect_values(ps[0].grad(), {1.199999880000012, -1.5999998400000162}, 1e-14);
  expect_values(ps[1].grad(), {0.39999996000000404, 0.7999999200000081, -0.7999999200000081, 3.9999996000000406},
                1e-14);
  auto under = clip_params();
  EXPECT_EQ(clip_grad_norm(under, 10.5, std::numeric_limits<double>::infinity()), 10.0);
  expect_values(under[1].grad(), {1.0, 2.0, -2.0, 10.0}, 0.0);
}

TEST(ClipTest, OtherPNormsMatchTorch) {
  auto one = clip_params();
  EXPECT_NEAR(clip_grad_norm(one, 1.0, 1.0), 22.0, 1e-12);
  expect_values(one[0].grad(), {0.13636363016528952, -0.18181817355371938}, 1e-14);
  auto three = clip_params();
  const double hand = std::cbrt(27.0 + 64.0 + 1.0 + 8.0 + 8.0 + 1000.0);
  const double total = clip_grad_norm(three, 3.0, 3.0);
  EXPECT_NEAR(total, hand, 1e-12);
  EXPECT_NEAR(total, 10.347765704395021, 1e-12);
  expect_values(three[1].grad(), {0.28991763012262406, 0.5798352602452481, -0.5798352602452481, 2.8991763012262406},
                1e-13);
}

TEST(ClipTest, FloatGradients) {
  auto ps = clip_params(DType::f32);
  const double total = clip_grad_norm(ps, 2.0);
  EXPECT_NEAR(total, std::sqrt(134.0), 1e-5);
  EXPECT_EQ(ps[0].grad().dtype(), DType::f32);
  expect_values(ps[0].grad(), {0.5183210105727005, -0.6910946807636007}, 1e-6);
}

TEST(ClipTest, HalfGradientsAreWidenedForTheNorm) {
  // 300^2 overflows f16 (max 65504): the norm must still come out right.
  auto ps = clip_params(DType::f16);
  ps[1].set_grad(from_vector({300.0, 0.0, 0.0, 400.0}, {2, 2}, {.dtype = DType::f16}));
  const double total = clip_grad_norm(ps, 1.0);
  EXPECT_NEAR(total, std::sqrt(9.0 + 16.0 + 90000.0 + 160000.0), 1e-3);
  EXPECT_EQ(ps[1].grad().dtype(), DType::f16);
  expect_values(ps[1].grad(), {300.0 / total, 0.0, 0.0, 400.0 / total}, 1e-3);
}

TEST(ClipTest, NoGradientsGiveZeroAndLeaveNoGraph) {
  std::vector<Tensor> none = {param({1.0, 2.0}, {2})};
  EXPECT_EQ(clip_grad_norm(none, 1.0), 0.0);
  EXPECT_EQ(clip_grad_norm({}, 1.0), 0.0);
  auto ps = clip_params();
  clip_grad_norm(ps, 1.0);
  EXPECT_FALSE(ps[0].grad().requires_grad());
  EXPECT_EQ(ps[0].grad().grad_fn(), nullptr);
}

TEST(ClipTest, NonFiniteNormsFollowPyTorch) {
  const double inf = std::numeric_limits<double>::infinity();
  Tensor a = param({0.0, 0.0}, {2});
  a.set_grad(from_vector({inf, 1.0}, {2}, {.dtype = DType::f64}));
  // Default: no error; the coefficient max_norm / inf = 0 turns the gradients into NaN/0 like torch.
  EXPECT_EQ(clip_grad_norm({a}, 1.0), inf);
  const auto g = a.grad().to_vector();
  EXPECT_TRUE(std::isnan(g[0]));
  EXPECT_EQ(g[1], 0.0);

  Tensor b = param({0.0, 0.0}, {2});
  b.set_grad(from_vector({std::nan(""), 1.0}, {2}, {.dtype = DType::f64}));
  EXPECT_TRUE(std::isnan(clip_grad_norm({b}, 1.0)));
  EXPECT_TRUE(std::isnan(b.grad().to_vector()[1]));  // NaN coefficient propagates, as in torch

  Tensor c = param({0.0, 0.0}, {2});
  c.set_grad(from_vector({inf, 1.0}, {2}, {.dtype = DType::f64}));
  const std::string err = error_of([&] { clip_grad_norm({c}, 1.0, 2.0, /*error_if_nonfinite=*/true); });
  EXPECT_NE(err.find("clip_grad_norm"), std::string::npos);
  EXPECT_NE(err.find("non-finite"), std::string::npos);
  expect_values(c.grad().slice(0, 1, 2), {1.0}, 0.0);  // untouched when it throws
}

TEST(ClipTest, BadArguments) {
  auto ps = clip_params();
  EXPECT_NE(error_of([&] { clip_grad_norm(ps, -1.0); }).find("max_norm -1"), std::string::npos);
  EXPECT_NE(error_of([&] { clip_grad_norm(ps, 1.0, 0.0); }).find("norm_type 0 is not supported"), std::string::npos);
  EXPECT_NE(error_of([&] { clip_grad_norm(ps, 1.0, -std::numeric_limits<double>::infinity()); }).find("norm_type"),
            std::string::npos);
  EXPECT_NE(error_of([&] { clip_grad_norm({ps[0], ps[1], ps[0]}, 1.0); }).find("listed twice"), std::string::npos);
  EXPECT_NE(error_of([&] { clip_grad_norm({ps[0], Tensor()}, 1.0); }).find("parameter 1 is an undefined"),
            std::string::npos);
  expect_values(ps[0].grad(), {3.0, -4.0}, 0.0);  // errors leave the gradients alone
}

void set_values(Tensor& p, const std::vector<double>& v) {
  NoGradGuard no_grad;
  p.copy_(from_vector(v, p.shape(), {.dtype = p.dtype()}));
}

TEST(EmaTest, UpdatesFollowTheFormula) {
  Tensor w = param({1.0, 2.0}, {2});
  Tensor b = param({-1.0}, {1});
  Ema ema({w, b}, 0.9);
  EXPECT_EQ(ema.num_updates(), 0);
  EXPECT_EQ(ema.decay(), 0.9);
  expect_values(ema.shadows()[0], {1.0, 2.0}, 0.0);
  EXPECT_FALSE(ema.shadows()[0].requires_grad());

  // Hand computation, step by step: s = 0.9 s + 0.1 p.
  set_values(w, {3.0, 0.0});
  set_values(b, {1.0});
  ema.update();
  expect_values(ema.shadows()[0], {0.9 * 1.0 + 0.1 * 3.0, 0.9 * 2.0}, 1e-15);  // 1.2, 1.8
  expect_values(ema.shadows()[1], {-0.9 + 0.1}, 1e-15);                        // -0.8
  set_values(w, {5.0, -10.0});
  ema.update();
  expect_values(ema.shadows()[0], {0.9 * 1.2 + 0.5, 0.9 * 1.8 - 1.0}, 1e-14);  // 1.58, 0.62
  ema.update();  // params unchanged
  expect_values(ema.shadows()[0], {0.9 * 1.58 + 0.5, 0.9 * 0.62 - 1.0}, 1e-14);
  expect_values(ema.shadows()[1], {0.9 * (0.9 * -0.8 + 0.1) + 0.1}, 1e-14);
  EXPECT_EQ(ema.num_updates(), 3);
  // The parameters themselves are not touched by update().
  expect_values(w, {5.0, -10.0}, 0.0);

  Ema zero({w}, 0.0);  // decay 0 tracks the parameter exactly
  set_values(w, {7.0, 8.0});
  zero.update();
  expect_values(zero.shadows()[0], {7.0, 8.0}, 0.0);
}

TEST(EmaTest, FloatShadowsKeepTheDtypeAndHalfOnesAreWidened) {
  Tensor w = param({1.0, 2.0, 3.0}, {3}, DType::f32);
  Ema ema({w}, 0.5);
  set_values(w, {3.0, 4.0, 5.0});
  ema.update();
  EXPECT_EQ(ema.shadows()[0].dtype(), DType::f32);
  expect_values(ema.shadows()[0], {2.0, 3.0, 4.0}, 0.0);

  // f16 parameters get f32 shadows: 0.001 * 1 is below half an f16 ulp of 1 (2^-11), so an f16
  // average would stay at 1 forever; in f32 it moves by 0.001 per step.
  Tensor h = param({1.0}, {1}, DType::f16);
  Ema slow({h}, 0.999);
  EXPECT_EQ(slow.shadows()[0].dtype(), DType::f32);
  set_values(h, {2.0});
  slow.update();
  slow.update();
  expect_values(slow.shadows()[0], {2.0 - 0.999 * 0.999}, 1e-6);
  slow.copy_to({h});
  EXPECT_EQ(h.dtype(), DType::f16);
  expect_values(h, {1.001953125}, 0.0);  // 1.001999 rounded to f16 (ulp 2^-10 near 1)
}

TEST(EmaTest, CopyToWritesTheAverage) {
  Tensor w = param({0.0, 0.0}, {2});
  Ema ema({w}, 0.5);
  set_values(w, {4.0, 8.0});
  ema.update();
  ema.copy_to({w});
  expect_values(w, {2.0, 4.0}, 0.0);
  EXPECT_TRUE(w.requires_grad());  // still a trainable leaf
  Tensor other = param({0.0, 0.0, 0.0}, {3});
  EXPECT_NE(error_of([&] { ema.copy_to({other}); }).find("but its shadow is"), std::string::npos);
  EXPECT_NE(error_of([&] { ema.copy_to({w, w}); }).find("got 2 parameters but the Ema tracks 1"), std::string::npos);
}

TEST(EmaTest, StateRoundTripResumesExactly) {
  Tensor w = param({1.0, 2.0}, {2});
  Tensor b = param({3.0}, {1});
  Ema ema({w, b}, 0.99);
  for (int i = 0; i < 3; ++i) {
    set_values(w, {1.0 + i, 2.0 - i});
    ema.update();
  }
  const auto state = ema.state_dict();
  ASSERT_EQ(state.size(), 4u);
  EXPECT_EQ(state.at("num_updates").item(), 3.0);
  EXPECT_EQ(state.at("decay").item(), 0.99);
  // The state is a copy: later updates do not change it.
  ema.update();
  const std::vector<double> saved_w = state.at("shadow.0").to_vector();
  EXPECT_NE(saved_w, ema.shadows()[0].to_vector());

  Tensor w2 = param({0.0, 0.0}, {2});
  Tensor b2 = param({0.0}, {1});
  set_values(w2, w.to_vector());
  set_values(b2, b.to_vector());
  Ema resumed({w2, b2}, 0.99);
  resumed.load_state_dict(state);
  EXPECT_EQ(resumed.num_updates(), 3);
  expect_values(resumed.shadows()[0], saved_w, 0.0);
  resumed.update();  // continues exactly where the original went
  EXPECT_EQ(resumed.num_updates(), 4);
  EXPECT_EQ(resumed.shadows()[0].to_vector(), ema.shadows()[0].to_vector());
  EXPECT_EQ(resumed.shadows()[1].to_vector(), ema.shadows()[1].to_vector());
}

TEST(EmaTest, BadInputAndBadState) {
  Tensor w = param({1.0, 2.0}, {2});
  EXPECT_NE(error_of([&] { Ema({w}, 1.0); }).find("decay 1 must be in [0, 1)"), std::string::npos);
  EXPECT_NE(error_of([&] { Ema({w}, -0.1); }).find("decay -0.1"), std::string::npos);
  EXPECT_NE(error_of([&] { Ema({w, w}, 0.9); }).find("listed twice"), std::string::npos);
  EXPECT_NE(error_of([&] { Ema({Tensor()}, 0.9); }).find("undefined"), std::string::npos);

  Ema ema({w}, 0.9);
  auto state = ema.state_dict();
  Ema other_decay({w}, 0.5);
  EXPECT_NE(error_of([&] { other_decay.load_state_dict(state); }).find("construct the Ema with decay 0.9"),
            std::string::npos);
  auto missing = state;
  missing.erase("num_updates");
  EXPECT_NE(error_of([&] { ema.load_state_dict(missing); }).find("expects 3"), std::string::npos);
  auto renamed = missing;
  renamed["shadow.7"] = state.at("shadow.0");
  EXPECT_NE(error_of([&] { ema.load_state_dict(renamed); }).find("no 'num_updates'"), std::string::npos);
  auto wrong_shape = state;
  wrong_shape["shadow.0"] = zeros({3}, {.dtype = DType::f64});
  EXPECT_NE(error_of([&] { ema.load_state_dict(wrong_shape); }).find("'shadow.0' is f64[3]"), std::string::npos);
}

}  // namespace
}  // namespace minidl::optim
