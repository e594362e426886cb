// Finite-difference gradient checks in f64 for every tensor-level op with a backward (the design's
// rule for ops; the network ops are in gradcheck_nn_test.cpp). Each op is checked with broadcasting,
// several dims and non-contiguous inputs, the paths where hand-written backwards go wrong.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/generator.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "tests/support/gradcheck.h"
#include "tests/support/gradcheck_builders.h"

namespace minidl {
namespace {

using testing::distinct_f64;
using testing::gradcheck;
using testing::plain;
using testing::rand_f64;
using testing::random_shape;
using testing::signed_away_from_zero;
using testing::strided_leaf;
using testing::transposed_leaf;
using V = std::vector<Tensor>;
using Builder = std::function<Tensor(const Shape&, uint64_t)>;
using UnaryFn = std::function<Tensor(const Tensor&)>;
using BinaryFn = std::function<Tensor(const Tensor&, const Tensor&)>;

Tensor positive(const Shape& s, uint64_t seed) { return rand_f64(s, seed, 0.3, 2.0); }
Tensor nonzero(const Shape& s, uint64_t seed) { return signed_away_from_zero(s, seed); }
// Multiples of 0.1 (shift 0) or of 0.1 plus 0.05 (shift true): a value of one family is never
// within 0.05 of the other's, so maximum/minimum have no ties.
Tensor grid(const Shape& s, uint64_t seed, bool shift) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> k(-10, 10);
  std::vector<double> v(static_cast<size_t>(numel_of(s)));
  for (auto& x : v) x = 0.1 * k(rng) + (shift ? 0.05 : 0.0);
  Tensor t = from_vector(v, s, {.dtype = DType::f64});
  t.set_requires_grad(true);
  return t;
}

// A shape that broadcasts with `a`: some leading dims dropped, some dims set to 1.
Shape broadcast_partner(const Shape& a, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const size_t drop = static_cast<size_t>(rng() % a.size());
  Shape b(a.begin() + static_cast<int64_t>(drop), a.end());
  for (auto& d : b) {
    if (rng() % 3 == 0) d = 1;
  }
  return b;
}

void check_unary(const UnaryFn& op, const Builder& make) {
  const auto f = [op](const V& in) { return op(in[0]); };
  {
    SCOPED_TRACE("contiguous [3, 4]");
    EXPECT_GRADCHECK(f, {make({3, 4}, 1)});
  }
  for (uint64_t seed : {11u, 12u}) {
    const Shape s = random_shape(seed, 3, 1, 4);
    SCOPED_TRACE("random shape " + shape_str(s));
    EXPECT_GRADCHECK(f, {make(s, seed)});
  }
  {
    SCOPED_TRACE("transposed view [3, 4]");
    EXPECT_GRADCHECK(f, {transposed_leaf(make({3, 4}, 2))});
  }
  {
    SCOPED_TRACE("strided view [2, 3] (step 2)");
    EXPECT_GRADCHECK(f, {strided_leaf(make({2, 3}, 3))});
  }
  {
    SCOPED_TRACE("0-d");
    EXPECT_GRADCHECK(f, {make({}, 4)});
  }
}

void check_binary(const BinaryFn& op, const Builder& make_a, const Builder& make_b) {
  const auto f = [op](const V& in) { return op(in[0], in[1]); };
  {
    SCOPED_TRACE("same shape [3, 4]");
    EXPECT_GRADCHECK(f, {make_a({3, 4}, 1), make_b({3, 4}, 2)});
  }
  {
    SCOPED_TRACE("[3, 1, 4] with [2, 1]");
    EXPECT_GRADCHECK(f, {make_a({3, 1, 4}, 3), make_b({2, 1}, 4)});
  }
  {
    SCOPED_TRACE("[2, 1] with [3, 1, 4]");
    EXPECT_GRADCHECK(f, {make_a({2, 1}, 5), make_b({3, 1, 4}, 6)});
  }
  {
    SCOPED_TRACE("[2, 3] with 0-d");
    EXPECT_GRADCHECK(f, {make_a({2, 3}, 7), make_b({}, 8)});
  }
  for (uint64_t seed : {21u, 22u, 23u}) {
    const Shape sa = random_shape(seed, 3, 1, 4);
    const Shape sb = broadcast_partner(sa, seed + 100);
    SCOPED_TRACE("random shapes " + shape_str(sa) + " with " + shape_str(sb));
    EXPECT_GRADCHECK(f, {make_a(sa, seed), make_b(sb, seed + 1)});
  }
  {
    SCOPED_TRACE("transposed [3, 4] with strided [3, 4]");
    EXPECT_GRADCHECK(f, {transposed_leaf(make_a({3, 4}, 9)), strided_leaf(make_b({3, 4}, 10))});
  }
  {
    SCOPED_TRACE("transposed [2, 3, 4] with transposed [3, 1]");
    EXPECT_GRADCHECK(f, {transposed_leaf(make_a({2, 3, 4}, 11)), transposed_leaf(make_b({3, 1}, 12))});
  }
  {
    SCOPED_TRACE("the same tensor on both sides");
    const auto g = [op](const V& in) { return op(in[0], in[0] * 0.5 + 3.0); };
    EXPECT_GRADCHECK(g, {make_a({2, 3}, 13)});
  }
}

// ---- The checker itself: a gradcheck that cannot fail proves nothing ----

// y = 2x, with a backward that returns `scale` * g (correct only for scale 2), recorded by hand.
Tensor doubled_with_backward(const Tensor& x, std::function<Tensor(const Tensor&)> backward) {
  Tensor out;
  {
    NoGradGuard no_grad;
    out = x * 2.0;
  }
  record("doubled_for_test", {x}, {out}, [backward](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{backward(g[0])};
  });
  return out;
}

TEST(GradcheckSelfTest, AcceptsACorrectBackward) {
  const auto r = gradcheck(
      [](const V& in) { return doubled_with_backward(in[0], [](const Tensor& g) { return g * 2.0; }); },
      {plain({2, 3}, 1)});
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_EQ(r.num_checked, 6);
  EXPECT_LT(r.max_abs_diff, 1e-8);
}

TEST(GradcheckSelfTest, RejectsAWrongBackwardAndNamesTheElement) {
  const auto r = gradcheck(
      [](const V& in) { return doubled_with_backward(in[0], [](const Tensor& g) { return g * 3.0; }); },
      {plain({2, 3}, 1)});
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("input 0"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("element 0 [0, 0]"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("analytic"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("numeric"), std::string::npos) << r.message;
}

TEST(GradcheckSelfTest, RejectsAWrongBackwardThroughANonContiguousInput) {
  // One wrong element of a transposed input: the report must give its logical index [1, 2]
  // (linear 6), not its storage offset (7).
  const auto f = [](const V& in) {
    return doubled_with_backward(in[0], [](const Tensor& g) {
      Tensor bump = zeros(g.shape(), g.options());
      {
        NoGradGuard no_grad;
        bump.select(0, 1).select(0, 2).fill_(1.0);
      }
      return g * 2.0 + bump;
    });
  };
  const auto r = gradcheck(f, {transposed_leaf(plain({3, 4}, 1))});
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("element 6 [1, 2]"), std::string::npos) << r.message;
  EXPECT_NE(r.message.find("1 of 12"), std::string::npos) << r.message;
}

TEST(GradcheckSelfTest, RejectsANondeterministicBackward) {
  auto calls = std::make_shared<int>(0);
  const auto r = gradcheck(
      [calls](const V& in) {
        return doubled_with_backward(in[0], [calls](const Tensor& g) { return g * (2.0 + 1e-13 * ++*calls); });
      },
      {plain({3}, 1)});
  EXPECT_FALSE(r.ok);
  EXPECT_NE(r.message.find("disagree"), std::string::npos) << r.message;
}

TEST(GradcheckSelfTest, RefusesBadInputs) {
  const auto id = [](const V& in) { return in[0] * 1.0; };
  Tensor f32_leaf = zeros({2});
  f32_leaf.set_requires_grad(true);
  EXPECT_NE(gradcheck(id, {f32_leaf}).message.find("not f64"), std::string::npos);
  const Tensor non_leaf = plain({2}, 1) * 2.0;
  EXPECT_NE(gradcheck(id, {non_leaf}).message.find("not a leaf"), std::string::npos);
  Tensor expanded = rand_f64({1, 3}, 2, -1, 1, false).expand({2, 3});
  expanded.set_requires_grad(true);
  EXPECT_NE(gradcheck(id, {expanded}).message.find("stride 0"), std::string::npos);
}

TEST(GradcheckSelfTest, NonContiguousBuildersAreNonContiguousLeavesWithTheSameValues) {
  const Tensor x = plain({2, 3, 4}, 1);
  for (const Tensor& v : {transposed_leaf(x), strided_leaf(x)}) {
    EXPECT_FALSE(v.is_contiguous()) << shape_str(v.strides());
    EXPECT_TRUE(v.is_leaf());
    EXPECT_TRUE(v.requires_grad());
    EXPECT_EQ(v.shape(), x.shape());
    EXPECT_EQ(v.to_vector(), x.to_vector());
  }
}

TEST(GradcheckSelfTest, UncheckedInputsAreLeftAloneAndCheckedOnesHoldTheGradient) {
  const Tensor x = plain({2, 2}, 1);
  const Tensor c = rand_f64({2, 2}, 2, -1, 1, false);
  const std::vector<double> c_before = c.to_vector();
  const auto r = gradcheck([](const V& in) { return in[0] * in[1]; }, {x, c});
  EXPECT_TRUE(r.ok) << r.message;
  EXPECT_FALSE(c.grad().defined());
  EXPECT_EQ(c.to_vector(), c_before);
  ASSERT_TRUE(x.grad().defined());
  // Calling it again gives the same result: grads are cleared, not accumulated, between runs.
  const std::vector<double> g1 = x.grad().to_vector();
  const auto r2 = gradcheck([](const V& in) { return in[0] * in[1]; }, {x, c});
  EXPECT_TRUE(r2.ok) << r2.message;
  EXPECT_EQ(x.grad().to_vector(), g1);
  EXPECT_EQ(r.max_abs_diff, r2.max_abs_diff);
}

// ---- Elementwise binary ----

TEST(GradcheckElementwise, Add) { check_binary([](const Tensor& a, const Tensor& b) { return add(a, b); }, plain, plain); }
TEST(GradcheckElementwise, Sub) { check_binary([](const Tensor& a, const Tensor& b) { return sub(a, b); }, plain, plain); }
TEST(GradcheckElementwise, Mul) { check_binary([](const Tensor& a, const Tensor& b) { return mul(a, b); }, plain, plain); }
TEST(GradcheckElementwise, Div) { check_binary([](const Tensor& a, const Tensor& b) { return div(a, b); }, plain, nonzero); }
TEST(GradcheckElementwise, Maximum) {
  check_binary([](const Tensor& a, const Tensor& b) { return maximum(a, b); },
               [](const Shape& s, uint64_t seed) { return grid(s, seed, false); },
               [](const Shape& s, uint64_t seed) { return grid(s, seed, true); });
}
TEST(GradcheckElementwise, Minimum) {
  check_binary([](const Tensor& a, const Tensor& b) { return minimum(a, b); },
               [](const Shape& s, uint64_t seed) { return grid(s, seed, false); },
               [](const Shape& s, uint64_t seed) { return grid(s, seed, true); });
}
TEST(GradcheckElementwise, Operators) {
  check_binary([](const Tensor& a, const Tensor& b) { return (a + b) * a - b / (a * a + 1.0); }, plain, plain);
}
TEST(GradcheckElementwise, ScalarOperands) {
  const Tensor x = nonzero({3, 4}, 1);
  EXPECT_GRADCHECK([](const V& in) { return in[0] + 2.0; }, {x});
  EXPECT_GRADCHECK([](const V& in) { return in[0] - 2.0; }, {x});
  EXPECT_GRADCHECK([](const V& in) { return in[0] * 3.0; }, {x});
  EXPECT_GRADCHECK([](const V& in) { return in[0] / 3.0; }, {x});
  EXPECT_GRADCHECK([](const V& in) { return 2.0 + in[0]; }, {x});
  EXPECT_GRADCHECK([](const V& in) { return 2.0 - in[0]; }, {x});
  EXPECT_GRADCHECK([](const V& in) { return 3.0 * in[0]; }, {x});
  EXPECT_GRADCHECK([](const V& in) { return 3.0 / in[0]; }, {x});
  EXPECT_GRADCHECK([](const V& in) { return -in[0]; }, {x});
  EXPECT_GRADCHECK([](const V& in) { return 3.0 / in[0]; }, {transposed_leaf(x)});
}

// ---- Elementwise unary ----

TEST(GradcheckUnary, Neg) { check_unary([](const Tensor& x) { return neg(x); }, plain); }
TEST(GradcheckUnary, Exp) { check_unary([](const Tensor& x) { return exp(x); }, plain); }
TEST(GradcheckUnary, Log) { check_unary([](const Tensor& x) { return log(x); }, positive); }
TEST(GradcheckUnary, Log1p) {
  check_unary([](const Tensor& x) { return log1p(x); }, [](const Shape& s, uint64_t seed) { return rand_f64(s, seed, -0.6, 2.0); });
}
TEST(GradcheckUnary, Sqrt) { check_unary([](const Tensor& x) { return sqrt(x); }, positive); }
TEST(GradcheckUnary, Abs) { check_unary([](const Tensor& x) { return abs(x); }, nonzero); }
TEST(GradcheckUnary, Relu) { check_unary([](const Tensor& x) { return relu(x); }, nonzero); }
TEST(GradcheckUnary, Sigmoid) {
  check_unary([](const Tensor& x) { return sigmoid(x); }, [](const Shape& s, uint64_t seed) { return rand_f64(s, seed, -4, 4); });
}
TEST(GradcheckUnary, Tanh) {
  check_unary([](const Tensor& x) { return tanh(x); }, [](const Shape& s, uint64_t seed) { return rand_f64(s, seed, -2, 2); });
}
TEST(GradcheckUnary, Square) { check_unary([](const Tensor& x) { return square(x); }, plain); }

TEST(GradcheckUnary, PowPositiveBase) {
  for (double e : {2.0, 3.0, 0.5, -1.5, 1.7, 1.0}) {
    SCOPED_TRACE("exponent " + std::to_string(e));
    check_unary([e](const Tensor& x) { return pow(x, e); }, positive);
  }
}
TEST(GradcheckUnary, PowIntegerExponentNegativeBase) {
  for (double e : {2.0, 3.0, -2.0}) {
    SCOPED_TRACE("exponent " + std::to_string(e));
    check_unary([e](const Tensor& x) { return pow(x, e); }, nonzero);
  }
}

TEST(GradcheckUnary, Composition) {
  // A chain of several ops through one input: checks the engine's accumulation, not one formula.
  EXPECT_GRADCHECK([](const V& in) { return tanh(exp(in[0]) * sigmoid(in[0])) + square(relu(in[0])) / (abs(in[0]) + 1.0); },
                   {nonzero({2, 5}, 7)});
}

// ---- Reductions ----

struct ReduceCase {
  std::vector<int64_t> dims;
  bool keepdim;
};
const std::vector<ReduceCase> kReduceCases = {
    {{}, false}, {{}, true}, {{0}, false}, {{1}, true}, {{-1}, false}, {{2}, true}, {{0, 2}, false}, {{0, 2}, true},
    {{0, 1, 2}, false}, {{-1, 0}, true}};

std::string reduce_trace(const ReduceCase& c) {
  std::string s = "dims [";
  for (size_t i = 0; i < c.dims.size(); ++i) s += (i ? ", " : "") + std::to_string(c.dims[i]);
  return s + "] keepdim " + (c.keepdim ? "true" : "false");
}

using ReduceFn = std::function<Tensor(const Tensor&, const std::vector<int64_t>&, bool)>;
void check_reduce(const ReduceFn& op, const Builder& make) {
  for (const auto& c : kReduceCases) {
    SCOPED_TRACE(reduce_trace(c));
    const auto f = [op, c](const V& in) { return op(in[0], c.dims, c.keepdim); };
    EXPECT_GRADCHECK(f, {make({2, 3, 4}, 1)});
    EXPECT_GRADCHECK(f, {transposed_leaf(make({2, 3, 4}, 2))});
    EXPECT_GRADCHECK(f, {strided_leaf(make({3, 2, 3}, 3))});
  }
  for (uint64_t seed : {31u, 32u}) {
    const Shape s = random_shape(seed, 3, 1, 4);
    SCOPED_TRACE("random shape " + shape_str(s));
    EXPECT_GRADCHECK([op](const V& in) { return op(in[0], {1}, false); }, {make(s, seed)});
  }
  {
    SCOPED_TRACE("1-D all dims");
    EXPECT_GRADCHECK([op](const V& in) { return op(in[0], {}, false); }, {make({5}, 4)});
  }
}

TEST(GradcheckReduce, Sum) {
  check_reduce([](const Tensor& x, const std::vector<int64_t>& d, bool k) { return sum(x, d, k); }, plain);
}
TEST(GradcheckReduce, Mean) {
  check_reduce([](const Tensor& x, const std::vector<int64_t>& d, bool k) { return mean(x, d, k); }, plain);
}
TEST(GradcheckReduce, Max) {
  check_reduce([](const Tensor& x, const std::vector<int64_t>& d, bool k) { return max(x, d, k); },
               [](const Shape& s, uint64_t seed) { return distinct_f64(s, seed); });
}
TEST(GradcheckReduce, Min) {
  check_reduce([](const Tensor& x, const std::vector<int64_t>& d, bool k) { return min(x, d, k); },
               [](const Shape& s, uint64_t seed) { return distinct_f64(s, seed); });
}

TEST(GradcheckReduce, TiesSplitTheGradientEvenly) {
  // Not differentiable at a tie, so not a finite-difference case: the documented rule instead.
  Tensor x = from_vector({1, 3, 3, 2}, {4}, {.dtype = DType::f64});
  x.set_requires_grad(true);
  max(x).backward();
  EXPECT_EQ(x.grad().to_vector(), (std::vector<double>{0, 0.5, 0.5, 0}));
  Tensor y = from_vector({4, 1, 1, 1}, {2, 2}, {.dtype = DType::f64});
  y.set_requires_grad(true);
  min(y, {1}).backward(ones({2}, {.dtype = DType::f64}));
  EXPECT_EQ(y.grad().to_vector(), (std::vector<double>{0, 1, 0.5, 0.5}));
}

TEST(GradcheckElementwise, MaximumMinimumTieRule) {
  // At a tie the gradient is split evenly between the operands, as PyTorch does (the comment on
  // maximum in core/ops.h, "gradient to a where a >= b", predates this and is stale).
  Tensor a = from_vector({1, 2, 3}, {3}, {.dtype = DType::f64});
  Tensor b = from_vector({1, 5, 0}, {3}, {.dtype = DType::f64});
  a.set_requires_grad(true);
  b.set_requires_grad(true);
  sum(maximum(a, b)).backward();
  EXPECT_EQ(a.grad().to_vector(), (std::vector<double>{0.5, 0, 1}));
  EXPECT_EQ(b.grad().to_vector(), (std::vector<double>{0.5, 1, 0}));
  a.zero_grad();
  b.zero_grad();
  sum(minimum(a, b)).backward();
  EXPECT_EQ(a.grad().to_vector(), (std::vector<double>{0.5, 1, 0}));
  EXPECT_EQ(b.grad().to_vector(), (std::vector<double>{0.5, 0, 1}));
}

TEST(GradcheckReduce, SumTo) {
  const std::vector<Shape> targets = {{3, 1}, {1, 4}, {4}, {2, 1, 4}, {3, 4}, {2, 3, 4}, {1, 1, 1}, {}};
  for (const auto& t : targets) {
    SCOPED_TRACE("[2, 3, 4] to " + shape_str(t));
    EXPECT_GRADCHECK([t](const V& in) { return sum_to(in[0], t); }, {plain({2, 3, 4}, 1)});
    EXPECT_GRADCHECK([t](const V& in) { return sum_to(in[0], t); }, {transposed_leaf(plain({2, 3, 4}, 2))});
  }
}

// ---- Linear algebra ----

void check_matmul(const Shape& sa, const Shape& sb, uint64_t seed) {
  SCOPED_TRACE("matmul " + shape_str(sa) + " x " + shape_str(sb));
  EXPECT_GRADCHECK([](const V& in) { return matmul(in[0], in[1]); }, {plain(sa, seed), plain(sb, seed + 1)});
}

TEST(GradcheckLinalg, Matmul2D) {
  check_matmul({3, 4}, {4, 5}, 1);
  check_matmul({1, 4}, {4, 1}, 3);
  for (uint64_t seed : {41u, 42u}) {
    const Shape s = random_shape(seed, 3, 1, 5);
    check_matmul({s[0], s[1]}, {s[1], s[2]}, seed);
  }
}
TEST(GradcheckLinalg, MatmulBatched) {
  check_matmul({2, 3, 4}, {2, 4, 5}, 1);
  check_matmul({2, 2, 3, 4}, {2, 2, 4, 2}, 3);
}
TEST(GradcheckLinalg, MatmulBroadcastBatch) {
  check_matmul({2, 1, 3, 4}, {3, 4, 5}, 1);
  check_matmul({3, 4}, {2, 4, 5}, 3);
  check_matmul({2, 3, 4}, {4, 5}, 5);
  check_matmul({1, 3, 4}, {2, 4, 2}, 7);
}
TEST(GradcheckLinalg, MatmulOneDimensional) {
  check_matmul({4}, {4, 5}, 1);
  check_matmul({3, 4}, {4}, 3);
  check_matmul({4}, {4}, 5);
  check_matmul({2, 3, 4}, {4}, 7);
  check_matmul({4}, {2, 4, 5}, 9);
}
TEST(GradcheckLinalg, MatmulNonContiguous) {
  const auto f = [](const V& in) { return matmul(in[0], in[1]); };
  EXPECT_GRADCHECK(f, {transposed_leaf(plain({3, 4}, 1)), plain({4, 5}, 2)});
  EXPECT_GRADCHECK(f, {plain({3, 4}, 3), transposed_leaf(plain({4, 5}, 4))});
  EXPECT_GRADCHECK(f, {strided_leaf(plain({3, 4}, 5)), strided_leaf(plain({4, 2}, 6))});
  EXPECT_GRADCHECK(f, {transposed_leaf(plain({2, 3, 4}, 7)), strided_leaf(plain({2, 4, 3}, 8))});
  // A transpose taken inside f: the backward must handle a non-contiguous operand it made itself.
  EXPECT_GRADCHECK([](const V& in) { return matmul(in[0].t(), in[1]); }, {plain({4, 3}, 9), plain({4, 2}, 10)});
  EXPECT_GRADCHECK([](const V& in) { return matmul(in[0], in[0].t()); }, {plain({3, 4}, 11)});
}

TEST(GradcheckLinalg, LinearWithBias) {
  EXPECT_GRADCHECK([](const V& in) { return linear(in[0], in[1], in[2]); },
                   {plain({5, 4}, 1), plain({3, 4}, 2), plain({3}, 3)});
}
TEST(GradcheckLinalg, LinearWithoutBias) {
  EXPECT_GRADCHECK([](const V& in) { return linear(in[0], in[1]); }, {plain({5, 4}, 1), plain({3, 4}, 2)});
}
TEST(GradcheckLinalg, Linear3DInput) {
  EXPECT_GRADCHECK([](const V& in) { return linear(in[0], in[1], in[2]); },
                   {plain({2, 3, 4}, 1), plain({5, 4}, 2), plain({5}, 3)});
  EXPECT_GRADCHECK([](const V& in) { return linear(in[0], in[1]); }, {transposed_leaf(plain({2, 3, 4}, 4)), plain({5, 4}, 5)});
}
TEST(GradcheckLinalg, LinearNonContiguousWeight) {
  EXPECT_GRADCHECK([](const V& in) { return linear(in[0], in[1], in[2]); },
                   {strided_leaf(plain({5, 4}, 1)), transposed_leaf(plain({3, 4}, 2)), strided_leaf(plain({3}, 3))});
}
TEST(GradcheckLinalg, Linear1DInput) {
  EXPECT_GRADCHECK([](const V& in) { return linear(in[0], in[1], in[2]); }, {plain({4}, 1), plain({3, 4}, 2), plain({3}, 3)});
}

// ---- Views ----

TEST(GradcheckViews, Reshape) {
  EXPECT_GRADCHECK([](const V& in) { return in[0].reshape({6, 4}); }, {plain({2, 3, 4}, 1)});
  EXPECT_GRADCHECK([](const V& in) { return in[0].reshape({4, -1}); }, {plain({2, 3, 4}, 2)});
  // A non-contiguous input cannot be viewed: reshape copies, and the copy must be differentiable.
  EXPECT_GRADCHECK([](const V& in) { return in[0].reshape({12}); }, {transposed_leaf(plain({3, 4}, 3))});
  EXPECT_GRADCHECK([](const V& in) { return in[0].reshape({2, 3}) * in[0].reshape({3, 2}).t(); }, {plain({6}, 4)});
}
TEST(GradcheckViews, View) {
  EXPECT_GRADCHECK([](const V& in) { return in[0].view({4, 6}); }, {plain({2, 3, 4}, 1)});
  EXPECT_GRADCHECK([](const V& in) { return in[0].view({-1}); }, {plain({2, 3, 4}, 2)});
  // A contiguous view at a non-zero storage offset (rows 1..2 of a [4, 6] buffer).
  Tensor rows = rand_f64({4, 6}, 3, -1.0, 1.0, false).slice(0, 1, 3);
  rows.set_requires_grad(true);
  EXPECT_GRADCHECK([](const V& in) { return in[0].view({3, 4}); }, {rows});
}
TEST(GradcheckViews, Slice) {
  EXPECT_GRADCHECK([](const V& in) { return in[0].slice(1, 1, 6, 2); }, {plain({4, 7}, 1)});
  EXPECT_GRADCHECK([](const V& in) { return in[0].slice(0, 1, 3); }, {plain({4, 7}, 2)});
  EXPECT_GRADCHECK([](const V& in) { return in[0].slice(2, 0, 4, 3); }, {transposed_leaf(plain({2, 3, 5}, 3))});
  // Overlapping slices of one input: their gradients must add up.
  EXPECT_GRADCHECK([](const V& in) { return in[0].slice(1, 0, 4) * in[0].slice(1, 1, 5) + in[0].slice(1, 2, 6, 1); },
                   {plain({3, 6}, 4)});
}
TEST(GradcheckViews, Select) {
  EXPECT_GRADCHECK([](const V& in) { return in[0].select(1, 2); }, {plain({2, 4, 3}, 1)});
  EXPECT_GRADCHECK([](const V& in) { return in[0].select(0, 0) * in[0].select(0, 1); }, {plain({2, 5}, 2)});
  EXPECT_GRADCHECK([](const V& in) { return in[0].select(2, 1); }, {transposed_leaf(plain({2, 3, 4}, 3))});
}
TEST(GradcheckViews, Permute) {
  EXPECT_GRADCHECK([](const V& in) { return in[0].permute({2, 0, 1}); }, {plain({2, 3, 4}, 1)});
  EXPECT_GRADCHECK([](const V& in) { return in[0].permute({1, 2, 0}) * 2.0; }, {transposed_leaf(plain({2, 3, 4}, 2))});
}
TEST(GradcheckViews, Transpose) {
  EXPECT_GRADCHECK([](const V& in) { return in[0].transpose(0, 2); }, {plain({2, 3, 4}, 1)});
  EXPECT_GRADCHECK([](const V& in) { return in[0].t(); }, {plain({3, 5}, 2)});
  EXPECT_GRADCHECK([](const V& in) { return in[0].t() + in[1]; }, {plain({3, 5}, 3), plain({5, 3}, 4)});
}
TEST(GradcheckViews, Expand) {
  EXPECT_GRADCHECK([](const V& in) { return in[0].expand({3, 4}); }, {plain({3, 1}, 1)});
  EXPECT_GRADCHECK([](const V& in) { return in[0].expand({-1, 4}); }, {plain({3, 1}, 2)});
  EXPECT_GRADCHECK([](const V& in) { return in[0].expand({2, 3, 4}); }, {plain({3, 1}, 3)});
  EXPECT_GRADCHECK([](const V& in) { return in[0].expand({2, 3}) * in[1]; }, {plain({1, 3}, 4), plain({2, 3}, 5)});
}
TEST(GradcheckViews, UnsqueezeSqueeze) {
  EXPECT_GRADCHECK([](const V& in) { return in[0].unsqueeze(1); }, {plain({3, 4}, 1)});
  EXPECT_GRADCHECK([](const V& in) { return in[0].unsqueeze(0) * in[1]; }, {plain({3, 4}, 2), plain({2, 1, 4}, 3)});
  EXPECT_GRADCHECK([](const V& in) { return in[0].squeeze(1); }, {plain({3, 1, 4}, 4)});
  EXPECT_GRADCHECK([](const V& in) { return in[0].squeeze(1); }, {transposed_leaf(plain({3, 1, 4}, 5))});
}
TEST(GradcheckViews, Flatten) {
  EXPECT_GRADCHECK([](const V& in) { return in[0].flatten(); }, {plain({2, 3, 4}, 1)});
  EXPECT_GRADCHECK([](const V& in) { return in[0].flatten(1); }, {plain({2, 3, 4}, 2)});
  EXPECT_GRADCHECK([](const V& in) { return in[0].flatten(0, 1); }, {plain({2, 3, 4}, 3)});
  EXPECT_GRADCHECK([](const V& in) { return in[0].flatten(1); }, {transposed_leaf(plain({2, 3, 4}, 4))});
}
TEST(GradcheckViews, Contiguous) {
  EXPECT_GRADCHECK([](const V& in) { return in[0].contiguous(); }, {transposed_leaf(plain({3, 4}, 1))});
  EXPECT_GRADCHECK([](const V& in) { return in[0].contiguous(); }, {strided_leaf(plain({3, 4}, 2))});
  EXPECT_GRADCHECK([](const V& in) { return in[0].t().contiguous() * 2.0; }, {plain({3, 4}, 3)});
}
TEST(GradcheckViews, ContiguousOfContiguousReturnsDifferentiableSelf) {
  // contiguous() may return the input itself: backward from a leaf root must still fill its grad.
  EXPECT_GRADCHECK([](const V& in) { return in[0].contiguous(); }, {plain({3, 4}, 1)});
}
TEST(GradcheckViews, Clone) {
  EXPECT_GRADCHECK([](const V& in) { return in[0].clone(); }, {plain({3, 4}, 1)});
  EXPECT_GRADCHECK([](const V& in) { return in[0].clone(); }, {transposed_leaf(plain({3, 4}, 2))});
}

// ---- Conversions ----

TEST(GradcheckConvert, ToF32AndBack) {
  // Through f32 the function is only f32-accurate: a larger step and looser tolerances.
  EXPECT_GRADCHECK([](const V& in) { return in[0].to(DType::f32).to(DType::f64); }, {plain({3, 4}, 1)}, 1e-2, 1e-4, 1e-3);
  EXPECT_GRADCHECK([](const V& in) { return (in[0].to(DType::f32) * in[0].to(DType::f32)).to(DType::f64); },
                   {transposed_leaf(plain({3, 4}, 2))}, 1e-2, 1e-3, 1e-3);
}
TEST(GradcheckConvert, ToDevice) {
  EXPECT_GRADCHECK([](const V& in) { return in[0].to(Device::cpu()) * 2.0; }, {plain({3, 4}, 1)});
  EXPECT_GRADCHECK([](const V& in) { return in[0].to(Device::cpu()); }, {transposed_leaf(plain({3, 4}, 2))});
}
TEST(GradcheckConvert, ToSameDtype) {
  EXPECT_GRADCHECK([](const V& in) { return in[0].to(DType::f64) * 2.0; }, {plain({3, 4}, 1)});
  EXPECT_GRADCHECK([](const V& in) { return in[0].to(DType::f64); }, {plain({3, 4}, 2)});
}

}  // namespace
}  // namespace minidl
