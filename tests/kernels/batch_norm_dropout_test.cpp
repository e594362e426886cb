// Batch norm and dropout on the CPU backend, against plain f64 reference computations written
// here, plus finite-difference checks of the backward nodes and the error messages users see for
// the usual mistakes. Softmax and the losses are in softmax_loss_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/generator.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "tests/support/gradcheck.h"
#include "tests/support/norm_loss_helpers.h"

namespace minidl {
namespace {

using namespace testing::norm_loss;   // the suite's helpers

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

}  // namespace
}  // namespace minidl
