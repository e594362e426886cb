// f16 arithmetic on the CPU backend, family by family, against an f64 reference computed from the
// same f16-rounded inputs: an f16 result is right when it is within one f16 rounding (plus the f32
// accumulation's error) of the exact value. Also the range limits (65504, subnormals), the f32
// accumulation that keeps long sums and dot products finite, and the fused unscale pass.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/generator.h"
#include "core/ops.h"
#include "tests/support/low_precision.h"

namespace minidl {
namespace {

using testing::max_rel_err;

constexpr double kF16Rtol = 1e-3;  // the bound; one f16 rounding is 2^-11 = 4.9e-4

Tensor h(const Tensor& t) { return t.to(DType::f16); }
Tensor wide(const Tensor& t) { return t.to(DType::f64); }  // exact for f16 values

Tensor randn_f16(const Shape& s, uint64_t seed, double scale = 1.0) {
  Generator gen(seed);
  return h(randn(s, {}, &gen) * scale);
}

// The vectorised f16 <-> f32 conversion of contiguous copies (F16C when built with it) against
// Half's scalar IEEE code: every f16 bit pattern, and f32 values around every rounding boundary.
TEST(CpuF16, ContiguousConversionMatchesHalfExactly) {
  std::vector<double> all;
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = Half::to_float(static_cast<uint16_t>(b));
    if (!std::isnan(f)) all.push_back(f);
  }
  const Tensor h16 = from_vector(all, {static_cast<int64_t>(all.size())}, {.dtype = DType::f16});
  EXPECT_EQ(h16.to(DType::f32).to_vector(), all);  // f16 -> f32 is exact
  // Midpoints and near-midpoints between neighbouring f16 values, past 65504 and in the subnormals.
  std::vector<float> probes;
  for (uint32_t b = 0; b < 0x7c00; b += 7) {
    const float lo = Half::to_float(static_cast<uint16_t>(b)), hi = Half::to_float(static_cast<uint16_t>(b + 1));
    const float mid = 0.5f * (lo + hi);
    for (float v : {mid, std::nextafter(mid, 0.0f), std::nextafter(mid, 1e9f), 65519.0f, 65520.0f, 1e6f}) {
      probes.push_back(v);
      probes.push_back(-v);
    }
  }
  const Tensor f32 = from_vector(std::vector<double>(probes.begin(), probes.end()),
                                 {static_cast<int64_t>(probes.size())});
  const Tensor got = f32.to(DType::f16);
  const Half* g = got.data<Half>();
  for (size_t i = 0; i < probes.size(); ++i) {
    ASSERT_EQ(g[i].bits, Half::from_float(probes[i])) << "value " << probes[i];
  }
  const Tensor nan16 = full({9}, std::nan(""), {}).to(DType::f16);
  for (double v : nan16.to_vector()) EXPECT_TRUE(std::isnan(v));
}

TEST(CpuF16, ElementwiseWithinOneRounding) {
  const Tensor a = randn_f16({7, 33}, 1), b = randn_f16({7, 33}, 2);
  const Tensor pos = h(abs(randn(Shape{7, 33})) + 0.1);
  EXPECT_EQ((a + b).dtype(), DType::f16);
  EXPECT_LT(max_rel_err(a + b, wide(a) + wide(b)), kF16Rtol);
  EXPECT_LT(max_rel_err(a - b, wide(a) - wide(b)), kF16Rtol);
  EXPECT_LT(max_rel_err(a * b, wide(a) * wide(b)), kF16Rtol);
  EXPECT_LT(max_rel_err(a / pos, wide(a) / wide(pos)), kF16Rtol);
  EXPECT_LT(max_rel_err(maximum(a, b), maximum(wide(a), wide(b))), kF16Rtol);
  EXPECT_LT(max_rel_err(exp(a), exp(wide(a))), kF16Rtol);
  EXPECT_LT(max_rel_err(log(pos), log(wide(pos))), kF16Rtol);
  EXPECT_LT(max_rel_err(sqrt(pos), sqrt(wide(pos))), kF16Rtol);
  EXPECT_LT(max_rel_err(sigmoid(a), sigmoid(wide(a))), kF16Rtol);
  EXPECT_LT(max_rel_err(tanh(a), tanh(wide(a))), kF16Rtol);
  EXPECT_LT(max_rel_err(pow(pos, 1.5), pow(wide(pos), 1.5)), kF16Rtol);
  EXPECT_EQ(relu(a).to_vector(), relu(wide(a)).to_vector());  // exact
  // Broadcast and strided operands take the other loops.
  const Tensor row = randn_f16({33}, 3);
  EXPECT_LT(max_rel_err(a * row, wide(a) * wide(row)), kF16Rtol);
  EXPECT_LT(max_rel_err(a.t() + b.t(), wide(a).t() + wide(b).t()), kF16Rtol);
  EXPECT_EQ(gt(a, b).to_vector(), gt(wide(a), wide(b)).to_vector());
}

TEST(CpuF16, RangeLimitsAndSubnormals) {
  const Tensor max16 = full({1}, 65504.0, {.dtype = DType::f16});
  EXPECT_EQ((max16 + full({1}, 8.0, {.dtype = DType::f16})).item(), 65504.0);  // 65512 rounds back
  EXPECT_TRUE(std::isinf((max16 + full({1}, 16.0, {.dtype = DType::f16})).item()));  // 65520: ties to inf
  EXPECT_TRUE(std::isinf((max16 * 2.0).item()));
  EXPECT_EQ((max16 * 0.5).item(), 32752.0);
  const double tiny = std::ldexp(1.0, -24);  // smallest subnormal
  const Tensor sub = full({1}, tiny, {.dtype = DType::f16});
  EXPECT_EQ(sub.item(), tiny);
  EXPECT_EQ((sub + sub).item(), 2 * tiny);
  EXPECT_EQ(relu(sub).item(), tiny);
  EXPECT_EQ((sub * 0.5).item(), 0.0);       // 2^-25: a tie, rounds to even (0)
  EXPECT_EQ((sub * 1.5).item(), 2 * tiny);  // 1.5 units: a tie, rounds to even (2 units)
  EXPECT_EQ((full({1}, 6.1e-5, {.dtype = DType::f16}) * 0.5).item(), Half::to_float(Half::from_float(3.05e-5f)));
  // NaN and inf pass through arithmetic; max keeps NaN.
  const Tensor special = from_vector({1.0, std::numeric_limits<double>::infinity(), NAN}, {3}, {.dtype = DType::f16});
  const auto v = (special * 2.0).to_vector();
  EXPECT_EQ(v[0], 2.0);
  EXPECT_TRUE(std::isinf(v[1]));
  EXPECT_TRUE(std::isnan(v[2]));
  EXPECT_TRUE(std::isnan(max(special).item()));
}

TEST(CpuF16, ReductionsAccumulateInF32) {
  // 4096 ones: an f16 accumulator would stop at 2048 (2048 + 1 rounds back to 2048).
  EXPECT_EQ(sum(ones({4096}, {.dtype = DType::f16})).item(), 4096.0);
  EXPECT_EQ(sum(ones({4096}, {.dtype = DType::f16})).dtype(), DType::f16);
  // A mean whose sum leaves the f16 range is still exact.
  EXPECT_EQ(mean(full({100000}, 60000.0, {.dtype = DType::f16})).item(), 60000.0);
  // A sum that does not fit is inf, not a wrapped or clamped value.
  EXPECT_TRUE(std::isinf(sum(ones({70000}, {.dtype = DType::f16})).item()));
  const Tensor a = randn_f16({5, 40, 3}, 4);
  EXPECT_LT(max_rel_err(sum(a, {1}), sum(wide(a), {1})), kF16Rtol);
  EXPECT_LT(max_rel_err(mean(a, {0, 2}), mean(wide(a), {0, 2})), kF16Rtol);
  EXPECT_EQ(max(a, {1}).to_vector(), max(wide(a), {1}).to_vector());
  EXPECT_EQ(min(a, {0}).to_vector(), min(wide(a), {0}).to_vector());
  EXPECT_EQ(argmax(a, 1).to_vector(), argmax(wide(a), 1).to_vector());
}

TEST(CpuF16, MatmulAccumulatesInF32) {
  const Tensor a = randn_f16({3, 17, 40}, 5), b = randn_f16({3, 40, 9}, 6);
  const Tensor c = matmul(a, b);
  EXPECT_EQ(c.dtype(), DType::f16);
  EXPECT_LT(max_rel_err(c, matmul(wide(a), wide(b)), 1e-2), kF16Rtol);
  EXPECT_LT(max_rel_err(matmul(a, b.transpose(1, 2).contiguous().transpose(1, 2)), matmul(wide(a), wide(b)), 1e-2),
            kF16Rtol);
  // Partial sums of 300 * +-300 reach 90000 (past 65504) but the dot product is 0: only an f32
  // accumulator gets it.
  std::vector<double> row(512, 300.0), col(512);
  for (size_t i = 0; i < col.size(); ++i) col[i] = i < 256 ? 300.0 : -300.0;
  const Tensor r = from_vector(row, {1, 512}, {.dtype = DType::f16});
  const Tensor k = from_vector(col, {512, 1}, {.dtype = DType::f16});
  EXPECT_EQ(matmul(r, k).item(), 0.0);
  // A result past the range is inf.
  EXPECT_TRUE(std::isinf(matmul(r, full({512, 1}, 300.0, {.dtype = DType::f16})).item()));
}

TEST(CpuF16, ConvolutionForwardAndBackward) {
  const Tensor x = randn_f16({2, 5, 9, 8}, 7).set_requires_grad(true);
  const Tensor w = randn_f16({6, 5, 3, 3}, 8, 0.3).set_requires_grad(true);
  const Tensor bias = randn_f16({6}, 9).set_requires_grad(true);
  const Tensor xd = wide(x.detach()).set_requires_grad(true);
  const Tensor wd = wide(w.detach()).set_requires_grad(true);
  const Tensor bd = wide(bias.detach()).set_requires_grad(true);
  const Conv2dOptions o{.stride = {2, 1}, .padding = {1, 1}};
  const Tensor y = conv2d(x, w, bias, o), yd = conv2d(xd, wd, bd, o);
  EXPECT_EQ(y.dtype(), DType::f16);
  EXPECT_LT(max_rel_err(y, yd, 1e-2), kF16Rtol);
  const Tensor gy = randn_f16(y.shape(), 10);
  y.backward(gy);
  yd.backward(wide(gy));
  EXPECT_EQ(x.grad().dtype(), DType::f16);
  EXPECT_LT(max_rel_err(x.grad(), xd.grad(), 1e-2), kF16Rtol);
  EXPECT_LT(max_rel_err(w.grad(), wd.grad(), 1e-2), kF16Rtol);
  EXPECT_LT(max_rel_err(bias.grad(), bd.grad(), 1e-2), kF16Rtol);
}

TEST(CpuF16, PoolingForwardAndBackward) {
  const Tensor x = randn_f16({2, 3, 8, 8}, 11).set_requires_grad(true);
  const Tensor xd = wide(x.detach()).set_requires_grad(true);
  const Pool2dOptions o{.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}};
  const Tensor m = max_pool2d(x, o), md = max_pool2d(xd, o);
  EXPECT_EQ(m.to_vector(), md.to_vector());  // the max of f16 values is exact
  const Tensor a = avg_pool2d(x, o), ad = avg_pool2d(xd, o);
  EXPECT_LT(max_rel_err(a, ad), kF16Rtol);
  const Tensor g = adaptive_avg_pool2d(x);
  EXPECT_LT(max_rel_err(g, adaptive_avg_pool2d(xd)), kF16Rtol);
  (sum(m) + sum(a) + sum(g)).backward();
  (sum(md) + sum(ad) + sum(adaptive_avg_pool2d(xd))).backward();
  EXPECT_EQ(x.grad().dtype(), DType::f16);
  EXPECT_LT(max_rel_err(x.grad(), xd.grad()), kF16Rtol);
}

TEST(CpuF16, BatchNormTakesF16WithF32StatisticsAndParameters) {
  // A large offset: statistics in f32/double keep the variance right where f16 sums would not.
  const Tensor x = h(randn(Shape{4, 3, 5, 5}) + 100.0).set_requires_grad(true);
  const Tensor xd = wide(x.detach()).set_requires_grad(true);
  const Tensor w = from_vector({1.0, 0.5, 2.0}, {3}).set_requires_grad(true);
  const Tensor b = from_vector({0.0, 0.1, -0.2}, {3}).set_requires_grad(true);
  const Tensor wd = wide(w.detach()).set_requires_grad(true), bd = wide(b.detach()).set_requires_grad(true);
  Tensor rm = zeros({3}), rv = ones({3});
  Tensor rmd = zeros({3}, {.dtype = DType::f64}), rvd = ones({3}, {.dtype = DType::f64});
  const Tensor y = batch_norm(x, w, b, rm, rv, true);
  const Tensor yd = batch_norm(xd, wd, bd, rmd, rvd, true);
  EXPECT_EQ(y.dtype(), DType::f16);
  EXPECT_EQ(rm.dtype(), DType::f32);
  EXPECT_LT(max_rel_err(y, yd, 1e-2), 2 * kF16Rtol);
  EXPECT_LT(max_rel_err(rm, rmd), 1e-6);
  EXPECT_LT(max_rel_err(rv, rvd), 1e-5);
  const Tensor gy = randn_f16(y.shape(), 12);
  y.backward(gy);
  yd.backward(wide(gy));
  EXPECT_EQ(x.grad().dtype(), DType::f16);
  EXPECT_EQ(w.grad().dtype(), DType::f32);
  EXPECT_LT(max_rel_err(x.grad(), xd.grad(), 1e-1), 1e-2);
  EXPECT_LT(max_rel_err(w.grad(), wd.grad(), 1e-2), kF16Rtol);
  EXPECT_LT(max_rel_err(b.grad(), bd.grad(), 1e-2), kF16Rtol);
  const Tensor ye = batch_norm(x.detach(), w.detach(), b.detach(), rm, rv, false);
  EXPECT_LT(max_rel_err(ye, batch_norm(xd.detach(), wd.detach(), bd.detach(), rmd, rvd, false), 1e-2), 2 * kF16Rtol);
}

TEST(CpuF16, SoftmaxAndLossesComputeInF32) {
  // Large logits: exp would overflow in f16, the max-subtracted f32 path does not (and every
  // log-probability, down to -60000, is still representable).
  const Tensor x = from_vector({30000, 29990, -30000, 1, 2, 3}, {2, 3}, {.dtype = DType::f16}).set_requires_grad(true);
  const Tensor xd = wide(x.detach()).set_requires_grad(true);
  const Tensor target = from_vector({1, 2}, {2}, {.dtype = DType::i64});
  EXPECT_LT(max_rel_err(softmax(x, 1), softmax(xd, 1), 1e-4), kF16Rtol);
  EXPECT_LT(max_rel_err(log_softmax(x, 1), log_softmax(xd, 1)), kF16Rtol);
  const Tensor l = cross_entropy(x, target), ld = cross_entropy(xd, target);
  EXPECT_EQ(l.dtype(), DType::f16);
  EXPECT_LT(max_rel_err(l, ld), kF16Rtol);
  l.backward();
  ld.backward();
  EXPECT_LT(max_rel_err(x.grad(), xd.grad(), 1e-2), kF16Rtol);
  const Tensor z = randn_f16({6}, 13), t = h(from_vector({0, 1, 1, 0, 1, 0}, {6}));
  EXPECT_LT(max_rel_err(binary_cross_entropy_with_logits(z, t), binary_cross_entropy_with_logits(wide(z), wide(t))),
            kF16Rtol);
}

TEST(CpuF16, Dropout) {
  Generator gen(16);
  const Tensor x = ones({4000}, {.dtype = DType::f16});
  const Tensor y = dropout(x, 0.25, true, &gen);
  EXPECT_EQ(y.dtype(), DType::f16);
  int64_t kept = 0;
  for (double v : y.to_vector()) {
    ASSERT_TRUE(v == 0.0 || v == Half::to_float(Half::from_float(1.0f / 0.75f))) << v;
    kept += v != 0.0 ? 1 : 0;
  }
  EXPECT_NEAR(static_cast<double>(kept) / 4000.0, 0.75, 0.03);
}

TEST(CpuF16, FusedUnscaleMatchesTheComposedDefault) {
  Backend& be = backend(Device::cpu());
  // f32 contiguous, f16 (pure-f16 gradients), f64 transposed (strided).
  auto make = [](uint64_t seed) {
    Generator gen(seed);
    std::vector<Tensor> g{randn(Shape{1000}, {}, &gen) * 1024.0, h(randn(Shape{33, 7}, {}, &gen) * 512.0),
                          randn(Shape{5, 4}, {.dtype = DType::f64}, &gen).t()};
    return g;
  };
  std::vector<Tensor> fused = make(14);
  std::vector<Tensor> composed = make(14);
  Tensor f1 = zeros({1}), f2 = zeros({1});
  be.unscale_grads(fused, 1.0 / 1024.0, f1);
  be.Backend::unscale_grads(composed, 1.0 / 1024.0, f2);
  EXPECT_EQ(f1.item(), 0.0);
  EXPECT_EQ(f2.item(), 0.0);
  for (size_t i = 0; i < fused.size(); ++i) {
    EXPECT_EQ(fused[i].dtype(), composed[i].dtype());
    EXPECT_EQ(fused[i].to_vector(), composed[i].to_vector()) << "tensor " << i;
  }
  // One inf (f16 overflow of a scaled gradient) or NaN anywhere raises the flag; a raised flag stays.
  for (double bad : {std::numeric_limits<double>::infinity(), std::nan("")}) {
    std::vector<Tensor> g = make(15);
    g[1].select(0, 20).select(0, 3).fill_(bad);
    std::vector<Tensor> g2 = make(15);
    g2[1].select(0, 20).select(0, 3).fill_(bad);
    Tensor a = zeros({1}), b = zeros({1});
    be.unscale_grads(g, 0.5, a);
    be.Backend::unscale_grads(g2, 0.5, b);
    EXPECT_EQ(a.item(), 1.0);
    EXPECT_EQ(b.item(), 1.0);
    be.unscale_grads({ones({3})}, 0.5, a);
    EXPECT_EQ(a.item(), 1.0);
  }
}

}  // namespace
}  // namespace minidl
