// Finite-difference gradient checks in f64 for every op with a backward (the design's rule for
// ops). Each op is checked with broadcasting, several dims and at least one non-contiguous input
// where that applies, because those are the paths where hand-written backwards go wrong.
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

namespace minidl {
namespace {

using testing::distinct_f64;
using testing::gradcheck;
using testing::rand_f64;
using testing::random_labels;
using testing::random_shape;
using testing::signed_away_from_zero;
using testing::strided_leaf;
using testing::transposed_leaf;
using V = std::vector<Tensor>;
using Builder = std::function<Tensor(const Shape&, uint64_t)>;
using UnaryFn = std::function<Tensor(const Tensor&)>;
using BinaryFn = std::function<Tensor(const Tensor&, const Tensor&)>;

#define EXPECT_GRADCHECK(...)                                          \
  do {                                                                 \
    const auto gc_result_ = ::minidl::testing::gradcheck(__VA_ARGS__); \
    EXPECT_TRUE(gc_result_.ok) << gc_result_.message;                  \
  } while (0)

Tensor plain(const Shape& s, uint64_t seed) { return rand_f64(s, seed); }
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

// ---- Convolution ----

void check_conv(const Shape& xs, const Shape& ws, bool with_bias, const Conv2dOptions& o, uint64_t seed) {
  SCOPED_TRACE("conv2d x " + shape_str(xs) + " w " + shape_str(ws) + (with_bias ? " bias" : " no bias") + " stride " +
               std::to_string(o.stride[0]) + "," + std::to_string(o.stride[1]) + " pad " + std::to_string(o.padding[0]) +
               "," + std::to_string(o.padding[1]) + " dil " + std::to_string(o.dilation[0]) + "," +
               std::to_string(o.dilation[1]) + " groups " + std::to_string(o.groups));
  if (with_bias) {
    EXPECT_GRADCHECK([o](const V& in) { return conv2d(in[0], in[1], in[2], o); },
                     {plain(xs, seed), plain(ws, seed + 1), plain({ws[0]}, seed + 2)});
  } else {
    EXPECT_GRADCHECK([o](const V& in) { return conv2d(in[0], in[1], Tensor(), o); }, {plain(xs, seed), plain(ws, seed + 1)});
  }
}

TEST(GradcheckConv, Basic) {
  check_conv({2, 3, 5, 5}, {4, 3, 3, 3}, true, {}, 1);
  check_conv({1, 2, 4, 4}, {3, 2, 1, 1}, false, {}, 4);
}
TEST(GradcheckConv, StridePadding) {
  check_conv({2, 2, 6, 5}, {3, 2, 3, 3}, true, {.stride = {2, 2}, .padding = {1, 1}}, 1);
  check_conv({1, 2, 5, 6}, {2, 2, 3, 3}, false, {.stride = {2, 1}, .padding = {0, 2}}, 4);
}
TEST(GradcheckConv, Dilation) {
  check_conv({1, 2, 7, 6}, {3, 2, 3, 2}, true, {.padding = {1, 1}, .dilation = {2, 2}}, 1);
  check_conv({2, 2, 6, 7}, {2, 2, 2, 3}, false, {.stride = {1, 2}, .dilation = {1, 2}}, 4);
}
TEST(GradcheckConv, NonSquareEverything) {
  check_conv({2, 3, 6, 5}, {4, 3, 3, 2}, true, {.stride = {2, 1}, .padding = {1, 2}, .dilation = {1, 2}}, 1);
}
// Grouped convolution is outside this version's scope (ResNets need groups = 1); until it exists
// the op must refuse it clearly rather than compute something else.
TEST(GradcheckConv, GroupsAreRefusedClearly) {
  try {
    conv2d(zeros({1, 4, 5, 5}, {.dtype = DType::f64}), zeros({6, 2, 3, 3}, {.dtype = DType::f64}), Tensor(),
           {.padding = {1, 1}, .groups = 2});
    FAIL() << "expected minidl::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("groups=2 is not supported"), std::string::npos) << e.what();
  }
}
TEST(GradcheckConv, NonContiguousInputs) {
  const Conv2dOptions o{.stride = {2, 1}, .padding = {1, 1}};
  const auto f = [o](const V& in) { return conv2d(in[0], in[1], in[2], o); };
  EXPECT_GRADCHECK(f, {transposed_leaf(plain({2, 2, 5, 4}, 1)), plain({3, 2, 3, 3}, 2), plain({3}, 3)});
  EXPECT_GRADCHECK(f, {strided_leaf(plain({1, 2, 5, 4}, 4)), strided_leaf(plain({3, 2, 3, 2}, 5)), strided_leaf(plain({3}, 6))});
  // NHWC-style memory, as a channels-last caller would pass it.
  EXPECT_GRADCHECK([o](const V& in) { return conv2d(in[0].permute({0, 3, 1, 2}), in[1], in[2], o); },
                   {plain({2, 5, 4, 2}, 7), plain({3, 2, 3, 3}, 8), plain({3}, 9)});
}

// ---- Pooling ----

void check_pool(bool is_max, const Shape& xs, const Pool2dOptions& o, uint64_t seed) {
  SCOPED_TRACE(std::string(is_max ? "max_pool2d" : "avg_pool2d") + " x " + shape_str(xs) + " kernel " +
               std::to_string(o.kernel[0]) + "," + std::to_string(o.kernel[1]) + " stride " + std::to_string(o.stride[0]) +
               "," + std::to_string(o.stride[1]) + " pad " + std::to_string(o.padding[0]) + "," +
               std::to_string(o.padding[1]) + (o.ceil_mode ? " ceil" : "") +
               (o.count_include_pad ? "" : " count_include_pad=false"));
  const auto f = [o, is_max](const V& in) { return is_max ? max_pool2d(in[0], o) : avg_pool2d(in[0], o); };
  // Distinct values keep the max-pool argmax stable under a perturbation of eps.
  EXPECT_GRADCHECK(f, {distinct_f64(xs, seed)});
  EXPECT_GRADCHECK(f, {transposed_leaf(distinct_f64(xs, seed + 1))});
}

TEST(GradcheckPool, MaxPool) {
  check_pool(true, {2, 2, 6, 6}, {.kernel = {2, 2}}, 1);
  check_pool(true, {1, 2, 7, 6}, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}}, 3);
  check_pool(true, {1, 2, 5, 5}, {.kernel = {2, 2}, .stride = {2, 2}, .ceil_mode = true}, 5);
  check_pool(true, {1, 2, 5, 7}, {.kernel = {2, 3}, .stride = {1, 2}, .padding = {1, 1}}, 7);
  check_pool(true, {1, 1, 6, 6}, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}, .ceil_mode = true}, 9);
}
TEST(GradcheckPool, AvgPool) {
  check_pool(false, {2, 2, 6, 6}, {.kernel = {2, 2}}, 1);
  check_pool(false, {1, 2, 5, 5}, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}}, 3);
  check_pool(false, {1, 2, 5, 5}, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}, .count_include_pad = false}, 5);
  check_pool(false, {1, 2, 5, 5}, {.kernel = {2, 2}, .stride = {2, 2}, .ceil_mode = true}, 7);
  check_pool(false, {1, 2, 6, 5}, {.kernel = {3, 2}, .stride = {2, 2}, .padding = {1, 1}, .ceil_mode = true}, 9);
  check_pool(false, {1, 2, 6, 5},
             {.kernel = {3, 2}, .stride = {2, 2}, .padding = {1, 1}, .ceil_mode = true, .count_include_pad = false}, 11);
  check_pool(false, {1, 1, 7, 6}, {.kernel = {3, 3}, .stride = {1, 2}}, 13);
}
TEST(GradcheckPool, AdaptiveAvgPool) {
  EXPECT_GRADCHECK([](const V& in) { return adaptive_avg_pool2d(in[0]); }, {plain({2, 3, 4, 5}, 1)});
  EXPECT_GRADCHECK([](const V& in) { return adaptive_avg_pool2d(in[0], {1, 1}); }, {transposed_leaf(plain({2, 3, 3, 2}, 2))});
}

// ---- Normalisation and regularisation ----

TEST(GradcheckNorm, BatchNormTrainingWithAffine) {
  const auto f = [](const V& in) {
    const int64_t c = in[0].size(1);
    return batch_norm(in[0], in[1], in[2], zeros({c}, {.dtype = DType::f64}), ones({c}, {.dtype = DType::f64}), true);
  };
  EXPECT_GRADCHECK(f, {plain({4, 3, 2, 2}, 1), rand_f64({3}, 2, 0.5, 1.5), plain({3}, 3)});
  EXPECT_GRADCHECK(f, {plain({6, 3}, 4), rand_f64({3}, 5, 0.5, 1.5), plain({3}, 6)});
  EXPECT_GRADCHECK(f, {plain({3, 2, 4}, 7), rand_f64({2}, 8, 0.5, 1.5), plain({2}, 9)});
  EXPECT_GRADCHECK(f, {transposed_leaf(plain({4, 3, 2, 2}, 10)), rand_f64({3}, 11, 0.5, 1.5), plain({3}, 12)});
}
TEST(GradcheckNorm, BatchNormTrainingWithoutAffine) {
  EXPECT_GRADCHECK([](const V& in) { return batch_norm(in[0], Tensor(), Tensor(), Tensor(), Tensor(), true); },
                   {plain({4, 3, 2, 2}, 1)});
  EXPECT_GRADCHECK([](const V& in) { return batch_norm(in[0], Tensor(), in[1], Tensor(), Tensor(), true); },
                   {plain({5, 2}, 2), plain({2}, 3)});
}
TEST(GradcheckNorm, BatchNormTrainingRunningStatsGetNoGrad) {
  // The running statistics are updated in place on every evaluation; they are inputs without
  // requires_grad, and gradcheck verifies they receive no .grad.
  const Tensor rm = zeros({3}, {.dtype = DType::f64});
  const Tensor rv = ones({3}, {.dtype = DType::f64});
  EXPECT_GRADCHECK([](const V& in) { return batch_norm(in[0], in[1], in[2], in[3], in[4], true, 0.1, 1e-5); },
                   {plain({4, 3, 2, 2}, 1), rand_f64({3}, 2, 0.5, 1.5), plain({3}, 3), rm, rv});
}
TEST(GradcheckNorm, BatchNormEval) {
  const Tensor rm = rand_f64({3}, 10, -0.5, 0.5, false);
  const Tensor rv = rand_f64({3}, 11, 0.5, 2.0, false);
  EXPECT_GRADCHECK([](const V& in) { return batch_norm(in[0], in[1], in[2], in[3], in[4], false); },
                   {plain({4, 3, 2, 2}, 1), rand_f64({3}, 2, 0.5, 1.5), plain({3}, 3), rm, rv});
  EXPECT_GRADCHECK([](const V& in) { return batch_norm(in[0], Tensor(), Tensor(), in[1], in[2], false); },
                   {plain({4, 3, 2, 2}, 4), rm, rv});
  EXPECT_GRADCHECK([](const V& in) { return batch_norm(in[0], Tensor(), in[1], in[2], in[3], false); },
                   {transposed_leaf(plain({5, 3}, 5)), plain({3}, 6), rm, rv});
}

TEST(GradcheckNorm, Dropout) {
  // A fresh Generator with the same seed in every evaluation: the mask is the same each time.
  const auto f = [](const V& in) {
    Generator g(1234);
    return dropout(in[0], 0.3, true, &g);
  };
  EXPECT_GRADCHECK(f, {plain({4, 5}, 1)});
  EXPECT_GRADCHECK(f, {transposed_leaf(plain({3, 6}, 2))});
  EXPECT_GRADCHECK([](const V& in) { return dropout(in[0], 0.5, false); }, {plain({4, 5}, 3)});
  // The mask is not trivial (some kept, some dropped) and is the same for the same seed.
  Generator g1(1234), g2(1234);
  const Tensor x = ones({200}, {.dtype = DType::f64});
  const std::vector<double> a = dropout(x, 0.3, true, &g1).to_vector();
  const std::vector<double> b = dropout(x, 0.3, true, &g2).to_vector();
  EXPECT_EQ(a, b);
  int zeros_seen = 0;
  for (double v : a) {
    if (v == 0.0) {
      ++zeros_seen;
    } else {
      EXPECT_NEAR(v, 1.0 / 0.7, 1e-12);
    }
  }
  EXPECT_GT(zeros_seen, 20);
  EXPECT_LT(zeros_seen, 100);
}

// ---- Softmax and losses ----

TEST(GradcheckSoftmax, Softmax) {
  for (int64_t d : {0, 1, 2, -1}) {
    SCOPED_TRACE("dim " + std::to_string(d));
    EXPECT_GRADCHECK([d](const V& in) { return softmax(in[0], d); }, {plain({3, 4, 5}, 1)});
    EXPECT_GRADCHECK([d](const V& in) { return softmax(in[0], d); }, {transposed_leaf(plain({3, 4, 5}, 2))});
  }
  EXPECT_GRADCHECK([](const V& in) { return softmax(in[0], 0); }, {plain({6}, 3)});
  EXPECT_GRADCHECK([](const V& in) { return softmax(in[0], 1); }, {strided_leaf(plain({2, 5}, 4))});
  const Shape s = random_shape(51, 3, 1, 5);
  EXPECT_GRADCHECK([](const V& in) { return softmax(in[0], 1); }, {plain(s, 5)});
}
TEST(GradcheckSoftmax, LogSoftmax) {
  for (int64_t d : {0, 1, 2, -1}) {
    SCOPED_TRACE("dim " + std::to_string(d));
    EXPECT_GRADCHECK([d](const V& in) { return log_softmax(in[0], d); }, {plain({3, 4, 5}, 1)});
    EXPECT_GRADCHECK([d](const V& in) { return log_softmax(in[0], d); }, {transposed_leaf(plain({3, 4, 5}, 2))});
  }
  EXPECT_GRADCHECK([](const V& in) { return log_softmax(in[0], 0); }, {plain({6}, 3)});
  // Large logits: the stable formulation must not lose the gradient.
  EXPECT_GRADCHECK([](const V& in) { return log_softmax(in[0] * 30.0, 1); }, {plain({2, 5}, 4)});
}

const char* reduction_name(Reduction r) {
  switch (r) {
    case Reduction::None: return "none";
    case Reduction::Mean: return "mean";
    case Reduction::Sum: return "sum";
  }
  return "?";
}

TEST(GradcheckLoss, CrossEntropy) {
  const Tensor target = random_labels(5, 4, 1);
  for (double smoothing : {0.0, 0.1}) {
    for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
      SCOPED_TRACE(std::string("reduction ") + reduction_name(r) + " label_smoothing " + std::to_string(smoothing));
      const auto f = [r, smoothing](const V& in) { return cross_entropy(in[0], in[1], r, smoothing); };
      EXPECT_GRADCHECK(f, {rand_f64({5, 4}, 2, -2, 2), target});
      EXPECT_GRADCHECK(f, {transposed_leaf(rand_f64({5, 4}, 3, -2, 2)), target});
    }
  }
}
TEST(GradcheckLoss, NllLoss) {
  const Tensor target = random_labels(5, 4, 1);
  for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
    SCOPED_TRACE(std::string("reduction ") + reduction_name(r));
    EXPECT_GRADCHECK([r](const V& in) { return nll_loss(in[0], in[1], r); }, {plain({5, 4}, 2), target});
    EXPECT_GRADCHECK([r](const V& in) { return nll_loss(log_softmax(in[0], 1), in[1], r); },
                     {transposed_leaf(plain({5, 4}, 3)), target});
  }
}
TEST(GradcheckLoss, BinaryCrossEntropyWithLogits) {
  const Tensor target = rand_f64({3, 4}, 1, 0.0, 1.0, false);
  for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
    SCOPED_TRACE(std::string("reduction ") + reduction_name(r));
    const auto f = [r](const V& in) { return binary_cross_entropy_with_logits(in[0], in[1], r); };
    EXPECT_GRADCHECK(f, {rand_f64({3, 4}, 2, -3, 3), target});
    EXPECT_GRADCHECK(f, {transposed_leaf(rand_f64({3, 4}, 3, -3, 3)), target});
    // Large logits of both signs: the stable form must keep the gradient sigmoid(x) - t.
    EXPECT_GRADCHECK([r](const V& in) { return binary_cross_entropy_with_logits(in[0] * 20.0, in[1], r); },
                     {rand_f64({3, 4}, 4, -2, 2), target});
  }
}
TEST(GradcheckLoss, BinaryCrossEntropyWithLogitsTargetGrad) {
  // PyTorch differentiates this loss with respect to the target too (soft labels, distillation).
  EXPECT_GRADCHECK([](const V& in) { return binary_cross_entropy_with_logits(in[0], in[1]); },
                   {rand_f64({3, 4}, 1, -3, 3), rand_f64({3, 4}, 2, 0.0, 1.0)});
}

}  // namespace
}  // namespace minidl
