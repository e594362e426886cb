// The autograd engine's contract, apart from any one op's formula: accumulation across backward
// calls (gradient accumulation depends on it), released graphs, no-grad mode, memory release of
// saved tensors, deep graphs, and the in-place rules.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "tests/support/error_of.h"
#include "core/allocator.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "core/tensor.h"

namespace minidl {
namespace {

Tensor leaf(const std::vector<double>& v, const Shape& s) {
  Tensor t = from_vector(v, s, {.dtype = DType::f64});
  t.set_requires_grad(true);
  return t;
}

void expect_values(const Tensor& t, const std::vector<double>& expected, double tol = 1e-12) {
  ASSERT_TRUE(t.defined());
  const std::vector<double> v = t.to_vector();
  ASSERT_EQ(v.size(), expected.size());
  for (size_t i = 0; i < v.size(); ++i) EXPECT_NEAR(v[i], expected[i], tol) << "element " << i;
}

using ::minidl::testing::error_of;

TEST(Autograd, GradientsAccumulateAcrossBackwardCalls) {
  Tensor x = leaf({1, 2, 3}, {3});
  sum(x * x).backward();
  expect_values(x.grad(), {2, 4, 6});
  sum(x * x).backward();
  expect_values(x.grad(), {4, 8, 12});
  sum(x * 3.0).backward();
  expect_values(x.grad(), {7, 11, 15});
  x.zero_grad();
  EXPECT_FALSE(x.grad().defined());
  sum(x).backward();
  expect_values(x.grad(), {1, 1, 1});
}

TEST(Autograd, BackwardWithExplicitGradientForNonScalar) {
  Tensor x = leaf({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor y = x * x;
  y.backward(from_vector({1, 0, -1, 2, 0.5, 3}, {2, 3}, {.dtype = DType::f64}));
  expect_values(x.grad(), {2, 0, -6, 16, 5, 36});
}

TEST(Autograd, NonScalarBackwardWithoutGradientThrows) {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor y = x * 2.0;
  const std::string msg = error_of([&] { y.backward(); });
  EXPECT_NE(msg.find("scalar"), std::string::npos) << msg;
}

TEST(Autograd, SecondBackwardThroughReleasedGraphThrows) {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor y = sum(exp(x) * x);
  y.backward();
  const std::vector<double> once = x.grad().to_vector();
  const std::string msg = error_of([&] { y.backward(); });
  EXPECT_NE(msg.find("retain_graph"), std::string::npos) << "second backward gave: '" << msg << "'";
  // The failed call must not have half-accumulated into the leaf.
  expect_values(x.grad(), once);
}

TEST(Autograd, RetainGraphAllowsSecondBackwardAndDoublesGrad) {
  Tensor x = leaf({0.5, -1, 2}, {3});
  Tensor y = sum(exp(x) * x);
  y.backward(Tensor(), /*retain_graph=*/true);
  const std::vector<double> once = x.grad().to_vector();
  y.backward(Tensor(), /*retain_graph=*/true);
  std::vector<double> twice(once);
  for (auto& v : twice) v *= 2;
  expect_values(x.grad(), twice);
  // The third call releases the graph; a fourth then fails.
  y.backward();
  EXPECT_THROW(y.backward(), Error);
}

TEST(Autograd, NoGradGuardPreventsRecording) {
  Tensor x = leaf({1, 2}, {2});
  EXPECT_TRUE(grad_enabled());
  {
    NoGradGuard guard;
    EXPECT_FALSE(grad_enabled());
    Tensor y = exp(x) * x + 1.0;
    EXPECT_FALSE(y.requires_grad());
    EXPECT_EQ(y.grad_fn(), nullptr);
    {
      NoGradGuard nested;
      EXPECT_FALSE(grad_enabled());
    }
    EXPECT_FALSE(grad_enabled());  // the nested guard restores the outer state, not "on"
    Tensor v = x.view({2, 1});
    EXPECT_EQ(v.grad_fn(), nullptr);
  }
  EXPECT_TRUE(grad_enabled());
  Tensor z = x * 2.0;
  EXPECT_TRUE(z.requires_grad());
  EXPECT_NE(z.grad_fn(), nullptr);
  EXPECT_FALSE(z.is_leaf());
}

TEST(Autograd, OpsOnTensorsWithoutGradRecordNothing) {
  Tensor a = from_vector({1, 2}, {2}, {.dtype = DType::f64});
  Tensor b = exp(a) * a;
  EXPECT_FALSE(b.requires_grad());
  EXPECT_EQ(b.grad_fn(), nullptr);
}

TEST(Autograd, Detach) {
  Tensor x = leaf({1, 2, 3}, {3});
  Tensor d = x.detach();
  EXPECT_FALSE(d.requires_grad());
  EXPECT_EQ(d.grad_fn(), nullptr);
  EXPECT_EQ(d.data_ptr(), x.data_ptr());  // shares storage
  Tensor y = x * 2.0;
  Tensor yd = y.detach();
  EXPECT_FALSE(yd.requires_grad());
  EXPECT_EQ(yd.grad_fn(), nullptr);
  EXPECT_TRUE(yd.is_leaf());
  // A detached operand is a constant: d(x * detach(x))/dx = x, not 2x.
  sum(x * d).backward();
  expect_values(x.grad(), {1, 2, 3});
}

TEST(Autograd, DiamondGraphSumsGradients) {
  Tensor x = leaf({1, -2, 0.5}, {3});
  Tensor a = x * 3.0;
  Tensor b = x * 4.0;
  sum(a * b).backward();  // 12 x^2 -> 24 x
  expect_values(x.grad(), {24, -48, 12});
  x.zero_grad();
  Tensor c = exp(x);
  sum(c + c * c).backward();  // e^x + e^2x -> e^x + 2 e^2x
  std::vector<double> expected;
  for (double v : {1.0, -2.0, 0.5}) expected.push_back(std::exp(v) + 2 * std::exp(2 * v));
  expect_values(x.grad(), expected, 1e-10);
}

// One tensor delivered twice to the same input (an add's backward gives x + x's gradient to both of
// its inputs, which are x): the engine adds it to itself.
TEST(Autograd, ATensorUsedTwiceByOneOpGetsBothGradients) {
  Tensor x = leaf({1, -2, 0.5}, {3});
  sum(x + x).backward();
  expect_values(x.grad(), {2, 2, 2});
  x.zero_grad();
  sum((x + x) * 3.0).backward();
  expect_values(x.grad(), {6, 6, 6});
}

TEST(Autograd, DeepChainDoesNotOverflowTheStack) {
  Tensor x = leaf({1.0}, {1});
  Tensor y = x;
  for (int i = 0; i < 10000; ++i) y = y * 1.0001;
  sum(y).backward();
  expect_values(x.grad(), {std::pow(1.0001, 10000)}, 1e-9);
  // Dropping a deep graph that was never run must not recurse either.
  Tensor z = x;
  for (int i = 0; i < 10000; ++i) z = z + 1.0;
  z = Tensor();
  y = Tensor();
  SUCCEED();
}

TEST(Autograd, MemoryReturnsToBaselineAfterGraphAndOutputsAreDropped) {
  Tensor x = leaf(std::vector<double>(4096, 0.5), {4096});
  const int64_t baseline = memory_stats(Device::cpu()).allocated_bytes;
  {
    Tensor h = tanh(exp(x) * x);
    Tensor y = sum(h * h);
    EXPECT_GT(memory_stats(Device::cpu()).allocated_bytes, baseline);
    y.backward();
  }
  ASSERT_TRUE(x.grad().defined());
  EXPECT_EQ(memory_stats(Device::cpu()).allocated_bytes - baseline, static_cast<int64_t>(x.grad().nbytes()))
      << "only x.grad should remain";
  x.zero_grad();
  EXPECT_EQ(memory_stats(Device::cpu()).allocated_bytes, baseline);
}

TEST(Autograd, ReleasedGraphFreesSavedActivations) {
  // The root stays alive (it owns the graph); only the saved tensors should go with a release.
  Tensor x = leaf(std::vector<double>(8192, 0.25), {8192});
  const int64_t baseline = memory_stats(Device::cpu()).allocated_bytes;
  int64_t released = 0, retained = 0;
  {
    Tensor y = sum(tanh(exp(x) * x));
    y.backward();
    released = memory_stats(Device::cpu()).allocated_bytes - baseline;
  }
  x.zero_grad();
  {
    Tensor y = sum(tanh(exp(x) * x));
    y.backward(Tensor(), /*retain_graph=*/true);
    retained = memory_stats(Device::cpu()).allocated_bytes - baseline;
  }
  x.zero_grad();
  EXPECT_LT(released, retained);
  // exp's output and tanh's output (or input) are each 8192 doubles: at least one must go.
  EXPECT_GE(retained - released, static_cast<int64_t>(8192 * sizeof(double)));
  EXPECT_EQ(memory_stats(Device::cpu()).allocated_bytes, baseline);
}

TEST(Autograd, InPlaceOnLeafRequiringGradThrowsUnlessNoGrad) {
  Tensor x = leaf({1, 2, 3}, {3});
  const Tensor other = from_vector({1, 1, 1}, {3}, {.dtype = DType::f64});
  EXPECT_THROW(x.add_(other), Error);
  EXPECT_THROW(x.mul_(other), Error);
  EXPECT_THROW(x.mul_(2.0), Error);
  EXPECT_THROW(x.fill_(0.0), Error);
  EXPECT_THROW(x.zero_(), Error);
  EXPECT_THROW(x.copy_(other), Error);
  expect_values(x, {1, 2, 3});  // a refused op changes nothing
  {
    NoGradGuard guard;
    x.add_(other, 2.0);  // the optimizer's update path
    expect_values(x, {3, 4, 5});
    x.mul_(2.0);
    expect_values(x, {6, 8, 10});
    x.mul_(other);
    expect_values(x, {6, 8, 10});
    x.copy_(from_vector({7, 8, 9}, {3}, {.dtype = DType::f64}));
    expect_values(x, {7, 8, 9});
    x.zero_();
    expect_values(x, {0, 0, 0});
  }
  EXPECT_TRUE(x.requires_grad());
  EXPECT_TRUE(x.is_leaf());
}

TEST(Autograd, LeafWithoutRequiresGradGetsNoGrad) {
  Tensor x = leaf({1, 2}, {2});
  Tensor c = from_vector({3, 4}, {2}, {.dtype = DType::f64});
  sum(x * c).backward();
  expect_values(x.grad(), {3, 4});
  EXPECT_FALSE(c.grad().defined());
}

TEST(Autograd, GradOfNonContiguousLeafHasItsShape) {
  Tensor base = from_vector({1, 2, 3, 4, 5, 6}, {2, 3}, {.dtype = DType::f64});
  Tensor xt = base.t();
  xt.set_requires_grad(true);
  ASSERT_TRUE(xt.is_leaf());
  sum(xt * from_vector({1, 2, 3, 4, 5, 6}, {3, 2}, {.dtype = DType::f64})).backward();
  ASSERT_EQ(xt.grad().shape(), (Shape{3, 2}));
  expect_values(xt.grad(), {1, 2, 3, 4, 5, 6});
}

TEST(Autograd, GradFnHasAName) {
  Tensor x = leaf({1, 2}, {2});
  Tensor y = exp(x);
  ASSERT_NE(y.grad_fn(), nullptr);
  EXPECT_FALSE(y.grad_fn()->name().empty());
}


// The post-accumulate hook sees the leaf's whole gradient for the pass (both uses summed) once per
// backward; data-parallel training starts its allreduce there.
TEST(Autograd, PostAccumulateGradHookSeesTheFinalGradientOncePerBackward) {
  Tensor w = from_vector({1.0, 2.0}, {2}).set_requires_grad(true);
  std::vector<std::vector<double>> seen;
  const uint64_t id = w.register_post_accumulate_grad_hook([&](const Tensor& leaf) {
    seen.push_back(leaf.grad().to_vector());
  });
  Tensor y = sum(w * w) + sum(w * 3.0);  // two uses of w: 2w + 3
  y.backward();
  ASSERT_EQ(seen.size(), 1u);
  EXPECT_EQ(seen[0], (std::vector<double>{5.0, 7.0}));
  sum(w).backward();  // accumulates: the hook sees the running .grad
  ASSERT_EQ(seen.size(), 2u);
  EXPECT_EQ(seen[1], (std::vector<double>{6.0, 8.0}));
  w.remove_post_accumulate_grad_hook(id);
  sum(w).backward();
  EXPECT_EQ(seen.size(), 2u);
  Tensor x = from_vector({1.0}, {1});
  EXPECT_THROW(x.register_post_accumulate_grad_hook([](const Tensor&) {}), Error);
}

// A backward under GradHooksOffGuard (recomputation's profile) accumulates the gradient but tells
// no hook; the guard ends with its scope.
TEST(Autograd, GradHooksOffGuardSilencesThePostAccumulateHooks) {
  Tensor w = from_vector({1.0, 2.0}, {2}).set_requires_grad(true);
  int calls = 0;
  w.register_post_accumulate_grad_hook([&](const Tensor&) { ++calls; });
  {
    GradHooksOffGuard off;
    EXPECT_FALSE(grad_hooks_enabled());
    sum(w * 3.0).backward();
  }
  EXPECT_EQ(calls, 0);
  EXPECT_EQ(w.grad().to_vector(), (std::vector<double>{3.0, 3.0}));
  EXPECT_TRUE(grad_hooks_enabled());
  sum(w).backward();
  EXPECT_EQ(calls, 1);
}

// An op y = k * x whose backward, with add_into, adds its gradient into the one already waiting for
// x (pending_grad) and returns that tensor; `seen` records the memory pending_grad gave it (null:
// none), without holding the tensor.
Tensor scaled(const Tensor& x, double k, bool add_into, const void** seen) {
  Tensor y = empty(x.shape(), x.options());
  {
    NoGradGuard no_grad;
    y = x.detach() * k;
  }
  record("scaled", {x}, {y}, [k, add_into, seen](const std::vector<Tensor>& g) {
    Tensor waiting = add_into ? pending_grad(0) : Tensor();
    if (seen != nullptr) *seen = waiting.defined() ? waiting.data_ptr() : nullptr;
    if (!waiting.defined()) return std::vector<Tensor>{g[0] * k};
    waiting.add_(g[0], k);
    return std::vector<Tensor>{waiting};
  });
  return y;
}

// x feeds two ops; the later-created one runs first in the backward and delivers a fresh gradient,
// which the other then finds waiting, adds into in place, and returns: the engine adds nothing and
// x.grad is the sum. Where the waiting gradient is shared (the same tensor delivered to two
// inputs, as an add's backward does), pending_grad gives nothing and the engine adds as before.
TEST(Autograd, ABackwardMayAddIntoTheGradientAlreadyWaitingForItsInput) {
  Tensor x = leaf({1, -2, 0.5}, {3});
  const void* seen = nullptr;
  const Tensor b = scaled(x, 3.0, true, &seen);   // created first: runs last
  const Tensor a = scaled(x, 2.0, false, nullptr);
  sum(a * 1.0 + b * 10.0).backward();
  expect_values(x.grad(), {32, 32, 32});
  ASSERT_NE(seen, nullptr) << "the gradient a's backward delivered was waiting, held by nothing else";
  EXPECT_EQ(seen, x.grad().data_ptr()) << "added into in place and taken by x.grad without a copy";

  // a's backward returns its incoming gradient, which the sum's backward gave to both a and b (the
  // same tensor): b must not write into it.
  Tensor y = leaf({1, 2, 3}, {3});
  const void* seen2 = &seen2;
  const Tensor d = scaled(y, 3.0, true, &seen2);
  Tensor c = empty({3});
  {
    NoGradGuard no_grad;
    c = y.detach().clone();
  }
  record("identity", {y}, {c}, [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
  sum(c + d).backward();
  expect_values(y.grad(), {4, 4, 4});
  EXPECT_EQ(seen2, nullptr) << "a gradient another input also holds is not offered";
  EXPECT_FALSE(pending_grad(0).defined()) << "outside a backward";
}

}  // namespace
}  // namespace minidl
