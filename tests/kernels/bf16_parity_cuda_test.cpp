// bf16 on the CUDA backend against the CPU backend's bf16, op by op (one case per Backend op:
// tests/kernels/parity_cases.h, cuda_bf16_cases): casts, fills and random draws bit for bit (both
// round f32 to bf16 once, to nearest even); elementwise ops, reductions, pooling, batch norm,
// softmax and the losses within a rounding or two (both compute in f32 and round once, with their
// own libm and summation order); cuBLAS and cuDNN (legacy and fused graphs) in bf16 with f32
// accumulation, within a few roundings. Last, a ResNet step under bf16 autocast on the device
// against the same step on the CPU, and three steps of a pure-bf16 model. kernels_cuda_emu runs it
// on the emulated device.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/backend.h"
#include "core/conv_bn.h"
#include "core/ops.h"
#include "nn/autocast.h"
#include "nn/resnet.h"
#include "optim/sgd.h"
#include "tests/support/low_precision.h"
#include "tests/support/parity_helpers.h"
#include "tests/support/small_cnn.h"

namespace minidl {
namespace {

using namespace testing::parity;   // NOLINT: the shared harness (tests/support/parity_helpers.h)

class Bf16Parity : public Parity {};

// Four bf16 roundings (2^-9 each) of normalised error: for the library calls (cuBLAS, cuDNN),
// which accumulate in f32 in an order of their own and round once.
constexpr double kLibTol = 8e-3;

// Values across bf16's range: random normals, numbers past f16's range, bf16 subnormals, zeros of
// both signs, infinities and NaN. Odd length, so the vector casts' scalar tails run too.
Tensor edge_values(int64_t n, uint64_t seed) {
  Generator g(seed);
  std::vector<double> v = randn({n}, {.dtype = DType::f64}, &g).to_vector();
  const std::vector<double> edges{3.0e38, -3.0e38, 3.4e38, 1e5,  65520.0, 1e-39, -1e-40, 9.2e-41,
                                  0.0,    -0.0,    INFINITY, -INFINITY, NAN, 1.00390625, 1.005859375};
  for (size_t i = 0; i < edges.size() && i * 37 < v.size(); ++i) v[i * 37] = edges[i];
  return from_vector(v, {n}, {.dtype = DType::f64});
}

TEST_F(Bf16Parity, CastsToAndFromEveryDtypeBitForBit) {
  const std::vector<DType> all{DType::f32, DType::f64, DType::f16, DType::bf16, DType::i32,
                               DType::i64, DType::u8,  DType::boolean};
  // 4099 elements: the vectorised f32 <-> bf16 casts (8 a thread) and their scalar tail.
  const Tensor edges = edge_values(4099, 1);
  for (DType from : {DType::f32, DType::f64}) {
    const Tensor s = edges.to(from);
    const Tensor b = s.to(DType::bf16);
    ASSERT_TRUE(close(b, to_target(s).to(DType::bf16), 0, std::string("cast ") + dtype_name(from) + " -> bf16"));
    ASSERT_TRUE(close(b.to(from), to_target(b).to(from), 0, std::string("cast bf16 -> ") + dtype_name(from)));
  }
  const Tensor base = rnd({13, 21}, DType::f64, 9).mul_(50.0);
  for (DType other : all) {
    const Tensor src = abs(base).to(other);   // every dtype, u8 and bool included, holds these
    const Tensor g = to_target(src);
    ASSERT_TRUE(close(src.to(DType::bf16), g.to(DType::bf16), 0, std::string("cast ") + dtype_name(other) + " -> bf16"));
    ASSERT_TRUE(close(src.t().to(DType::bf16), g.t().to(DType::bf16), 0, "strided cast to bf16"));
    const Tensor b = base.to(DType::bf16);
    const Tensor to = other == DType::u8 ? abs(b).to(other) : b.to(other);
    ASSERT_TRUE(close(to, other == DType::u8 ? abs(to_target(b)).to(other) : to_target(b).to(other), 0,
                      std::string("cast bf16 -> ") + dtype_name(other)));
  }
  // A channels-last pair takes the flat vector cast too.
  const Tensor x = rnd({2, 8, 5, 3}, DType::f32, 10);
  const Tensor xl = to_channels_last(to_target(x)).to(DType::bf16);
  EXPECT_TRUE(is_channels_last(xl));
  EXPECT_TRUE(close(x.to(DType::bf16), xl, 0, "channels-last cast f32 -> bf16"));
}

TEST_F(Bf16Parity, FillsAndRandomDrawsBitForBit) {
  for (double v : {0.1, -3.0e38, 1e-40, 65536.0 + 256.0, 1.0 / 3.0}) {
    Tensor z = zeros({4, 4}, {.dtype = DType::bf16}), zg = to_target(z);
    z.t().fill_(v);
    zg.t().fill_(v);
    EXPECT_TRUE(close(z, zg, 0, "fill " + std::to_string(v)));
  }
  for (int64_t n : {1, 5, 1001}) {
    Generator gc(42), gg(42);
    EXPECT_TRUE(close(rand({n}, {DType::bf16}, &gc), rand({n}, {DType::bf16, kGpu}, &gg), 0, "rand"));
    EXPECT_TRUE(close(normal({n}, 1, 2, {DType::bf16}, &gc), normal({n}, 1, 2, {DType::bf16, kGpu}, &gg), 0, "normal"));
    EXPECT_EQ(gc.offset(), gg.offset());
  }
  Generator gc(3), gg(3);
  const Tensor x = rnd({33, 65}, DType::bf16, 2);
  EXPECT_TRUE(close(dropout(x, 0.3, true, &gc), dropout(to_target(x), 0.3, true, &gg), 0, "dropout"));
}

TEST_F(Bf16Parity, UnaryAndBinaryOpsComputeInF32AndRoundOnce) {
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> unary{
      {"neg", [](const Tensor& x) { return neg(x); }},         {"exp", [](const Tensor& x) { return exp(x); }},
      {"log", [](const Tensor& x) { return log(abs(x) + 0.1); }}, {"sqrt", [](const Tensor& x) { return sqrt(abs(x) + 0.1); }},
      {"relu", [](const Tensor& x) { return relu(x); }},       {"sigmoid", [](const Tensor& x) { return sigmoid(x); }},
      {"tanh", [](const Tensor& x) { return tanh(x); }},       {"pow", [](const Tensor& x) { return pow(abs(x) + 0.5, 2.5); }},
  };
  for (const auto& [name, op] : unary) {
    for (const Shape& s : {Shape{7}, Shape{33, 17}, Shape{4099}}) {
      check_op(name, [&op = op](const std::vector<Tensor>& v) { return op(v[0]); }, {s}, DType::bf16, s.size() > 1, true);
      if (HasFatalFailure()) return;
    }
  }
  check_op("add", [](const std::vector<Tensor>& v) { return v[0] + v[1]; }, {{7, 33}, {33}}, DType::bf16, false, true);
  check_op("mul", [](const std::vector<Tensor>& v) { return v[0] * v[1]; }, {{3, 5, 129}, {3, 1, 129}}, DType::bf16,
           false, true);
  check_op("div", [](const std::vector<Tensor>& v) { return v[0] / (abs(v[1]) + 0.5); }, {{33, 17}, {33, 17}},
           DType::bf16, true, true);
  check_op("maximum", [](const std::vector<Tensor>& v) { return maximum(v[0], v[1]); }, {{9, 8}, {8}}, DType::bf16,
           false, true);
  const Tensor a = rnd({6, 9}, DType::bf16, 5), b = rnd({9}, DType::bf16, 6);
  const Tensor ag = to_target(a), bg = to_target(b);
  EXPECT_TRUE(close(lt(a, b).to(DType::f32), lt(ag, bg).to(DType::f32), 0, "lt"));
  EXPECT_TRUE(close(eq(a, a).to(DType::f32), eq(ag, ag).to(DType::f32), 0, "eq"));
  // Past f16's range, within bf16's: no overflow until f32's.
  const Tensor big = full({1}, 3e38, {DType::bf16, kGpu});
  EXPECT_TRUE(std::isinf((big + big).item()));
  EXPECT_NEAR((big * 0.5).item(), 1.5e38, 1.5e38 * 4e-3);
}

TEST_F(Bf16Parity, ReductionsAccumulateInF32) {
  const Tensor a = rnd({5, 40, 3}, DType::bf16, 7), ag = to_target(a);
  EXPECT_TRUE(close(sum(a), sum(ag), tol_for(DType::bf16), "sum"));
  EXPECT_TRUE(close(sum(a, {1}), sum(ag, {1}), tol_for(DType::bf16), "sum over dim 1"));
  EXPECT_TRUE(close(mean(a, {0, 2}), mean(ag, {0, 2}), tol_for(DType::bf16), "mean"));
  EXPECT_TRUE(close(sum(a.transpose(0, 2), {0}), sum(ag.transpose(0, 2), {0}), tol_for(DType::bf16), "strided sum"));
  EXPECT_TRUE(close(max(a, {1}), max(ag, {1}), 0, "max"));
  EXPECT_TRUE(close(argmin(a, 2).to(DType::f32), argmin(ag, 2).to(DType::f32), 0, "argmin"));
  // 4096 ones: a bf16 accumulator would stop at 256.
  EXPECT_EQ(sum(ones({4096}, {DType::bf16, kGpu})).item(), 4096.0);
}

TEST_F(Bf16Parity, MatmulOnCublasWithF32Accumulation) {
  check_op("matmul", [](const std::vector<Tensor>& v) { return matmul(v[0], v[1]); }, {{3, 17, 40}, {3, 40, 9}},
           DType::bf16, false, true, kLibTol);
  check_op("matmul (transposed operands)", [](const std::vector<Tensor>& v) { return matmul(v[0], v[1]); },
           {{64, 256}, {256, 96}}, DType::bf16, true, true, kLibTol);
  // Partial sums alternate between about 90000 and a multiple of 600: exact in f32, while a bf16
  // accumulator (a step of 512 at 90000) would lose the 600s.
  std::vector<double> row(512, 300.0), col(512);
  for (size_t i = 0; i < col.size(); ++i) col[i] = i % 2 == 0 ? 302.0 : -300.0;
  const Tensor r = from_vector(row, {1, 512}, {.dtype = DType::bf16});
  const Tensor k = from_vector(col, {512, 1}, {.dtype = DType::bf16});
  const Tensor p = matmul(to_target(r), to_target(k));
  EXPECT_EQ(p.dtype(), DType::bf16);
  EXPECT_EQ(p.item(), 256.0 * 600.0);
}

TEST_F(Bf16Parity, Conv2dForwardAndBackwardInBothLayouts) {
  const Conv2dOptions s2{.stride = {2, 2}, .padding = {1, 1}};
  check_op("conv2d bf16", [s2](const std::vector<Tensor>& v) { return conv2d(v[0], v[1], v[2], s2); },
           {{3, 5, 17, 15}, {8, 5, 3, 3}, {8}}, DType::bf16, false, true, kLibTol);
  check_op("conv2d bf16 1x1", [](const std::vector<Tensor>& v) { return conv2d(v[0], v[1], Tensor(), {}); },
           {{4, 16, 7, 7}, {32, 16, 1, 1}}, DType::bf16, false, true, kLibTol);
  check_op("conv2d bf16 channels-last",
           [s2](const std::vector<Tensor>& v) { return conv2d(to_channels_last(v[0]), to_channels_last(v[1]), Tensor(), s2); },
           {{2, 8, 9, 9}, {16, 8, 3, 3}}, DType::bf16, false, true, kLibTol);
}

// The chain's ops in bf16 (conv2d_stats forward and backward with its output-gradient fold; the
// residual join's gradient added into the shortcut's): channels-last, so the device runs the fused
// graphs, against the CPU's composition.
TEST_F(Bf16Parity, ConvolutionsCarryingBatchNormAndTheResidualJoin) {
  const Conv2dOptions o{.padding = {1, 1}};
  check_op("conv2d_stats chain bf16",
           [o](const std::vector<Tensor>& v) {
             const Tensor scale = full({4}, 0.75, {DType::f32, v[0].device()});
             const Tensor bias = full({4}, 0.125, {DType::f32, v[0].device()});
             const ConvStats s1 = conv2d_stats(to_channels_last(v[0]), Tensor(), Tensor(), to_channels_last(v[1]), o);
             const ConvStats s2 = conv2d_stats(s1.y, scale, bias, to_channels_last(v[2]), o);
             return s2.y + (sum(s2.sum) + sum(s2.sumsq) * 0.01 + sum(s1.sum)).to(DType::bf16);
           },
           {{2, 3, 6, 6}, {4, 3, 3, 3}, {5, 4, 3, 3}}, DType::bf16, false, true, 2e-2);
  // x is the shortcut too: its gradient is the convolution's data gradient added into the shortcut's.
  check_op("residual join bf16",
           [](const std::vector<Tensor>& v) {
             const Tensor x = to_channels_last(v[0]);
             return relu(conv2d(x, to_channels_last(v[1]), Tensor(), {}) + x);
           },
           {{2, 8, 5, 5}, {8, 8, 1, 1}}, DType::bf16, false, true, kLibTol);
}

TEST_F(Bf16Parity, MaxAndAvgPooling) {
  const Pool2dOptions o{.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}};
  check_op("max_pool2d", [o](const std::vector<Tensor>& v) { return max_pool2d(v[0], o); }, {{2, 3, 15, 17}},
           DType::bf16, false, true, 0);
  check_op("avg_pool2d", [o](const std::vector<Tensor>& v) { return avg_pool2d(v[0], o); }, {{2, 3, 15, 17}},
           DType::bf16, false, true);
}

// bf16 activations, f32 parameters and statistics, plain and fused with (add +) ReLU, in both
// layouts; a large offset, so only f32 sums keep the variance right.
TEST_F(Bf16Parity, BatchNormTrainEvalAndFusedActivations) {
  for (bool channels_last : {false, true}) {
    const std::string tag = channels_last ? " channels-last" : " NCHW";
    for (bool training : {true, false}) {
      const Tensor x = (rnd({4, 16, 5, 7}, DType::f32, 61) * 3.0 + 100.0).to(DType::bf16);
      const Tensor r = rnd({4, 16, 5, 7}, DType::bf16, 67);
      const Tensor gy = rnd({4, 16, 5, 7}, DType::bf16, 66);
      struct Out {
        Tensor y, ya, gx, gw, gr, rm, rv;
      };
      auto run = [&](Device d) {
        Out o;
        auto leaf = [&](const Tensor& t) {
          Tensor l = d == Device::cpu() ? t.clone() : to_target(t);
          if (channels_last && t.dim() == 4) l = to_channels_last(l).detach();
          return l.set_requires_grad(true);
        };
        const Tensor xl = leaf(x), rl = leaf(r), w = leaf(rnd({16}, DType::f32, 62)), b = leaf(rnd({16}, DType::f32, 63));
        o.rm = leaf(rnd({16}, DType::f32, 64)).detach(), o.rv = leaf(rnd({16}, DType::f32, 65, 0.5, 2.0)).detach();
        o.y = batch_norm(xl, w, b, o.rm, o.rv, training);
        o.ya = batch_norm_add_relu(xl, rl, w, b, o.rm, o.rv, training);
        (sum(o.y.to(DType::f32) * gy.to(d).to(DType::f32)) + sum(o.ya.to(DType::f32))).backward();
        o.gx = xl.grad(), o.gw = w.grad(), o.gr = rl.grad();
        return o;
      };
      const Out c = run(Device::cpu()), g = run(kGpu);
      const std::string what = std::string(training ? "train" : "eval") + tag;
      ASSERT_EQ(g.y.dtype(), DType::bf16);
      EXPECT_TRUE(close(c.y, g.y, 1e-2, what + " batch_norm"));
      EXPECT_TRUE(close(c.ya, g.ya, 1e-2, what + " batch_norm_add_relu"));
      EXPECT_TRUE(close(c.gx, g.gx, 3e-2, what + " grad x"));
      EXPECT_TRUE(close(c.gr, g.gr, 1e-2, what + " grad residual"));
      EXPECT_TRUE(close(c.gw, g.gw, 1e-2, what + " grad weight (f32, from bf16 activations)"));
      EXPECT_TRUE(close(c.rm, g.rm, 1e-6, what + " running_mean"));
      EXPECT_TRUE(close(c.rv, g.rv, 1e-5, what + " running_var"));
    }
  }
}

// Pure-bf16 models reach softmax, log-softmax and the losses in bf16: the kernels widen to f32 and
// round once, as the CPU does.
TEST_F(Bf16Parity, SoftmaxAndTheLosses) {
  for (int64_t d : {0, 1, 2}) {
    check_op("softmax", [d](const std::vector<Tensor>& v) { return softmax(v[0] * 3.0, d); }, {{3, 5, 4}}, DType::bf16,
             false, true, 2e-2);
    check_op("log_softmax", [d](const std::vector<Tensor>& v) { return log_softmax(v[0] * 3.0, d); }, {{3, 5, 4}},
             DType::bf16, false, true, 2e-2);
    if (HasFatalFailure()) return;
  }
  const Tensor t = from_vector({1, 2, 0, 4, 4, 3}, {6}, {.dtype = DType::i64}), tg = to_target(t);
  auto target = [&](const Tensor& like) { return like.device() == Device::cpu() ? t : tg; };
  check_op("nll_loss", [&](const std::vector<Tensor>& v) { return nll_loss(log_softmax(v[0], 1), target(v[0])); },
           {{6, 5}}, DType::bf16, false, true);
  check_op("cross_entropy (smoothing 0.1)",
           [&](const std::vector<Tensor>& v) { return cross_entropy(v[0] * 4.0, target(v[0]), Reduction::None, 0.1); },
           {{6, 5}}, DType::bf16, false, true);
  check_op("bce_with_logits",
           [](const std::vector<Tensor>& v) {
             return binary_cross_entropy_with_logits(v[0] * 3.0, gt(v[1], v[1] * 0.0).to(DType::bf16), Reduction::None);
           },
           {{6, 3}, {6, 3}}, DType::bf16, false, true);
}

TEST_F(Bf16Parity, UnscaleGradsAndTheNonFiniteFlag) {
  std::vector<Tensor> c{rnd({33, 7}, DType::bf16, 34) * 512.0, (rnd({5, 4}, DType::bf16, 35) * 64.0).t()};
  std::vector<Tensor> g{to_target(c[0]), to_target(c[1].t()).t()};
  Tensor fc = zeros({1}), fg = zeros({1}, {DType::f32, kGpu});
  backend(Device::cpu()).unscale_grads(c, 1.0 / 1024.0, fc);
  backend(kGpu).unscale_grads(g, 1.0 / 1024.0, fg);
  EXPECT_TRUE(close(c[0], g[0], 0, "unscaled bf16 gradient"));
  EXPECT_TRUE(close(c[1], g[1], 0, "unscaled strided bf16 gradient"));
  EXPECT_EQ(fg.item(), 0.0);
  // The scale on the device (a replayed step's path): the same values.
  std::vector<Tensor> d{to_target(c[0])};
  backend(kGpu).unscale_grads_device(d, full({1}, 0.5, {DType::f32, kGpu}), fg);
  backend(Device::cpu()).unscale_grads(c, 2.0, fc);
  EXPECT_TRUE(close(c[0], d[0], 0, "bf16 gradient unscaled by a device scale"));
  for (double bad : {INFINITY, NAN}) {
    std::vector<Tensor> b{to_target(rnd({33, 7}, DType::bf16, 36))};
    b[0].select(0, 20).select(0, 3).fill_(bad);
    Tensor flag = zeros({1}, {DType::f32, kGpu});
    backend(kGpu).unscale_grads(b, 0.5, flag);
    EXPECT_EQ(flag.item(), 1.0);
  }
}

TEST_F(Bf16Parity, FusedOptimizerStepsDeclineBf16) {
  // The fused steps take f32 master weights, as on the CPU: a bf16 group takes the per-tensor path.
  const Tensor p = ones({4}, {DType::bf16, kGpu});
  Backend& be = backend(kGpu);
  EXPECT_FALSE(be.fused_sgd_step({p}, {p}, {p}, {1}, SgdHyper{0.1, 0.0, 0.9, 0.0, false, false}));
  EXPECT_FALSE(be.fused_adam_step({p}, {p}, {p}, {p}, {}, {1}, AdamHyper{0.1, 0.0, 0.9, 0.999, 1e-8, false, false, false}));
  EXPECT_EQ(p.to_vector(), (std::vector<double>{1, 1, 1, 1}));
}

// One SGD step of a small ResNet-18 under bf16 autocast (f32 weights, no gradient scaler), on the
// device (channels-last, as AMP trains there) against the same step on the CPU. At batch 2 the
// last stage's batch norms normalise over a handful of values, so bf16's roundings move the deep
// gradients by tens of percent whichever backend runs them: each gradient and updated weight must
// be at most twice as far from the CPU's bf16 step as the CPU's own f32 step is (two bf16 runs
// with their own roundings sit about sqrt(2) times one run's distance apart), and within 1% where
// that distance is small. A wrong kernel, layout or dtype lands at O(1).
TEST_F(Bf16Parity, AResNetStepUnderBf16AutocastMatchesTheCpu) {
  Generator gc(7), gd(7), gf(7), gx(8);
  auto cpu = nn::resnet18(10, &gc, false, /*small_input=*/true);
  auto dev = nn::resnet18(10, &gd, false, /*small_input=*/true);
  auto f32 = nn::resnet18(10, &gf, false, /*small_input=*/true);
  dev->to(kGpu);
  ASSERT_GT(dev->to_channels_last(), 0);
  const Tensor x = randn({2, 3, 16, 16}, {}, &gx);
  const Tensor labels = from_vector({3, 7}, {2}, {.dtype = DType::i64});
  const auto step = [&](nn::ResNet& m, const Tensor& in, bool autocast) {
    optim::SGD opt(m.parameters(), {.lr = 0.1, .momentum = 0.9});
    Tensor loss;
    {
      AutocastGuard guard(DType::bf16, autocast);
      const Tensor logits = m.forward(in);
      EXPECT_EQ(logits.dtype(), autocast ? DType::bf16 : DType::f32);
      loss = cross_entropy(logits, labels.to(in.device()));
    }
    EXPECT_EQ(loss.dtype(), DType::f32);
    loss.backward();
    std::vector<Tensor> grads;
    for (const auto& [name, p] : m.named_parameters()) grads.push_back(p.grad().detach().clone());
    opt.step();
    return std::make_pair(loss.item(), grads);
  };
  const auto c = step(*cpu, x, true);
  const auto d = step(*dev, to_channels_last(to_target(x)), true);
  const auto r = step(*f32, x, false);
  EXPECT_NEAR(c.first, d.first, 1e-2 * std::abs(c.first));
  const auto names = cpu->named_parameters(), dev_params = dev->named_parameters(), ref = f32->named_parameters();
  for (size_t i = 0; i < names.size(); ++i) {
    ASSERT_EQ(dev_params[i].second.dtype(), DType::f32) << names[i].first << ": the master weights stay f32";
    const double noise_g = testing::normalised_err(c.second[i], r.second[i]);
    const double noise_w = testing::normalised_err(names[i].second.detach(), ref[i].second.detach());
    EXPECT_TRUE(close(c.second[i], d.second[i], std::max(2.0 * noise_g, 1e-2), "grad of " + names[i].first));
    EXPECT_TRUE(close(names[i].second.detach(), dev_params[i].second.detach(), std::max(2.0 * noise_w, 1e-2),
                      names[i].first + " after the step"));
  }
}

// Pure bf16 (nn::to_pure_bf16): bf16 weights, gradients, momentum and update on the device, no
// scaler, against the same three steps on the CPU.
TEST_F(Bf16Parity, APureBf16StepMatchesTheCpu) {
  auto cpu = testing::make_small_bn_cnn(11), dev = testing::make_small_bn_cnn(11);
  nn::to_pure_bf16(*cpu);
  nn::to_pure_bf16(*dev);
  dev->to(kGpu);
  Generator g(12);
  const Tensor x = randn({8, 3, 8, 8}, {}, &g).to(DType::bf16);
  const Tensor y = from_vector({0, 1, 0, 1, 1, 0, 1, 0}, {8}, {.dtype = DType::i64});
  auto train = [&](nn::Sequential& m, const Tensor& in, const Tensor& labels) {
    optim::SGD sgd(m.parameters(), {.lr = 0.05, .momentum = 0.9});
    for (int i = 0; i < 3; ++i) {
      cross_entropy(m(in).to(DType::f32), labels).backward();
      sgd.step();
      sgd.zero_grad();
    }
  };
  train(*cpu, x, y);
  train(*dev, to_target(x), to_target(y));
  const auto c = cpu->named_parameters(), d = dev->named_parameters();
  for (size_t i = 0; i < c.size(); ++i) {
    EXPECT_EQ(d[i].second.dtype(), c[i].second.dtype()) << c[i].first;
    EXPECT_TRUE(close(c[i].second.detach(), d[i].second.detach(), 1e-2, c[i].first + " after three steps"));
  }
}

}  // namespace
}  // namespace minidl
