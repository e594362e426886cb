// The fused loss front-ends (cross_entropy, binary_cross_entropy_with_logits over the backend's
// cross_entropy_* / bce_with_logits_* kernels) against the composed formulas they replaced, written
// here from differentiable ops in f64: label smoothing, f16 logits, logits of 1e4, every
// reduction, finite differences, and the backend contract (saved logsumexp, broadcast gradients).
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/backend.h"
#include "core/generator.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "tests/support/gradcheck.h"
#include "tests/support/gradcheck_builders.h"

namespace minidl {
namespace {

using testing::rand_f64;
using testing::random_labels;
using testing::transposed_leaf;
using V = std::vector<Tensor>;

// What cross_entropy computed before the fused kernel: log_softmax + nll, plus PyTorch's smoothing
// (1 - eps) * nll + eps * mean over classes of -log p. Differentiable, so it also gives the gradient.
Tensor composed_ce(const Tensor& logits, const Tensor& target, Reduction r, double eps) {
  const Tensor logp = log_softmax(logits, 1);
  Tensor loss = nll_loss(logp, target, Reduction::None);
  if (eps > 0) loss = loss * (1.0 - eps) + mean(-logp, {1}) * eps;
  return r == Reduction::None ? loss : r == Reduction::Sum ? sum(loss) : mean(loss);
}

// What binary_cross_entropy_with_logits computed before: elementwise ops (forward only).
Tensor composed_bce(const Tensor& x, const Tensor& y) { return relu(x) - x * y + log1p(exp(-abs(x))); }

double max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  const std::vector<double> va = a.to_vector(), vb = b.to_vector();
  double m = 0;
  for (size_t i = 0; i < va.size(); ++i) m = std::max(m, std::abs(va[i] - vb[i]));
  return m;
}

Tensor leaf(const Tensor& t) { return t.detach().clone().set_requires_grad(true); }

TEST(FusedLoss, CrossEntropyMatchesTheComposedFormulaWithLabelSmoothing) {
  for (const auto& [N, C] : std::vector<std::pair<int64_t, int64_t>>{{7, 1000}, {3, 2}, {5, 1}, {16, 10}}) {
    const Tensor x0 = rand_f64({N, C}, static_cast<uint64_t>(N * C), -3, 3, false);
    const Tensor t = random_labels(N, C, static_cast<uint64_t>(N + C));
    for (double eps : {0.0, 0.1, 0.3, 0.9}) {
      for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
        SCOPED_TRACE("N " + std::to_string(N) + " C " + std::to_string(C) + " eps " + std::to_string(eps) +
                     " reduction " + std::to_string(static_cast<int>(r)));
        Tensor xf = leaf(x0), xc = leaf(x0);
        const Tensor lf = cross_entropy(xf, t, r, eps), lc = composed_ce(xc, t, r, eps);
        ASSERT_EQ(lf.shape(), lc.shape());
        EXPECT_LT(max_abs_diff(lf, lc), 1e-12);
        const Tensor g = rand_f64(lf.shape(), 99, -1, 1, false);
        lf.backward(g);
        lc.backward(g);
        EXPECT_LT(max_abs_diff(xf.grad(), xc.grad()), 1e-13);
      }
    }
  }
}

TEST(FusedLoss, CrossEntropySavesTheRowLogSumExp) {
  // The backend contract: lse[n] = log sum_c exp(x[n, c]) in f64, losses in the logits' dtype.
  const Tensor x = from_vector({1, 2, 3, -1, 0, 1000, 5, 5, 5}, {3, 3});
  const Tensor t = from_vector({2, 0, 1}, {3}, {.dtype = DType::i64});
  Tensor losses = empty({3}), lse = empty({3}, {.dtype = DType::f64});
  backend(Device::cpu()).cross_entropy_forward(x, t, 0.0, losses, lse);
  const double l0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0));
  const double l1 = 1000.0 + std::log(std::exp(-1001.0) + std::exp(-1000.0) + 1.0);
  const double l2 = 5.0 + std::log(3.0);
  // f32 logits: exp in f32 (relative error ~1e-7), the sum and the log in f64.
  const std::vector<double> got = lse.to_vector();
  EXPECT_NEAR(got[0], l0, 1e-6);
  EXPECT_NEAR(got[1], l1, 1e-6);
  EXPECT_NEAR(got[2], l2, 1e-6);
  const std::vector<double> lv = losses.to_vector();
  EXPECT_NEAR(lv[0], l0 - 3.0, 1e-6);
  EXPECT_NEAR(lv[1], l1 + 1.0, 1e-6);
  EXPECT_NEAR(lv[2], std::log(3.0), 1e-6);
  // f64 logits: exact to rounding.
  Tensor lse64 = empty({3}, {.dtype = DType::f64}), losses64 = empty({3}, {.dtype = DType::f64});
  backend(Device::cpu()).cross_entropy_forward(x.to(DType::f64), t, 0.0, losses64, lse64);
  EXPECT_NEAR(lse64.to_vector()[0], l0, 1e-14);
  EXPECT_NEAR(lse64.to_vector()[1], l1, 1e-12);
  EXPECT_NEAR(lse64.to_vector()[2], l2, 1e-14);
  EXPECT_NEAR(losses64.to_vector()[1], l1 + 1.0, 1e-12);
}

TEST(FusedLoss, CrossEntropyLargeLogitsStayFinite) {
  // Rows of logits around +-1e4: exp(1e4) overflows any float type, the fused kernel never forms it.
  const std::vector<double> v{1e4, 0, -1e4, 9999, 1e4, -1e4, -1e4, -1e4, -1e4};
  const std::vector<int64_t> tv{0, 0, 1};
  for (DType dt : {DType::f32, DType::f16, DType::f64}) {
    for (double eps : {0.0, 0.1}) {
      SCOPED_TRACE(std::string(dtype_name(dt)) + " eps " + std::to_string(eps));
      Tensor x = from_vector(v, {3, 3}, {.dtype = dt}).set_requires_grad(true);
      const Tensor t = from_vector({0, 0, 1}, {3}, {.dtype = DType::i64});
      const Tensor loss = cross_entropy(x, t, Reduction::None, eps);
      sum(loss).backward();
      // The exact values, from the f64 formula on the same (possibly f16-rounded) logits.
      const std::vector<double> xv = x.detach().to_vector();
      const std::vector<double> lv = loss.to_vector(), gv = x.grad().to_vector();
      for (int64_t n = 0; n < 3; ++n) {
        double mx = -INFINITY, s = 0, sx = 0;
        for (int64_t c = 0; c < 3; ++c) mx = std::max(mx, xv[n * 3 + c]);
        for (int64_t c = 0; c < 3; ++c) s += std::exp(xv[n * 3 + c] - mx), sx += xv[n * 3 + c];
        const double lse = mx + std::log(s);
        const double want = (1 - eps) * (lse - xv[n * 3 + tv[n]]) + eps * (lse - sx / 3);
        ASSERT_TRUE(std::isfinite(lv[n])) << "row " << n;
        EXPECT_NEAR(lv[n], want, dt == DType::f16 ? 8.0 : 1e-3 * std::max(1.0, std::abs(want))) << "row " << n;
        for (int64_t c = 0; c < 3; ++c) {
          const double p = std::exp(xv[n * 3 + c] - lse);
          const double gw = p - (c == tv[n] ? 1 - eps : 0.0) - eps / 3;
          ASSERT_TRUE(std::isfinite(gv[n * 3 + c]));
          EXPECT_NEAR(gv[n * 3 + c], gw, dt == DType::f16 ? 1e-3 : 1e-6) << "row " << n << " class " << c;
        }
      }
    }
  }
}

TEST(FusedLoss, CrossEntropyOfF16LogitsComputesInF32) {
  // f16 logits: the loss and the gradient keep f16 but are computed in f32 and rounded once, so
  // they are within one f16 rounding of the f64 result on the same f16 values.
  const Tensor xd = rand_f64({7, 1000}, 5, -4, 4, false);
  const Tensor t = random_labels(7, 1000, 6);
  for (double eps : {0.0, 0.1}) {
    Tensor xh = xd.to(DType::f16).detach().set_requires_grad(true);
    Tensor xr = leaf(xh.detach().to(DType::f64));
    const Tensor lh = cross_entropy(xh, t, Reduction::None, eps), lr = cross_entropy(xr, t, Reduction::None, eps);
    ASSERT_EQ(lh.dtype(), DType::f16);
    const std::vector<double> a = lh.to_vector(), b = lr.to_vector();
    for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], b[i], std::abs(b[i]) * 1e-3 + 1e-6) << i;
    sum(lh).backward();
    sum(lr).backward();
    ASSERT_EQ(xh.grad().dtype(), DType::f16);
    // One f16 rounding: relative 2^-11, or half the subnormal spacing (2^-25) near zero.
    const std::vector<double> gh = xh.grad().to_vector(), gr = xr.grad().to_vector();
    for (size_t i = 0; i < gh.size(); ++i) ASSERT_NEAR(gh[i], gr[i], std::abs(gr[i]) * 6e-4 + 4e-8) << i;
  }
}

TEST(FusedLoss, ReductionsNoneSumMean) {
  const Tensor x0 = rand_f64({6, 5}, 7, -2, 2, false);
  const Tensor t = random_labels(6, 5, 8);
  const Tensor y0 = rand_f64({6, 5}, 9, 0, 1, false);
  Tensor xn = leaf(x0), xs = leaf(x0), xm = leaf(x0);
  const Tensor none = cross_entropy(xn, t, Reduction::None, 0.1);
  const Tensor s = cross_entropy(xs, t, Reduction::Sum, 0.1), m = cross_entropy(xm, t, Reduction::Mean, 0.1);
  EXPECT_EQ(none.shape(), Shape{6});
  EXPECT_EQ(s.dim(), 0);
  EXPECT_NEAR(s.item(), sum(none).item(), 1e-12);
  EXPECT_NEAR(m.item(), sum(none).item() / 6, 1e-12);
  // The gradient of the sum is that of None with a gradient of ones; the mean's is that / N (it
  // reaches the kernel as one broadcast value, stride 0).
  none.backward(ones({6}, {.dtype = DType::f64}));
  s.backward();
  m.backward();
  EXPECT_LT(max_abs_diff(xs.grad(), xn.grad()), 1e-15);
  EXPECT_LT(max_abs_diff(xm.grad() * 6.0, xn.grad()), 1e-15);
  // The same for BCE, where the gradient reaches both inputs.
  Tensor bn = leaf(x0), bs = leaf(x0), bm = leaf(x0), yn = leaf(y0), ym = leaf(y0);
  const Tensor bnone = binary_cross_entropy_with_logits(bn, yn, Reduction::None);
  EXPECT_LT(max_abs_diff(bnone, composed_bce(x0, y0)), 1e-15);
  EXPECT_NEAR(binary_cross_entropy_with_logits(bs, y0, Reduction::Sum).item(), sum(bnone).item(), 1e-12);
  const Tensor bmean = binary_cross_entropy_with_logits(bm, ym, Reduction::Mean);
  EXPECT_NEAR(bmean.item(), sum(bnone).item() / 30, 1e-12);
  bnone.backward(ones({6, 5}, {.dtype = DType::f64}));
  bmean.backward();
  EXPECT_LT(max_abs_diff(bm.grad() * 30.0, bn.grad()), 1e-14);
  EXPECT_LT(max_abs_diff(ym.grad() * 30.0, yn.grad()), 1e-14);
  EXPECT_LT(max_abs_diff(yn.grad(), -x0), 0.0 + 1e-300);   // d/dy = -x exactly
  EXPECT_FALSE(bs.grad().defined());                        // never backpropagated
}

TEST(FusedLoss, BceWithLogitsF16AndLargeLogits) {
  const Tensor x = from_vector({1e4, -1e4, 1e4, -1e4, 0, 3.5, -2.25, 60000}, {8});
  const Tensor y = from_vector({1, 1, 0, 0, 0.5, 0.25, 1, 0}, {8});
  for (DType dt : {DType::f32, DType::f16, DType::f64}) {
    Tensor xl = x.to(dt).detach().set_requires_grad(true);
    const Tensor loss = binary_cross_entropy_with_logits(xl, y.to(dt), Reduction::None);
    ASSERT_EQ(loss.dtype(), dt);
    sum(loss).backward();
    const std::vector<double> xv = xl.detach().to_vector(), yv = y.to_vector();
    const std::vector<double> lv = loss.to_vector(), gv = xl.grad().to_vector();
    for (size_t i = 0; i < xv.size(); ++i) {
      const double want = std::max(xv[i], 0.0) - xv[i] * yv[i] + std::log1p(std::exp(-std::abs(xv[i])));
      const double gwant = 1.0 / (1.0 + std::exp(-xv[i])) - yv[i];
      ASSERT_TRUE(std::isfinite(lv[i]) && std::isfinite(gv[i])) << dtype_name(dt) << " element " << i;
      EXPECT_NEAR(lv[i], want, std::abs(want) * (dt == DType::f16 ? 1e-3 : 1e-7) + 1e-7) << dtype_name(dt) << " " << i;
      EXPECT_NEAR(gv[i], gwant, dt == DType::f16 ? 1e-3 : 1e-7) << dtype_name(dt) << " " << i;
    }
  }
}

TEST(FusedLoss, GradcheckCrossEntropy) {
  for (const auto& [N, C] : std::vector<std::pair<int64_t, int64_t>>{{3, 2}, {4, 7}}) {
    const Tensor target = random_labels(N, C, 21);
    for (double eps : {0.0, 0.25}) {
      for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
        SCOPED_TRACE("N " + std::to_string(N) + " C " + std::to_string(C) + " eps " + std::to_string(eps));
        const auto f = [r, eps](const V& in) { return cross_entropy(in[0] * 3.0, in[1], r, eps); };
        EXPECT_GRADCHECK(f, {rand_f64({N, C}, 22, -2, 2), target});
        EXPECT_GRADCHECK(f, {transposed_leaf(rand_f64({N, C}, 23, -2, 2)), target});
      }
    }
  }
}

TEST(FusedLoss, GradcheckBceWithLogitsBothInputs) {
  for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
    const auto f = [r](const V& in) { return binary_cross_entropy_with_logits(in[0] * 5.0, in[1], r); };
    EXPECT_GRADCHECK(f, {rand_f64({4, 3}, 24, -2, 2), rand_f64({4, 3}, 25, 0, 1)});
    EXPECT_GRADCHECK(f, {transposed_leaf(rand_f64({4, 3}, 26, -2, 2)), transposed_leaf(rand_f64({4, 3}, 27, 0, 1))});
  }
}

TEST(FusedLoss, NoFullSizeTemporaries) {
  // The point of fusing: forward + backward of a mean loss allocate the logits' gradient and O(N)
  // per-row values, nothing else of size [N, C] (the composed cross_entropy peaked at 3x the
  // logits, 4x with label smoothing; the composed BCE at several x). Measured with the allocator.
  const int64_t N = 64, C = 1000;
  const Tensor x0 = rand_f64({N, C}, 31, -3, 3, false).to(DType::f32);
  const Tensor t = random_labels(N, C, 32);
  const Tensor y0 = rand_f64({N, C}, 33, 0, 1, false).to(DType::f32);
  const int64_t grad_bytes = N * C * 4;
  for (int which = 0; which < 3; ++which) {
    Tensor x = leaf(x0);
    reset_peak_stats(Device::cpu());
    const int64_t base = memory_stats(Device::cpu()).allocated_bytes;
    Tensor loss = which == 2 ? binary_cross_entropy_with_logits(x, y0) : cross_entropy(x, t, Reduction::Mean, which * 0.1);
    loss.backward();
    const int64_t extra = memory_stats(Device::cpu()).peak_allocated_bytes - base;
    EXPECT_LE(extra, grad_bytes + N * 16 + 4096) << "case " << which;
    EXPECT_GE(extra, grad_bytes) << "case " << which;
  }
}

TEST(FusedLoss, BackendRejectsAStridedGradient) {
  // The BCE backward reads g contiguous or as one broadcast value, nothing in between.
  const Tensor x = rand_f64({4, 3}, 28, -1, 1, false), y = rand_f64({4, 3}, 29, 0, 1, false);
  const Tensor g = rand_f64({3, 4}, 30, -1, 1, false).t();
  Tensor gx = empty({4, 3}, {.dtype = DType::f64});
  try {
    backend(Device::cpu()).bce_with_logits_backward(g, x, y, gx, Tensor());
    ADD_FAILURE() << "a transposed gradient must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("broadcast scalar"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace minidl
