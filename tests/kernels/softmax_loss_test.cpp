// Softmax / log-softmax and the losses on the CPU backend, against plain f64 reference
// computations written here, plus finite-difference checks of the backward nodes and the error
// messages users see for the usual mistakes (bad targets, wrong shapes and dtypes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/generator.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "tests/support/gradcheck.h"
#include "tests/support/norm_loss_helpers.h"

namespace minidl {
namespace {

using namespace testing::norm_loss;   // the suite's helpers

// ---------------------------------------------------------------------------------------------
// Calls f with the flat indices of every line along dim d of a row-major tensor of `shape`: the
// walk both references below share.
template <class F>
void for_each_line(const Shape& shape, int64_t d, F&& f) {
  int64_t outer = 1, inner = 1;
  const int64_t C = shape[d];
  for (int64_t i = 0; i < d; ++i) outer *= shape[i];
  for (size_t i = static_cast<size_t>(d) + 1; i < shape.size(); ++i) inner *= shape[i];
  std::vector<size_t> line(static_cast<size_t>(C));
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k = 0; k < inner; ++k) {
      for (int64_t c = 0; c < C; ++c) line[static_cast<size_t>(c)] = static_cast<size_t>((o * C + c) * inner + k);
      f(line);
    }
}

// Softmax reference along dim d of a row-major tensor.
void softmax_ref(const Vec& x, const Shape& shape, int64_t d, Vec& sm, Vec& lsm) {
  sm.assign(x.size(), 0.0);
  lsm.assign(x.size(), 0.0);
  for_each_line(shape, d, [&](const std::vector<size_t>& line) {
    double mx = -INFINITY;
    for (size_t at : line) mx = std::max(mx, x[at]);
    double s = 0;
    for (size_t at : line) s += std::exp(x[at] - mx);
    for (size_t at : line) {
      sm[at] = std::exp(x[at] - mx) / s;
      lsm[at] = x[at] - mx - std::log(s);
    }
  });
}

// Gradients of sum(softmax * r) and sum(log_softmax * r) along dim d.
void softmax_grad_ref(const Vec& sm, const Vec& r, const Shape& shape, int64_t d, Vec& g_sm, Vec& g_lsm) {
  g_sm.assign(sm.size(), 0.0);
  g_lsm.assign(sm.size(), 0.0);
  for_each_line(shape, d, [&](const std::vector<size_t>& line) {
    double dot = 0, rs = 0;
    for (size_t at : line) {
      dot += sm[at] * r[at];
      rs += r[at];
    }
    for (size_t at : line) {
      g_sm[at] = sm[at] * (r[at] - dot);
      g_lsm[at] = r[at] - sm[at] * rs;
    }
  });
}

TEST(SoftmaxTest, ForwardAndBackwardAlongEveryDim) {
  const std::vector<Shape> shapes{{5, 7}, {3, 4, 5}, {2, 3, 4, 5}, {3, 130, 2}};
  for (DType dt : {DType::f64, DType::f32}) {
    const double tol = dt == DType::f32 ? 2e-6 : 1e-13;
    for (const Shape& shape : shapes) {
      const int64_t nd = static_cast<int64_t>(shape.size());
      for (int64_t dim : {int64_t{0}, int64_t{1}, int64_t{-1}}) {
        const int64_t d = dim < 0 ? dim + nd : dim;
        const std::string what = shape_str(shape) + " dim " + std::to_string(dim) + " " + dtype_name(dt);
        const size_t n = static_cast<size_t>(numel_of(shape));
        Tensor x = make(random_vals(n, 20 + n, 3.0), shape, dt, true);
        const Vec xv = x.to_vector(), r = random_vals(n, 21);
        Vec sm, lsm, g_sm, g_lsm;
        softmax_ref(xv, shape, d, sm, lsm);
        softmax_grad_ref(sm, r, shape, d, g_sm, g_lsm);

        Tensor y = softmax(x, dim);
        expect_close(y.to_vector(), sm, tol, tol, "softmax " + what);
        sum(y * make(r, shape, dt)).backward();
        expect_close(x.grad().to_vector(), g_sm, tol, 1e-5, "softmax grad " + what);
        x.zero_grad();

        Tensor ly = log_softmax(x, dim);
        expect_close(ly.to_vector(), lsm, tol * 10, tol, "log_softmax " + what);
        sum(ly * make(r, shape, dt)).backward();
        expect_close(x.grad().to_vector(), g_lsm, tol * 10, 1e-5, "log_softmax grad " + what);
      }
    }
  }
}

TEST(SoftmaxTest, LargeLogitsAreStable) {
  Tensor x = make({1000.0, -1000.0, 999.0, 0.0, 88.0, 89.0}, {2, 3}, DType::f32);
  const Vec y = softmax(x, 1).to_vector();
  const Vec ly = log_softmax(x, 1).to_vector();
  for (double v : y) EXPECT_TRUE(std::isfinite(v));
  for (double v : ly) EXPECT_TRUE(std::isfinite(v));
  EXPECT_NEAR(y[0], 1.0 / (1.0 + std::exp(-1.0)), 1e-6);
  EXPECT_EQ(y[1], 0.0);
  EXPECT_NEAR(ly[1], -2000.0 - std::log1p(std::exp(-1.0)), 1e-3);
  EXPECT_NEAR(ly[5], -std::log1p(std::exp(-1.0) + std::exp(-89.0)), 1e-6);
}

TEST(SoftmaxTest, NonContiguousInputAndZeroDim) {
  Tensor base = make(random_vals(12, 22), {3, 4});
  Tensor x = base.t();  // [4, 3] view
  Vec sm, lsm;
  softmax_ref(x.contiguous().to_vector(), {4, 3}, 1, sm, lsm);
  expect_close(softmax(x, 1).to_vector(), sm, 1e-14, 0, "transposed");
  Tensor s = scalar_tensor(3.0, {.dtype = DType::f64});
  EXPECT_EQ(softmax(s, 0).item(), 1.0);
  EXPECT_EQ(log_softmax(s, -1).item(), 0.0);
}

TEST(SoftmaxTest, FiniteDifferenceGradients) {
  for (int64_t dim : {int64_t{0}, int64_t{1}, int64_t{-1}}) {
    const std::string d = " dim " + std::to_string(dim);
    expect_gradcheck([dim](const std::vector<Tensor>& in) { return softmax(in[0], dim); },
                     {testing::strided_leaf(testing::rand_f64({3, 4, 5}, 12, -2, 2, false))}, "softmax" + d);
    expect_gradcheck([dim](const std::vector<Tensor>& in) { return log_softmax(in[0], dim); },
                     {testing::transposed_leaf(testing::rand_f64({3, 4, 5}, 13, -2, 2, false))}, "log_softmax" + d);
  }
}

TEST(SoftmaxTest, BadInputs) {
  expect_error([] { softmax(zeros({2, 3}), 2); }, {"softmax", "dim 2", "[2, 3]", "-2 to 1"});
  expect_error([] { log_softmax(zeros({2, 3}), -3); }, {"log_softmax", "dim -3"});
  expect_error([] { softmax(zeros({2, 3}, {.dtype = DType::i64}), 1); }, {"softmax", "i64", ".to(DType::f32)"});
}

// ---------------------------------------------------------------------------------------------
// Per-sample cross entropy with label smoothing and its gradient w.r.t. the logits.
void ce_ref(const Vec& logits, const std::vector<int64_t>& target, int64_t N, int64_t C, double eps, Vec& loss,
            Vec& grad) {
  Vec sm, lsm;
  softmax_ref(logits, {N, C}, 1, sm, lsm);
  loss.assign(N, 0.0);
  grad.assign(logits.size(), 0.0);
  for (int64_t n = 0; n < N; ++n) {
    double smooth = 0;
    for (int64_t c = 0; c < C; ++c) smooth -= lsm[n * C + c];
    loss[n] = (1 - eps) * -lsm[n * C + target[n]] + eps * smooth / C;
    for (int64_t c = 0; c < C; ++c) {
      const double q = (1 - eps) * (c == target[n] ? 1.0 : 0.0) + eps / C;
      grad[n * C + c] = sm[n * C + c] - q;
    }
  }
}

Tensor make_target(const std::vector<int64_t>& t) {
  Vec v(t.begin(), t.end());
  return from_vector(v, {static_cast<int64_t>(t.size())}, {.dtype = DType::i64});
}

TEST(LossTest, CrossEntropyEveryReductionWithAndWithoutSmoothing) {
  const int64_t N = 6, C = 5;
  const std::vector<int64_t> target{0, 4, 2, 2, 1, 3};
  for (DType dt : {DType::f64, DType::f32}) {
    const double tol = dt == DType::f32 ? 1e-5 : 1e-12;
    for (double eps : {0.0, 0.1, 0.5}) {
      for (Reduction red : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
        const std::string what = std::string(dtype_name(dt)) + " eps " + std::to_string(eps) + " reduction " +
                                 std::to_string(static_cast<int>(red));
        Tensor logits = make(random_vals(N * C, 30, 2.0), {N, C}, dt, true);
        Vec loss, grad;
        ce_ref(logits.to_vector(), target, N, C, eps, loss, grad);
        Tensor out = cross_entropy(logits, make_target(target), red, eps);
        if (red == Reduction::None) {
          ASSERT_EQ(out.shape(), Shape{N});
          expect_close(out.to_vector(), loss, tol, tol, what);
          const Vec g = random_vals(N, 31);
          sum(out * make(g, {N}, dt)).backward();
          for (int64_t n = 0; n < N; ++n)
            for (int64_t c = 0; c < C; ++c) grad[n * C + c] *= g[n];
        } else {
          ASSERT_EQ(out.dim(), 0);
          double total = 0;
          for (double l : loss) total += l;
          const double scale = red == Reduction::Mean ? 1.0 / N : 1.0;
          EXPECT_NEAR(out.item(), total * scale, tol * 10) << what;
          out.backward();
          for (double& g : grad) g *= scale;
        }
        expect_close(logits.grad().to_vector(), grad, tol, tol, "grad " + what);
      }
    }
  }
}

TEST(LossTest, CrossEntropyAndNllFiniteDifferences) {
  for (Reduction red : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
    for (double eps : {0.0, 0.2}) {
      const std::string what = "cross_entropy eps " + std::to_string(eps) + " reduction " +
                               std::to_string(static_cast<int>(red));
      expect_gradcheck([red, eps](const std::vector<Tensor>& in) { return cross_entropy(in[0], in[1], red, eps); },
                       {testing::transposed_leaf(testing::rand_f64({5, 4}, 14, -2, 2, false)),
                        testing::random_labels(5, 4, 15)},
                       what);
    }
    expect_gradcheck([red](const std::vector<Tensor>& in) { return nll_loss(in[0], in[1], red); },
                     {testing::rand_f64({5, 4}, 16), testing::random_labels(5, 4, 17)}, "nll_loss");
  }
}

TEST(LossTest, NllLossMatchesGather) {
  const int64_t N = 4, C = 3;
  const std::vector<int64_t> target{2, 0, 1, 2};
  Tensor lp = make(random_vals(N * C, 33), {N, C}, DType::f64, true);
  const Vec lv = lp.to_vector();
  Vec per(N);
  for (int64_t n = 0; n < N; ++n) per[n] = -lv[n * C + target[n]];
  expect_close(nll_loss(lp, make_target(target), Reduction::None).to_vector(), per, 0, 0, "none");
  EXPECT_DOUBLE_EQ(nll_loss(lp, make_target(target), Reduction::Sum).item(), per[0] + per[1] + per[2] + per[3]);
  Tensor m = nll_loss(lp, make_target(target), Reduction::Mean);
  EXPECT_DOUBLE_EQ(m.item(), (per[0] + per[1] + per[2] + per[3]) / 4);
  m.backward();
  Vec g(N * C, 0.0);
  for (int64_t n = 0; n < N; ++n) g[n * C + target[n]] = -0.25;
  EXPECT_EQ(lp.grad().to_vector(), g);
}

TEST(LossTest, BceWithLogitsLargeLogitsFiniteAndExact) {
  const Vec x{100.0, 100.0, -100.0, -100.0, 0.0, 2.5, -3.0, 20.0};
  const Vec t{1.0, 0.0, 1.0, 0.0, 1.0, 0.3, 0.0, 1.0};
  for (DType dt : {DType::f64, DType::f32}) {
    const bool f32 = dt == DType::f32;
    Tensor logits = make(x, {2, 4}, dt, true);
    Tensor target = make(t, {2, 4}, dt, true);
    Tensor loss = binary_cross_entropy_with_logits(logits, target, Reduction::None);
    Vec ref(8), gref(8), tref(8);
    for (size_t i = 0; i < 8; ++i) {
      ref[i] = std::max(x[i], 0.0) - x[i] * t[i] + std::log1p(std::exp(-std::abs(x[i])));
      gref[i] = 1.0 / (1.0 + std::exp(-x[i])) - t[i];
      tref[i] = -x[i];
    }
    const Vec lv = loss.to_vector();
    for (double v : lv) EXPECT_TRUE(std::isfinite(v));
    expect_close(lv, ref, f32 ? 1e-6 : 1e-14, f32 ? 1e-6 : 1e-14, std::string("loss ") + dtype_name(dt));
    EXPECT_EQ(lv[1], 100.0);  // exact: max(x,0) - 0 + log1p(~3.7e-44)
    EXPECT_EQ(lv[2], 100.0);
    EXPECT_LT(lv[0], 1e-30);
    EXPECT_GE(lv[0], 0.0);
    sum(loss).backward();
    expect_close(logits.grad().to_vector(), gref, 1e-7, 0, std::string("grad ") + dtype_name(dt));
    expect_close(target.grad().to_vector(), tref, 0, 0, std::string("target grad ") + dtype_name(dt));
  }
  // Reductions.
  Tensor logits = make(x, {8});
  Tensor target = make(t, {8});
  const double total = sum(binary_cross_entropy_with_logits(logits, target, Reduction::None)).item();
  EXPECT_NEAR(binary_cross_entropy_with_logits(logits, target, Reduction::Sum).item(), total, 1e-12);
  EXPECT_NEAR(binary_cross_entropy_with_logits(logits, target).item(), total / 8, 1e-12);
}

TEST(LossTest, BceWithLogitsFiniteDifferences) {
  for (Reduction red : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
    expect_gradcheck(
        [red](const std::vector<Tensor>& in) { return binary_cross_entropy_with_logits(in[0], in[1], red); },
        {testing::rand_f64({2, 3}, 18, -4, 4), testing::rand_f64({2, 3}, 19, 0, 1)}, "bce_with_logits");
  }
}

TEST(LossTest, BadInputs) {
  Tensor logits = zeros({4, 5});
  expect_error([&] { cross_entropy(logits, make_target({0, 1, 7, 2})); },
               {"target[2] = 7", "C = 5", "[0, 5)"});
  expect_error([&] { cross_entropy(logits, make_target({0, -1, 3, 2})); }, {"target[1] = -1", "C = 5"});
  expect_error([&] { nll_loss(logits, make_target({0, 1, 5, 2})); }, {"nll_loss", "target[2] = 5"});
  expect_error([&] { cross_entropy(logits, zeros({4})); }, {"cross_entropy", "target", "f32", "i64"});
  expect_error([&] { cross_entropy(zeros({4, 5, 2}), make_target({0, 1, 2, 3})); },
               {"cross_entropy", "[N, C]", "[4, 5, 2]"});
  expect_error([&] { cross_entropy(zeros({5}), make_target({0})); }, {"cross_entropy", "[N, C]", "unsqueeze(0)"});
  expect_error([&] { cross_entropy(logits, make_target({0, 1, 2})); }, {"cross_entropy", "target [3]", "[4]"});
  expect_error([&] { cross_entropy(logits, make_target({0, 1, 2, 3}), Reduction::Mean, 1.0); },
               {"cross_entropy", "label_smoothing", "[0, 1)"});
  expect_error([&] { cross_entropy(zeros({4, 5}, {.dtype = DType::i32}), make_target({0, 1, 2, 3})); },
               {"cross_entropy", "i32", ".to(DType::f32)"});
  expect_error([&] { nll_loss(logits, zeros({4}, {.dtype = DType::i32})); }, {"nll_loss", "i32", "i64"});
  expect_error([&] { binary_cross_entropy_with_logits(zeros({4, 1}), zeros({4})); },
               {"binary_cross_entropy_with_logits", "[4]", "[4, 1]", "unsqueeze(1)"});
  expect_error([&] { binary_cross_entropy_with_logits(zeros({4}), zeros({4}, {.dtype = DType::i64})); },
               {"binary_cross_entropy_with_logits", "i64", "f32"});
}

// ---------------------------------------------------------------------------------------------
// A backward closure that captured its own output would form a reference cycle and leak the whole
// graph: after the tensors go out of scope, every byte must be back, backward run or not.
TEST(NormLossMemoryTest, GraphsFreeTheirSavedTensors) {
  Allocator& alloc = backend(Device::cpu()).allocator(0);
  const int64_t before = alloc.stats().allocated_bytes;
  for (bool run_backward : {true, false}) {
    for (bool training : {true, false}) {
      Tensor x = make(random_vals(96, 50), {4, 3, 2, 4}, DType::f32, true);
      Tensor w = make(Vec(3, 1.0), {3}, DType::f32, true), b = make(Vec(3, 0.0), {3}, DType::f32, true);
      Tensor rm = zeros({3}), rv = ones({3});
      Tensor h = dropout(batch_norm(x, w, b, rm, rv, training), 0.2, true);
      Tensor logits = h.reshape({4, 24});
      Tensor loss = add(cross_entropy(logits, make_target({0, 5, 23, 1}), Reduction::Mean, 0.1),
                        sum(log_softmax(logits, 0) * softmax(logits, 1)));
      loss = add(loss, binary_cross_entropy_with_logits(logits, zeros({4, 24})));
      if (run_backward) loss.backward();
    }
    EXPECT_EQ(alloc.stats().allocated_bytes, before) << "run_backward " << run_backward;
  }
}

}  // namespace
}  // namespace minidl
