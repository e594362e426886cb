// bf16 on the CPU backend, op by op against f32: each case runs once with its inputs in bf16 and
// once in f32 (the same values: every input is bf16-representable), and the bf16 result must be
// the f32 result rounded to bf16 once, bit for bit, where the bf16 path computes in f32 as f16
// does; the GEMM, which accumulates in its own order, within bf16's tolerance. One case per
// Backend op (tests/kernels/parity_cases.h, cpu_bf16_cases), so a new op cannot skip bf16.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/conv_bn.h"
#include "core/generator.h"
#include "core/ops.h"
#include "tests/support/low_precision.h"

namespace minidl {
namespace {

using testing::normalised_err;
using testing::raw_bytes;

// Four bf16 roundings (2^-9 each) of normalised error: the GEMM's result is rounded once, but its
// f32 sums run in another order than the f32 GEMM's.
constexpr double kBf16Rtol = 8e-3;

// t's values rounded to bf16, held in f32: the bf16 and f32 runs start from the same numbers.
Tensor exact(const Tensor& t) { return t.to(DType::bf16).to(DType::f32); }

Tensor input(const Shape& s, uint64_t seed, double scale = 1.0, double shift = 0.0) {
  Generator gen(seed);
  return exact(randn(s, {}, &gen) * scale + shift);
}

// A fresh leaf of t's values in dtype dt that requires grad (t.to(f32) would be t itself, whose
// gradient the next leaf made from it would share).
Tensor leaf(const Tensor& t, DType dt) { return t.to(dt).detach().clone().set_requires_grad(true); }

// A case's outputs (results, then gradients) from inputs of dtype dt (bf16 or f32).
using Run = std::function<std::vector<Tensor>(DType)>;

// rtol 0: every bf16 output equals its f32 twin rounded to bf16 (or equals it outright where both
// runs keep it in f32 or an integer dtype). Otherwise the bf16 output's normalised error against
// the f32 one is below rtol.
void expect_matches_f32(const Run& run, double rtol = 0.0) {
  const std::vector<Tensor> lo = run(DType::bf16), ref = run(DType::f32);
  ASSERT_EQ(lo.size(), ref.size());
  for (size_t i = 0; i < lo.size(); ++i) {
    SCOPED_TRACE("output " + std::to_string(i) + ": " + lo[i].meta() + " vs f32 " + ref[i].meta());
    ASSERT_EQ(lo[i].shape(), ref[i].shape());
    if (ref[i].dtype() == DType::f32 && lo[i].dtype() != DType::f32) {
      EXPECT_EQ(lo[i].dtype(), DType::bf16);
    }
    if (rtol > 0) {
      EXPECT_LT(normalised_err(lo[i], ref[i]), rtol);
      continue;
    }
    const Tensor want = ref[i].to(lo[i].dtype());
    const std::vector<double> a = lo[i].to_vector(), b = want.to_vector();
    for (size_t k = 0; k < a.size(); ++k) {
      if (std::isnan(a[k]) && std::isnan(b[k])) continue;
      ASSERT_EQ(a[k], b[k]) << "element " << k << " (f32 result " << ref[i].to_vector()[k] << ")";
    }
    EXPECT_EQ(raw_bytes(lo[i]), raw_bytes(want));
  }
}

// x's gradient (and the others') after backward of y with the upstream gradient gy.
std::vector<Tensor> grads(const Tensor& y, const Tensor& gy, const std::vector<Tensor>& of) {
  y.backward(gy);
  std::vector<Tensor> g;
  for (const Tensor& t : of) g.push_back(t.grad());
  return g;
}

std::vector<Tensor> cat(std::vector<Tensor> a, const std::vector<Tensor>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

TEST(CpuBf16Parity, CopiesAndCastsToAndFromEveryDtype) {
  const Tensor x = input({5, 7}, 1, 40.0);  // integers up to ~100 and fractions, both signs
  for (DType d : {DType::f32, DType::f64, DType::f16, DType::i32, DType::i64, DType::u8, DType::boolean}) {
    SCOPED_TRACE(dtype_name(d));
    const Tensor from_bf16 = x.to(DType::bf16).to(d);
    EXPECT_EQ(from_bf16.dtype(), d);
    EXPECT_EQ(raw_bytes(from_bf16), raw_bytes(x.to(d)));  // bf16 -> d is f32 -> d
    const Tensor s = abs(x).to(d);  // every dtype, u8 and bool included, holds these
    EXPECT_EQ(raw_bytes(s.to(DType::bf16)), raw_bytes(s.to(DType::f32).to(DType::bf16)));
  }
  // Strided source and destination (the element loop, not the contiguous one).
  const Tensor t = x.to(DType::bf16).t();
  EXPECT_EQ(raw_bytes(t.contiguous()), raw_bytes(x.t().contiguous().to(DType::bf16)));
  Tensor dst = zeros({7, 5}, {.dtype = DType::bf16});
  dst.t().copy_(x);
  EXPECT_EQ(dst.t().to_vector(), x.to(DType::bf16).to_vector());
  EXPECT_EQ(std::string(dtype_name(DType::bf16)), "bf16");
  EXPECT_EQ(dtype_from_name("bf16"), DType::bf16);
  EXPECT_EQ(dtype_size(DType::bf16), 2u);
  EXPECT_TRUE(is_floating(DType::bf16));
  EXPECT_NE(x.to(DType::bf16).str().find("bf16[5, 7]"), std::string::npos) << x.to(DType::bf16).str();
}

TEST(CpuBf16Parity, FillsAndFactories) {
  for (double v : {0.1, -3.0e38, 1e-40, 65536.0 + 256.0, -0.0}) {
    SCOPED_TRACE(v);
    EXPECT_EQ(raw_bytes(full({9}, v, {.dtype = DType::bf16})), raw_bytes(full({9}, v).to(DType::bf16)));
    Tensor z = zeros({4, 4}, {.dtype = DType::bf16});
    z.t().fill_(v);
    EXPECT_EQ(raw_bytes(z), raw_bytes(full({4, 4}, v).to(DType::bf16)));
  }
}

TEST(CpuBf16Parity, UnaryOpsRoundOnce) {
  const Tensor a = input({7, 33}, 2), pos = exact(abs(input({7, 33}, 3)) + 0.125);
  using Op = std::function<Tensor(const Tensor&)>;
  const std::vector<std::pair<const char*, Op>> ops{
      {"neg", [](const Tensor& t) { return neg(t); }},       {"exp", [](const Tensor& t) { return exp(t); }},
      {"abs", [](const Tensor& t) { return abs(t); }},       {"relu", [](const Tensor& t) { return relu(t); }},
      {"sigmoid", [](const Tensor& t) { return sigmoid(t); }}, {"tanh", [](const Tensor& t) { return tanh(t); }},
      {"square", [](const Tensor& t) { return square(t); }}, {"scale", [](const Tensor& t) { return t * 0.296875; }},
      {"shift", [](const Tensor& t) { return t + 2.5; }},    {"rsub", [](const Tensor& t) { return 1.0 - t; }},
  };
  // A scalar operand becomes a tensor of the other's dtype (as for f16): these are bf16 values.
  for (const auto& [name, op] : ops) {
    SCOPED_TRACE(name);
    expect_matches_f32([&, op = op](DType dt) { return std::vector<Tensor>{op(a.to(dt)), op(a.to(dt).t())}; });
  }
  const std::vector<std::pair<const char*, Op>> positive{
      {"log", [](const Tensor& t) { return log(t); }},   {"log1p", [](const Tensor& t) { return log1p(t); }},
      {"sqrt", [](const Tensor& t) { return sqrt(t); }}, {"pow", [](const Tensor& t) { return pow(t, 1.5); }},
  };
  for (const auto& [name, op] : positive) {
    SCOPED_TRACE(name);
    expect_matches_f32([&, op = op](DType dt) { return std::vector<Tensor>{op(pos.to(dt))}; });
  }
  // relu's bit rule: NaN, -0 and negatives give +0; inf passes.
  const Tensor special = from_vector({NAN, -0.0, -INFINITY, INFINITY, 1e-40, -1e-40}, {6}, {.dtype = DType::bf16});
  EXPECT_EQ(relu(special).to_vector(), (std::vector<double>{0, 0, 0, INFINITY, special.to_vector()[4], 0}));
}

TEST(CpuBf16Parity, BinaryOpsBroadcastingAndComparisons) {
  const Tensor a = input({7, 33}, 4), b = input({7, 33}, 5), row = input({33}, 6), pos = exact(abs(b) + 0.25);
  expect_matches_f32([&](DType dt) {
    const Tensor x = a.to(dt), y = b.to(dt);
    return std::vector<Tensor>{x + y,          x - y,           x * y,          x / pos.to(dt),
                               maximum(x, y), minimum(x, y),   x * row.to(dt), x.t() + y.t(),
                               gt(x, y),      eq(x, abs(y)), le(x, row.to(dt))};
  });
  // Past f16's range, within bf16's.
  const Tensor big = full({1}, 3e38, {.dtype = DType::bf16});
  EXPECT_TRUE(std::isinf((big + big).item()));
  EXPECT_NEAR((big * 0.5).item(), 1.5e38, 1.5e38 * 4e-3);
}

TEST(CpuBf16Parity, ReductionsAccumulateInF32) {
  const Tensor a = input({5, 40, 3}, 7);
  expect_matches_f32([&](DType dt) {
    const Tensor x = a.to(dt);
    return std::vector<Tensor>{sum(x),      sum(x, {1}),        mean(x, {0, 2}), max(x, {1}),
                               min(x, {0}), argmax(x, 1),       argmin(x, 2),    sum(x.transpose(0, 2), {0})};
  });
  // 257 ones: a bf16 accumulator stops at 256 (256 + 1 rounds back); the f32 one does not, and
  // 4096 is a bf16 value.
  EXPECT_EQ(sum(ones({4096}, {.dtype = DType::bf16})).item(), 4096.0);
  EXPECT_EQ(mean(full({1000}, 3.0e38, {.dtype = DType::bf16})).item(), BFloat16::to_float(BFloat16::from_float(3.0e38f)));
}

TEST(CpuBf16Parity, MatmulAccumulatesInF32) {
  const Tensor a = input({3, 17, 40}, 8), b = input({3, 40, 9}, 9);
  expect_matches_f32(
      [&](DType dt) {
        const Tensor x = a.to(dt), y = b.to(dt);
        return std::vector<Tensor>{matmul(x, y), matmul(x, y.transpose(1, 2).contiguous().transpose(1, 2)),
                                   matmul(x.select(0, 1), y.select(0, 2))};
      },
      kBf16Rtol);
  // Partial sums alternate between about 90000 and a multiple of 600: exact in f32, while a bf16
  // accumulator (a step of 512 at 90000) would lose the 600s.
  std::vector<double> row(512, 300.0), col(512);
  for (size_t i = 0; i < col.size(); ++i) col[i] = i % 2 == 0 ? 302.0 : -300.0;
  const Tensor r = from_vector(row, {1, 512}, {.dtype = DType::bf16});
  const Tensor k = from_vector(col, {512, 1}, {.dtype = DType::bf16});
  EXPECT_EQ(matmul(r, k).item(), 256.0 * 600.0);
  EXPECT_EQ(matmul(r, k).dtype(), DType::bf16);
}

TEST(CpuBf16Parity, RandomDrawsAndDropout) {
  expect_matches_f32([](DType dt) {
    Generator g1(11), g2(11), g3(11);
    const Tensor x = full({1000}, 1.5, {.dtype = dt});
    return std::vector<Tensor>{randn({1000}, {.dtype = dt}, &g1), rand({257}, {.dtype = dt}, &g2),
                               dropout(x, 0.25, true, &g3)};
  });
}

TEST(CpuBf16Parity, Conv2dForwardAndBackward) {
  const Tensor x0 = input({2, 5, 9, 8}, 12), w0 = input({6, 5, 3, 3}, 13, 0.3), b0 = input({6}, 14);
  const Conv2dOptions o{.stride = {2, 1}, .padding = {1, 1}};
  const Tensor gy0 = input({2, 6, 5, 8}, 15);
  expect_matches_f32([&](DType dt) {
    const Tensor x = leaf(x0, dt), w = leaf(w0, dt);
    const Tensor b = leaf(b0, dt);
    const Tensor y = conv2d(x, w, b, o);
    return cat({y}, grads(y, gy0.to(dt), {x, w, b}));
  });
}

TEST(CpuBf16Parity, ConvStatsChainComposedInBf16) {
  // conv2d_stats in bf16: y in bf16, its statistics in f32 (as under f16); the CPU composes it, so
  // the second convolution reads a bf16-rounded activation: within bf16's tolerance of f32.
  const Tensor x0 = input({2, 3, 6, 6}, 40), w0 = input({4, 3, 3, 3}, 41, 0.3), w1 = input({5, 4, 3, 3}, 42, 0.3);
  const Tensor scale = exact(full({4}, 0.75)), bias = exact(full({4}, 0.125));
  const Conv2dOptions o{.padding = {1, 1}};
  expect_matches_f32(
      [&](DType dt) {
        const Tensor x = leaf(x0, dt), w = leaf(w0, dt), v = leaf(w1, dt);
        const ConvStats s1 = conv2d_stats(x, Tensor(), Tensor(), w, o);
        const ConvStats s2 = conv2d_stats(s1.y, scale, bias, v, o);
        EXPECT_EQ(s2.sum.dtype(), DType::f32);
        (sum(s2.y).to(DType::f32) + sum(s2.sumsq) * 0.01 + sum(s1.sum)).backward();
        return std::vector<Tensor>{s1.y, s1.sum, s1.sumsq, s2.y, s2.sum, x.grad(), w.grad(), v.grad()};
      },
      kBf16Rtol);
}

TEST(CpuBf16Parity, PoolingForwardAndBackward) {
  const Tensor x0 = input({2, 3, 8, 8}, 16);
  const Pool2dOptions o{.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}};
  const Tensor gm = input({2, 3, 4, 4}, 17), ga = input({2, 3, 4, 4}, 18);
  expect_matches_f32([&](DType dt) {
    const Tensor x = leaf(x0, dt);
    const Tensor m = max_pool2d(x, o);
    const std::vector<Tensor> gmax = grads(m, gm.to(dt), {x});
    const Tensor x2 = leaf(x0, dt);
    const Tensor a = avg_pool2d(x2, o);
    return cat(cat({m, a}, gmax), grads(a, ga.to(dt), {x2}));
  });
}

TEST(CpuBf16Parity, BatchNormTrainEvalAndBackward) {
  // A large offset: f32 statistics keep the variance right where bf16 sums would not.
  const Tensor x0 = input({4, 3, 5, 5}, 19, 1.0, 100.0), gy0 = input({4, 3, 5, 5}, 20);
  expect_matches_f32([&](DType dt) {
    const Tensor x = leaf(x0, dt);
    const Tensor w = from_vector({1.0, 0.5, 2.0}, {3}).set_requires_grad(true);
    const Tensor b = from_vector({0.0, 0.125, -0.25}, {3}).set_requires_grad(true);
    Tensor rm = zeros({3}), rv = ones({3});
    const Tensor y = batch_norm(x, w, b, rm, rv, true);
    const std::vector<Tensor> g = grads(y, gy0.to(dt), {x, w, b});
    const Tensor ye = batch_norm(x.detach(), w.detach(), b.detach(), rm, rv, false);
    return cat({y, rm, rv, ye}, g);
  });
}

TEST(CpuBf16Parity, BatchNormReluAndAddReluFused) {
  const Tensor x0 = input({2, 4, 3, 5}, 21), r0 = input({2, 4, 3, 5}, 22), gy0 = input({2, 4, 3, 5}, 23);
  expect_matches_f32([&](DType dt) {
    const Tensor x = leaf(x0, dt), r = leaf(r0, dt);
    const Tensor w = ones({4}).set_requires_grad(true), b = full({4}, 0.25).set_requires_grad(true);
    Tensor rm = zeros({4}), rv = ones({4});
    const Tensor y = batch_norm_add_relu(x, r, w, b, rm, rv, true);
    const std::vector<Tensor> g = grads(y, gy0.to(dt), {x, r, w, b});
    const Tensor x2 = x0.to(dt);
    return cat({y, batch_norm_relu(x2, w.detach(), b.detach(), rm, rv, false)}, g);
  });
}

TEST(CpuBf16Parity, SoftmaxAndLogSoftmaxOverAnyDim) {
  const Tensor x0 = input({3, 5, 4}, 24, 3.0), gy0 = input({3, 5, 4}, 25);
  for (int64_t dim : {0, 1, 2}) {
    SCOPED_TRACE("dim " + std::to_string(dim));
    expect_matches_f32([&](DType dt) {
      const Tensor x = x0.to(dt);
      return std::vector<Tensor>{softmax(x, dim), log_softmax(x, dim)};
    });
    // The backward reads the saved output, which bf16 has already rounded, and subtracts nearly
    // equal terms: the gradient is within a few roundings of f32's (normalised), not one.
    expect_matches_f32(
        [&](DType dt) {
          const Tensor x = leaf(x0, dt), x2 = leaf(x0, dt);
          return cat(grads(softmax(x, dim), gy0.to(dt), {x}), grads(log_softmax(x2, dim), gy0.to(dt), {x2}));
        },
        kBf16Rtol);
  }
}

const Tensor kTarget = from_vector({1, 2, 0, 4, 4, 3}, {6}, {.dtype = DType::i64});

TEST(CpuBf16Parity, NllLossForwardAndBackward) {
  const Tensor x0 = input({6, 5}, 26), g0 = input({6}, 27);
  expect_matches_f32([&](DType dt) {
    const Tensor lp = leaf(exact(log_softmax(x0, 1)), dt);
    const Tensor l = nll_loss(lp, kTarget, Reduction::None);
    return cat({l}, grads(l, g0.to(dt), {lp}));
  });
}

TEST(CpuBf16Parity, CrossEntropyWithSmoothing) {
  const Tensor x0 = input({6, 5}, 28, 4.0), g0 = input({6}, 29);
  expect_matches_f32([&](DType dt) {
    const Tensor x = leaf(x0, dt);
    const Tensor l = cross_entropy(x, kTarget, Reduction::None, 0.1);
    return cat({l}, grads(l, g0.to(dt), {x}));
  });
}

TEST(CpuBf16Parity, BceWithLogitsForwardAndBackward) {
  const Tensor z0 = input({6, 3}, 30, 3.0), t0 = gt(input({6, 3}, 31), input({6, 3}, 32)).to(DType::f32);
  const Tensor g0 = input({6, 3}, 33);
  expect_matches_f32([&](DType dt) {
    const Tensor z = leaf(z0, dt);
    const Tensor l = binary_cross_entropy_with_logits(z, t0.to(dt), Reduction::None);
    return cat({l}, grads(l, g0.to(dt), {z}));
  });
}

TEST(CpuBf16Parity, UnscaleGradsAndTheNonFiniteFlag) {
  Backend& be = backend(Device::cpu());
  expect_matches_f32([&](DType dt) {
    std::vector<Tensor> g{input({33, 7}, 34, 512.0).to(dt), input({5, 4}, 35, 64.0).to(dt).t()};
    Tensor flag = zeros({1});
    be.unscale_grads(g, 1.0 / 1024.0, flag);
    return cat(g, {flag});
  });
  for (double bad : {INFINITY, NAN}) {
    std::vector<Tensor> g{input({33, 7}, 36).to(DType::bf16)};
    g[0].select(0, 20).select(0, 3).fill_(bad);
    Tensor flag = zeros({1});
    be.unscale_grads(g, 0.5, flag);
    EXPECT_EQ(flag.item(), 1.0);
  }
  // The scale on the device is a GPU path: the CPU refuses it with a message.
  EXPECT_THROW(be.unscale_grads_device({zeros({2}, {.dtype = DType::bf16})}, ones({1}), zeros({1})), Error);
}

TEST(CpuBf16Parity, FusedOptimizerStepsDeclineBf16) {
  // The fused steps take f32 master weights; a bf16 group falls back to the per-tensor path.
  Backend& be = backend(Device::cpu());
  const Tensor p = ones({4}, {.dtype = DType::bf16});
  EXPECT_FALSE(be.fused_sgd_step({p}, {p}, {p}, {1}, SgdHyper{0.1, 0.0, 0.9, 0.0, false, false}));
  EXPECT_FALSE(be.fused_adam_step({p}, {p}, {p}, {p}, {}, {1}, AdamHyper{0.1, 0.0, 0.9, 0.999, 1e-8, false, false, false}));
  EXPECT_EQ(p.to_vector(), (std::vector<double>{1, 1, 1, 1}));  // untouched
}

}  // namespace
}  // namespace minidl
