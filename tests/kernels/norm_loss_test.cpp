// Batch norm, dropout, softmax / log-softmax and the losses on the CPU backend, against plain f64
// reference computations written here, plus finite-difference checks of the backward nodes and
// the error messages users see for the usual mistakes (bad targets, wrong shapes and dtypes).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/generator.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "tests/support/gradcheck.h"

namespace minidl {
namespace {

using Vec = std::vector<double>;

Vec random_vals(size_t n, uint64_t seed, double scale = 1.0, double shift = 0.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, 1.0);
  Vec v(n);
  for (double& x : v) x = shift + scale * dist(rng);
  return v;
}

Tensor make(const Vec& v, const Shape& shape, DType dt = DType::f64, bool requires_grad = false) {
  Tensor t = from_vector(v, shape, {.dtype = dt});
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

void expect_close(const Vec& actual, const Vec& expected, double atol, double rtol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_NEAR(actual[i], expected[i], atol + rtol * std::abs(expected[i])) << what << " at " << i;
  }
}

// Runs f and checks it throws minidl::Error whose message contains every one of `parts`.
void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "missing '" << p << "' in: " << msg;
    return;
  }
  ADD_FAILURE() << "expected a minidl::Error mentioning '" << (parts.empty() ? "" : parts[0]) << "'";
}

// The shared finite-difference checker (f64, perturbs in place, so inputs may be strided views).
void expect_gradcheck(const testing::GradFn& f, std::vector<Tensor> inputs, const std::string& what) {
  const testing::GradcheckResult r = testing::gradcheck(f, std::move(inputs));
  EXPECT_TRUE(r.ok) << what << ": " << r.message;
  EXPECT_GT(r.num_checked, 0) << what;
}

// ---------------------------------------------------------------------------------------------
// Batch norm reference over x viewed as [N, C, S].
struct BnRef {
  Vec y, mean, var_biased, var_unbiased;
};

BnRef bn_train_ref(const Vec& x, int64_t N, int64_t C, int64_t S, const Vec& w, const Vec& b, double eps) {
  BnRef r;
  r.y.resize(x.size());
  const double n = static_cast<double>(N * S);
  for (int64_t c = 0; c < C; ++c) {
    double s = 0;
    for (int64_t i = 0; i < N; ++i)
      for (int64_t k = 0; k < S; ++k) s += x[(i * C + c) * S + k];
    const double m = s / n;
    double sq = 0;
    for (int64_t i = 0; i < N; ++i)
      for (int64_t k = 0; k < S; ++k) sq += (x[(i * C + c) * S + k] - m) * (x[(i * C + c) * S + k] - m);
    const double vb = sq / n;
    r.mean.push_back(m);
    r.var_biased.push_back(vb);
    r.var_unbiased.push_back(sq / (n - 1));
    for (int64_t i = 0; i < N; ++i)
      for (int64_t k = 0; k < S; ++k) {
        const size_t at = static_cast<size_t>((i * C + c) * S + k);
        r.y[at] = (x[at] - m) / std::sqrt(vb + eps) * w[c] + b[c];
      }
  }
  return r;
}

// Gradients of sum(y * gy) for training-mode batch norm, from the textbook derivation.
void bn_train_grad_ref(const Vec& x, const Vec& gy, int64_t N, int64_t C, int64_t S, const Vec& w, double eps,
                       Vec& gx, Vec& gw, Vec& gb) {
  const BnRef r = bn_train_ref(x, N, C, S, Vec(C, 1.0), Vec(C, 0.0), eps);
  gx.assign(x.size(), 0.0);
  gw.assign(C, 0.0);
  gb.assign(C, 0.0);
  const double n = static_cast<double>(N * S);
  for (int64_t c = 0; c < C; ++c) {
    const double inv = 1.0 / std::sqrt(r.var_biased[c] + eps);
    double sg = 0, sgx = 0;
    for (int64_t i = 0; i < N; ++i)
      for (int64_t k = 0; k < S; ++k) {
        const size_t at = static_cast<size_t>((i * C + c) * S + k);
        sg += gy[at];
        sgx += gy[at] * r.y[at];  // r.y is xhat here (w = 1, b = 0)
      }
    gb[c] = sg;
    gw[c] = sgx;
    for (int64_t i = 0; i < N; ++i)
      for (int64_t k = 0; k < S; ++k) {
        const size_t at = static_cast<size_t>((i * C + c) * S + k);
        gx[at] = w[c] * inv / n * (n * gy[at] - sg - r.y[at] * sgx);
      }
  }
}

struct BnCase {
  Shape shape;
  DType dtype;
};

void PrintTo(const BnCase& c, std::ostream* os) { *os << shape_str(c.shape) << ' ' << dtype_name(c.dtype); }

class BatchNormTrainTest : public ::testing::TestWithParam<BnCase> {};

TEST_P(BatchNormTrainTest, ForwardAndRunningStatsOverTwoSteps) {
  const BnCase pc = GetParam();
  const int64_t N = pc.shape[0], C = pc.shape[1], S = numel_of(pc.shape) / (N * C);
  const double eps = 1e-5, momentum = 0.1;
  const bool f32 = pc.dtype == DType::f32;
  const double tol = f32 ? 1e-5 : 1e-12;
  const Vec w = random_vals(C, 1, 0.5, 1.0), b = random_vals(C, 2);
  Tensor weight = make(w, {C}, pc.dtype), bias = make(b, {C}, pc.dtype);
  Tensor rm = zeros({C}, {.dtype = pc.dtype}), rv = ones({C}, {.dtype = pc.dtype});
  Vec ref_rm(C, 0.0), ref_rv(C, 1.0);
  for (int step = 0; step < 2; ++step) {
    // A large mean and a per-step shift check the two-pass statistics and the update.
    Tensor x = make(random_vals(numel_of(pc.shape), 10 + step, 2.0 + step, 50.0 * (step + 1)), pc.shape, pc.dtype);
    const Vec xv = x.to_vector();  // the values the kernel sees (rounded to f32 where it is f32)
    Tensor y = batch_norm(x, weight, bias, rm, rv, /*training=*/true, momentum, eps);
    const BnRef r = bn_train_ref(xv, N, C, S, w, b, eps);
    expect_close(y.to_vector(), r.y, f32 ? 2e-5 : 1e-10, 0, "y step " + std::to_string(step));
    for (int64_t c = 0; c < C; ++c) {
      ref_rm[c] = (1 - momentum) * ref_rm[c] + momentum * r.mean[c];
      ref_rv[c] = (1 - momentum) * ref_rv[c] + momentum * r.var_unbiased[c];
    }
    expect_close(rm.to_vector(), ref_rm, tol, tol, "running_mean step " + std::to_string(step));
    expect_close(rv.to_vector(), ref_rv, tol, tol, "running_var step " + std::to_string(step));
    EXPECT_EQ(y.shape(), pc.shape);
    EXPECT_EQ(y.dtype(), pc.dtype);
  }
}

TEST_P(BatchNormTrainTest, BackwardMatchesReference) {
  const BnCase pc = GetParam();
  const int64_t N = pc.shape[0], C = pc.shape[1], S = numel_of(pc.shape) / (N * C);
  const double eps = 1e-5;
  const bool f32 = pc.dtype == DType::f32;
  const Vec w = random_vals(C, 3, 0.5, 1.0), b = random_vals(C, 4);
  Tensor weight = make(w, {C}, pc.dtype, true), bias = make(b, {C}, pc.dtype, true);
  Tensor x = make(random_vals(numel_of(pc.shape), 5, 1.5, 0.3), pc.shape, pc.dtype, true);
  const Vec gyv = random_vals(numel_of(pc.shape), 6);
  Tensor gy = make(gyv, pc.shape, pc.dtype);
  Tensor rm = zeros({C}, {.dtype = pc.dtype}), rv = ones({C}, {.dtype = pc.dtype});
  sum(batch_norm(x, weight, bias, rm, rv, true, 0.1, eps) * gy).backward();
  Vec gx, gw, gb;
  bn_train_grad_ref(x.to_vector(), gy.to_vector(), N, C, S, w, eps, gx, gw, gb);
  const double atol = f32 ? 1e-4 : 1e-10;
  expect_close(x.grad().to_vector(), gx, atol, f32 ? 1e-4 : 1e-10, "gx");
  expect_close(weight.grad().to_vector(), gw, atol, f32 ? 1e-4 : 1e-10, "gweight");
  expect_close(bias.grad().to_vector(), gb, atol, f32 ? 1e-4 : 1e-10, "gbias");
}

INSTANTIATE_TEST_SUITE_P(Shapes, BatchNormTrainTest,
                         ::testing::Values(BnCase{{6, 4}, DType::f32}, BnCase{{6, 4}, DType::f64},
                                           BnCase{{3, 5, 4, 3}, DType::f32}, BnCase{{3, 5, 4, 3}, DType::f64},
                                           BnCase{{2, 3, 7}, DType::f64}, BnCase{{8, 64, 16, 16}, DType::f32}));

TEST(BatchNormTest, FiniteDifferenceGradientsTrainAndEval) {
  const Shape shape{3, 2, 2, 2};
  const Vec rmv{0.2, -0.4}, rvv{1.5, 0.7};
  for (bool training : {true, false}) {
    auto f = [&](const std::vector<Tensor>& in) {
      // Fresh running statistics every call, so every evaluation sees the same ones.
      return batch_norm(in[0], in[1], in[2], make(rmv, {2}), make(rvv, {2}), training, 0.1, 1e-5);
    };
    const std::string mode = training ? "train" : "eval";
    expect_gradcheck(f, {testing::rand_f64(shape, 1), testing::rand_f64({2}, 2, 0.5, 1.5), testing::rand_f64({2}, 3)},
                     "batch_norm " + mode);
    expect_gradcheck(f,
                     {testing::transposed_leaf(testing::rand_f64(shape, 4, -1, 1, false)),
                      testing::rand_f64({2}, 5, 0.5, 1.5), testing::rand_f64({2}, 6)},
                     "batch_norm transposed x " + mode);
    // Only x, or only the affine parameters, needing a gradient.
    expect_gradcheck(f, {testing::rand_f64({5, 2}, 7), make({0.7, 1.3}, {2}), make({0.1, 0.2}, {2})},
                     "batch_norm x only " + mode);
    expect_gradcheck(f, {testing::rand_f64({5, 2}, 8, -1, 1, false), testing::rand_f64({2}, 9), testing::rand_f64({2}, 10)},
                     "batch_norm parameters only " + mode);
  }
  auto no_affine = [](const std::vector<Tensor>& in) {
    return batch_norm(in[0], Tensor(), Tensor(), Tensor(), Tensor(), true);
  };
  expect_gradcheck(no_affine, {testing::rand_f64({4, 3, 5}, 11)}, "batch_norm without affine");
}

TEST(BatchNormTest, EvalUsesRunningStatsAndLeavesThemAlone) {
  const Shape shape{4, 3, 2, 2};
  const int64_t C = 3, S = 4, N = 4;
  const Vec w{0.5, 1.5, -1.0}, b{0.1, 0.0, 2.0}, rmv{0.3, -1.0, 2.0}, rvv{0.5, 2.0, 1.0};
  const double eps = 1e-3;
  Tensor x = make(random_vals(48, 9), shape, DType::f64, true);
  Tensor weight = make(w, {C}, DType::f64, true), bias = make(b, {C}, DType::f64, true);
  Tensor rm = make(rmv, {C}), rv = make(rvv, {C});
  Tensor y = batch_norm(x, weight, bias, rm, rv, /*training=*/false, 0.1, eps);
  const Vec xv = x.to_vector(), gyv = random_vals(48, 10);
  sum(y * make(gyv, shape)).backward();
  Vec ry(48), rgx(48), rgw(C, 0.0), rgb(C, 0.0);
  for (int64_t i = 0; i < N; ++i)
    for (int64_t c = 0; c < C; ++c)
      for (int64_t k = 0; k < S; ++k) {
        const size_t at = static_cast<size_t>((i * C + c) * S + k);
        const double inv = 1.0 / std::sqrt(rvv[c] + eps);
        const double xhat = (xv[at] - rmv[c]) * inv;
        ry[at] = xhat * w[c] + b[c];
        rgx[at] = gyv[at] * w[c] * inv;
        rgw[c] += gyv[at] * xhat;
        rgb[c] += gyv[at];
      }
  expect_close(y.to_vector(), ry, 1e-12, 1e-12, "eval y");
  expect_close(x.grad().to_vector(), rgx, 1e-12, 1e-12, "eval gx");
  expect_close(weight.grad().to_vector(), rgw, 1e-12, 1e-12, "eval gweight");
  expect_close(bias.grad().to_vector(), rgb, 1e-12, 1e-12, "eval gbias");
  EXPECT_EQ(rm.to_vector(), rmv);
  EXPECT_EQ(rv.to_vector(), rvv);
}

TEST(BatchNormTest, WithoutAffineOrRunningStats) {
  const Shape shape{5, 3};
  Tensor x = make(random_vals(15, 11), shape, DType::f64, true);
  Tensor y = batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true);
  const BnRef r = bn_train_ref(x.to_vector(), 5, 3, 1, Vec(3, 1.0), Vec(3, 0.0), 1e-5);
  expect_close(y.to_vector(), r.y, 1e-12, 0, "y");
  const Vec gyv = random_vals(15, 12);
  sum(y * make(gyv, shape)).backward();
  Vec gx, gw, gb;
  bn_train_grad_ref(x.to_vector(), gyv, 5, 3, 1, Vec(3, 1.0), 1e-5, gx, gw, gb);
  expect_close(x.grad().to_vector(), gx, 1e-10, 1e-10, "gx");
}

TEST(BatchNormTest, NonContiguousInputAndGradient) {
  // x given as a transposed view; the incoming gradient comes through a permute.
  Tensor base = make(random_vals(24, 13), {4, 2, 3}, DType::f64, true);
  Tensor x = base.transpose(0, 1);  // [2, 4, 3], C = 4
  Tensor y = batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true);
  const BnRef r = bn_train_ref(x.contiguous().to_vector(), 2, 4, 3, Vec(4, 1.0), Vec(4, 0.0), 1e-5);
  expect_close(y.to_vector(), r.y, 1e-12, 0, "y");
  const Vec gyv = random_vals(24, 14);
  sum(y.transpose(0, 2) * make(gyv, {2, 4, 3}).transpose(0, 2)).backward();
  Vec gx, gw, gb;
  bn_train_grad_ref(x.contiguous().to_vector(), gyv, 2, 4, 3, Vec(4, 1.0), 1e-5, gx, gw, gb);
  expect_close(base.grad().transpose(0, 1).contiguous().to_vector(), gx, 1e-10, 1e-10, "gx");
}

TEST(BatchNormTest, BadInputs) {
  Tensor x = zeros({4, 3, 2, 2});
  Tensor c3 = ones({3}), c4 = ones({4});
  expect_error([&] { batch_norm(x, c4, c3, c3, c3, true); }, {"batch_norm", "weight", "[4]", "3 channels", "[3]"});
  expect_error([&] { batch_norm(x, c3, c3, c4, c3, true); }, {"batch_norm", "running_mean", "[4]", "[4, 3, 2, 2]"});
  expect_error([&] { batch_norm(x, c3, c3, c3, c4, false); }, {"batch_norm", "running_var", "[4]"});
  expect_error([&] { batch_norm(x, c3, c3, c3, c3, true, 1.5); }, {"batch_norm", "momentum", "1.5", "[0, 1]"});
  expect_error([&] { batch_norm(x, c3, c3, c3, c3, true, -0.1); }, {"momentum"});
  expect_error([&] { batch_norm(x, c3, c3, c3, c3, true, 0.1, -1.0); }, {"batch_norm", "eps"});
  expect_error([&] { batch_norm(ones({3}), Tensor(), Tensor(), Tensor(), Tensor(), true); },
               {"batch_norm", "[3]", "unsqueeze(0)"});
  expect_error([&] { batch_norm(x, c3, c3, Tensor(), Tensor(), false); },
               {"batch_norm", "evaluation mode", "running_mean"});
  expect_error([&] { batch_norm(x, c3, c3, c3, Tensor(), true); }, {"batch_norm", "running_var", "undefined"});
  expect_error([&] { batch_norm(zeros({1, 3}), c3, c3, c3, c3, true); },
               {"batch_norm", "more than 1 value per channel", "[1, 3]"});
  expect_error([&] { batch_norm(zeros({4, 3}, {.dtype = DType::i64}), c3, c3, c3, c3, true); },
               {"batch_norm", "i64", ".to(DType::f32)"});
  expect_error([&] { batch_norm(x, ones({3}, {.dtype = DType::f64}), c3, c3, c3, true); },
               {"batch_norm", "weight", "f64", "f32"});
  // A failed call must not have touched the running statistics.
  EXPECT_EQ(c3.to_vector(), Vec(3, 1.0));
}

// ---------------------------------------------------------------------------------------------
// Softmax reference along dim d of a row-major tensor.
void softmax_ref(const Vec& x, const Shape& shape, int64_t d, Vec& sm, Vec& lsm) {
  int64_t outer = 1, inner = 1;
  const int64_t C = shape[d];
  for (int64_t i = 0; i < d; ++i) outer *= shape[i];
  for (size_t i = static_cast<size_t>(d) + 1; i < shape.size(); ++i) inner *= shape[i];
  sm.assign(x.size(), 0.0);
  lsm.assign(x.size(), 0.0);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k = 0; k < inner; ++k) {
      double mx = -INFINITY;
      for (int64_t c = 0; c < C; ++c) mx = std::max(mx, x[(o * C + c) * inner + k]);
      double s = 0;
      for (int64_t c = 0; c < C; ++c) s += std::exp(x[(o * C + c) * inner + k] - mx);
      for (int64_t c = 0; c < C; ++c) {
        const size_t at = static_cast<size_t>((o * C + c) * inner + k);
        sm[at] = std::exp(x[at] - mx) / s;
        lsm[at] = x[at] - mx - std::log(s);
      }
    }
}

// Gradients of sum(softmax * r) and sum(log_softmax * r) along dim d.
void softmax_grad_ref(const Vec& sm, const Vec& r, const Shape& shape, int64_t d, Vec& g_sm, Vec& g_lsm) {
  int64_t outer = 1, inner = 1;
  const int64_t C = shape[d];
  for (int64_t i = 0; i < d; ++i) outer *= shape[i];
  for (size_t i = static_cast<size_t>(d) + 1; i < shape.size(); ++i) inner *= shape[i];
  g_sm.assign(sm.size(), 0.0);
  g_lsm.assign(sm.size(), 0.0);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t k = 0; k < inner; ++k) {
      double dot = 0, rs = 0;
      for (int64_t c = 0; c < C; ++c) {
        const size_t at = static_cast<size_t>((o * C + c) * inner + k);
        dot += sm[at] * r[at];
        rs += r[at];
      }
      for (int64_t c = 0; c < C; ++c) {
        const size_t at = static_cast<size_t>((o * C + c) * inner + k);
        g_sm[at] = sm[at] * (r[at] - dot);
        g_lsm[at] = r[at] - sm[at] * rs;
      }
    }
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
TEST(DropoutTest, KeepFractionScalingAndDeterminism) {
  const int64_t n = 100000;
  const double p = 0.3;
  Tensor x = ones({n});
  Generator g1(42), g2(42);
  const Vec a = dropout(x, p, true, &g1).to_vector();
  const Vec b = dropout(x, p, true, &g2).to_vector();
  EXPECT_EQ(a, b);  // same seed and offset -> same mask
  const float scale = static_cast<float>(1.0 / (1.0 - p));
  int64_t kept = 0;
  for (double v : a) {
    if (v != 0.0) {
      ++kept;
      ASSERT_EQ(v, static_cast<double>(scale));
    }
  }
  // Binomial std is sqrt(p(1-p)/n) ~ 0.0015: 0.01 is about 7 sigma.
  EXPECT_NEAR(static_cast<double>(kept) / n, 1.0 - p, 0.01);
  // The generator advanced: the next mask differs.
  const Vec c = dropout(x, p, true, &g1).to_vector();
  EXPECT_NE(a, c);
  // The default generator is used when none is given, and reseeding replays it.
  manual_seed(7);
  const Vec d1 = dropout(x, p, true).to_vector();
  manual_seed(7);
  const Vec d2 = dropout(x, p, true).to_vector();
  EXPECT_EQ(d1, d2);
}

TEST(DropoutTest, IdentityWhenEvalOrZeroAndZerosAtOne) {
  Tensor x = make(random_vals(10, 40), {10}, DType::f32, true);
  EXPECT_TRUE(dropout(x, 0.5, false).same(x));
  EXPECT_TRUE(dropout(x, 0.0, true).same(x));
  Tensor z = dropout(x, 1.0, true);
  EXPECT_EQ(z.to_vector(), Vec(10, 0.0));
  sum(z).backward();
  EXPECT_EQ(x.grad().to_vector(), Vec(10, 0.0));
}

TEST(DropoutTest, BackwardUsesTheSameMask) {
  const int64_t n = 1000;
  Tensor x = make(random_vals(n, 41, 1.0, 5.0), {n}, DType::f64, true);  // no zeros in x
  Generator gen(3);
  Tensor y = dropout(x, 0.4, true, &gen);
  const Vec r = random_vals(n, 42);
  sum(y * make(r, {n})).backward();
  const Vec xv = x.to_vector(), yv = y.to_vector(), gv = x.grad().to_vector();
  int64_t kept = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (yv[i] == 0.0) {
      EXPECT_EQ(gv[i], 0.0) << i;
    } else {
      ++kept;
      EXPECT_NEAR(yv[i], xv[i] / 0.6, 1e-12) << i;
      EXPECT_NEAR(gv[i], r[i] / 0.6, 1e-12) << i;
    }
  }
  EXPECT_GT(kept, 500);
  EXPECT_LT(kept, 700);
}

TEST(DropoutTest, FiniteDifferenceGradients) {
  // A fresh generator with the same seed every call: the mask is the same in every evaluation.
  auto f = [](const std::vector<Tensor>& in) {
    Generator gen(11);
    return dropout(in[0], 0.5, true, &gen);
  };
  expect_gradcheck(f, {testing::strided_leaf(testing::rand_f64({4, 6}, 20, -1, 1, false))}, "dropout");
}

TEST(DropoutTest, BadInputs) {
  expect_error([] { dropout(ones({3}), 1.5, true); }, {"dropout", "1.5", "[0, 1]"});
  expect_error([] { dropout(ones({3}), -0.1, true); }, {"dropout", "-0.1"});
  expect_error([] { dropout(ones({3}, {.dtype = DType::i64}), 0.5, true); }, {"dropout", "i64", ".to(DType::f32)"});
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
