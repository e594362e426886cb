// Batch norm carried by the convolutions (core/conv_bn.h, ResNetOptions::conv_bn_chain) against
// the composed reference, conv2d -> batch_norm -> relu -> ... -> add -> relu: values, every
// gradient and the running statistics, in f64 (to rounding), f32 channels-last and f16 autocast;
// whole ResNet-18 and ResNet-50 (small input) training steps and their evaluation; recomputation
// updating the running statistics once; what the backward keeps and its peak; the errors.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/conv_bn.h"
#include "core/generator.h"
#include "core/ops.h"
#include "nn/checkpoint.h"
#include "nn/resnet.h"
#include "optim/sgd.h"
#include "tests/nn/small_net.h"

namespace minidl::nn {
namespace {

// max |a - b| / max |b|: 0 for equal tensors.
double rel_diff(const Tensor& a, const Tensor& b) {
  const Tensor af = a.to(DType::f64), bf = b.to(DType::f64);
  return max(abs(af - bf)).item() / std::max(max(abs(bf)).item(), 1e-30);
}

Tensor leaf(const Shape& s, DType dt, Generator& g, double scale = 1.0, double shift = 0.0) {
  return (randn(s, {.dtype = DType::f64}, &g) * scale + shift).to(dt).set_requires_grad(true);
}

// Two convolutions and their batch norms, then the add and ReLU: x [4, 6, 7, 7] -> [4, 8, 4, 4]
// (a stride-2 3x3 then a 1x1); the residual is an input of the output's shape.
struct Chain {
  Tensor x, w1, w2, g1, b1, g2, b2, residual, rm1, rv1, rm2, rv2;
  Chain(DType dt, bool channels_last, uint64_t seed) {
    Generator g(seed);
    const DType pd = dt == DType::f16 ? DType::f32 : dt;
    x = leaf({4, 6, 7, 7}, dt, g, 1.0, 0.5);   // a non-zero mean, as a ReLU's output has
    w1 = leaf({8, 6, 3, 3}, dt, g, 0.2);
    w2 = leaf({8, 8, 1, 1}, dt, g, 0.3);
    g1 = leaf({8}, pd, g, 0.2, 1.0), b1 = leaf({8}, pd, g, 0.2);
    g2 = leaf({8}, pd, g, 0.2, 1.0), b2 = leaf({8}, pd, g, 0.2);
    residual = leaf({4, 8, 4, 4}, dt, g);
    rm1 = zeros({8}, {.dtype = pd}), rv1 = ones({8}, {.dtype = pd});
    rm2 = zeros({8}, {.dtype = pd}), rv2 = ones({8}, {.dtype = pd});
    if (channels_last) {
      x = to_channels_last(x.detach()).set_requires_grad(true);
      residual = to_channels_last(residual.detach()).set_requires_grad(true);
    }
  }
  std::vector<Tensor> leaves() const { return {x, w1, w2, g1, b1, g2, b2, residual}; }
};

const Conv2dOptions kStride2{.stride = {2, 2}, .padding = {1, 1}};

Tensor run_chain(Chain& c) {
  const ConvStats s1 = conv2d_stats(c.x, Tensor(), Tensor(), c.w1, kStride2);
  const BnAffine a1 = bn_finalize(s1, c.g1, c.b1, c.rm1, c.rv1, 0.1, 1e-5);
  const ConvStats s2 = conv2d_stats(s1.y, a1.scale, a1.bias, c.w2);
  const BnAffine a2 = bn_finalize(s2, c.g2, c.b2, c.rm2, c.rv2, 0.1, 1e-5);
  return scale_bias_relu(s2.y, a2.scale, a2.bias, c.residual);
}

Tensor run_reference(Chain& c) {
  Tensor h = conv2d(c.x, c.w1, Tensor(), kStride2);
  h = relu(batch_norm(h, c.g1, c.b1, c.rm1, c.rv1, true, 0.1, 1e-5));
  h = batch_norm(conv2d(h, c.w2), c.g2, c.b2, c.rm2, c.rv2, true, 0.1, 1e-5);
  return relu(h + c.residual);
}

// Runs both on the same inputs and an uneven output gradient; compares the output, every leaf's
// gradient and the running statistics within `tol` (relative to each tensor's largest value).
void expect_chain_matches(DType dt, bool channels_last, double tol) {
  Chain a(dt, channels_last, 7), b(dt, channels_last, 7);
  const Tensor ya = run_chain(a), yb = run_reference(b);
  EXPECT_EQ(ya.dtype(), dt);
  EXPECT_EQ(is_channels_last(ya), channels_last);
  EXPECT_LT(rel_diff(ya, yb), tol) << "output";
  Generator g(3);
  const Tensor w = randn(ya.shape(), {.dtype = DType::f64}, &g).to(ya.dtype() == DType::f16 ? DType::f32 : dt);
  sum(ya.to(w.dtype()) * w).backward();
  sum(yb.to(w.dtype()) * w).backward();
  const char* names[] = {"x", "w1", "w2", "gamma1", "beta1", "gamma2", "beta2", "residual"};
  const auto la = a.leaves(), lb = b.leaves();
  for (size_t i = 0; i < la.size(); ++i) {
    ASSERT_TRUE(la[i].grad().defined()) << names[i];
    EXPECT_LT(rel_diff(la[i].grad(), lb[i].grad()), tol) << "gradient of " << names[i];
  }
  EXPECT_LT(rel_diff(a.rm1, b.rm1), tol) << "running_mean 1";
  EXPECT_LT(rel_diff(a.rv1, b.rv1), tol) << "running_var 1";
  EXPECT_LT(rel_diff(a.rm2, b.rm2), tol) << "running_mean 2";
  EXPECT_LT(rel_diff(a.rv2, b.rv2), tol) << "running_var 2";
}

TEST(ConvBnChain, OpsEqualConvBatchNormReluInF64) { expect_chain_matches(DType::f64, false, 1e-9); }
TEST(ConvBnChain, OpsEqualConvBatchNormReluInF32ChannelsLast) { expect_chain_matches(DType::f32, true, 2e-4); }

TEST(ConvBnChain, TheStatisticsAreTheOutputsSumsAndTheBackwardKeepsNoActivation) {
  Chain c(DType::f64, false, 11);
  const ConvStats s1 = conv2d_stats(c.x, Tensor(), Tensor(), c.w1, kStride2);
  EXPECT_EQ(s1.count, 4 * 4 * 4);
  EXPECT_LT(rel_diff(s1.sum, sum(s1.y.detach(), {0, 2, 3})), 1e-12);
  EXPECT_LT(rel_diff(s1.sumsq, sum(square(s1.y.detach()), {0, 2, 3})), 1e-12);
  ASSERT_TRUE(s1.y.grad_fn());
  EXPECT_EQ(s1.y.grad_fn()->name(), "conv2d_stats");
  EXPECT_EQ(s1.sum.grad_fn(), s1.y.grad_fn());   // one node, three outputs
  // The second convolution reads the first's raw output itself: no ReLU or affine node sits
  // between them, so the activation relu(y1 * scale + bias) is never an autograd value to keep.
  const BnAffine a1 = bn_finalize(s1, c.g1, c.b1, Tensor(), Tensor());
  const ConvStats s2 = conv2d_stats(s1.y, a1.scale, a1.bias, c.w2);
  ASSERT_EQ(s2.y.grad_fn()->next_edges.size(), 4u);   // x, in_scale, in_bias, w
  EXPECT_EQ(s2.y.grad_fn()->next_edges[0].fn, s1.y.grad_fn());
}

TEST(ConvBnChain, AutocastRunsInF16WithF32Statistics) {
  Chain a(DType::f32, true, 5), b(DType::f32, true, 5), r(DType::f32, true, 5);
  Tensor ya, yb;
  {
    AutocastGuard guard(DType::f16, true);
    ya = run_chain(a);
    yb = run_reference(b);
  }
  const Tensor yr = run_chain(r);   // f32
  EXPECT_EQ(ya.dtype(), DType::f16);
  EXPECT_EQ(a.rm1.dtype(), DType::f32);
  // f16 rounding either way; the chain must be as close to f32 as the composed ops are.
  EXPECT_LT(rel_diff(ya, yr), 2e-2);
  EXPECT_LE(rel_diff(ya, yr), 1.5 * rel_diff(yb, yr) + 1e-3);
  EXPECT_LT(rel_diff(a.rv2, r.rv2), 1e-2);
}

// One ResNet training step (forward, backward, SGD) with the chain on or off, in `dt`: the loss,
// every parameter after the update, every buffer, then the evaluation-mode logits.
struct StepResult {
  std::vector<Tensor> values;   // loss, parameters..., buffers..., evaluation logits
  std::vector<std::string> names;
};

StepResult resnet_step(bool deep, bool chain, DType dt) {
  Generator init(4);
  auto model = deep ? resnet50(10, &init, false, true) : resnet18(10, &init, false, true);
  model->to(dt);
  model->set_conv_bn_chain(chain);
  EXPECT_EQ(model->options().conv_bn_chain, chain);
  Generator data(21);
  const Tensor x = randn({4, 3, 8, 8}, {}, &data).to(dt);
  const Tensor target = randn({4, 10}, {}, &data).to(dt);
  optim::SGD opt(model->parameters(), {.lr = 0.01, .momentum = 0.9});
  const Tensor loss = mean(square((*model)(x) - target));
  loss.backward();
  opt.step();
  StepResult r{{loss.detach()}, {"loss"}};
  for (const auto& [name, p] : model->named_parameters()) r.values.push_back(p.detach()), r.names.push_back(name);
  for (const auto& [name, b] : model->named_buffers()) r.values.push_back(b.detach()), r.names.push_back(name);
  model->eval();
  r.values.push_back((*model)(x).detach());
  r.names.push_back("evaluation logits");
  return r;
}

// In f64 the chain equals the composed batch norms to rounding: the derivative is the same. In f32
// it must be as close to the f64 step as the composed path is (its variance, E[y^2] - E[y]^2, is
// the only other rounding), and finite everywhere.
void expect_same_resnet_step(bool deep) {
  const StepResult c64 = resnet_step(deep, true, DType::f64), r64 = resnet_step(deep, false, DType::f64);
  const StepResult c32 = resnet_step(deep, true, DType::f32), r32 = resnet_step(deep, false, DType::f32);
  ASSERT_EQ(c64.values.size(), r64.values.size());
  double worst_chain = 0, worst_ref = 0;
  for (size_t i = 0; i < c64.values.size(); ++i) {
    EXPECT_LT(rel_diff(c64.values[i], r64.values[i]), 1e-9) << c64.names[i];
    ASSERT_TRUE(std::isfinite(sum(c32.values[i].to(DType::f64)).item())) << c32.names[i];
    worst_chain = std::max(worst_chain, rel_diff(c32.values[i], r64.values[i]));
    worst_ref = std::max(worst_ref, rel_diff(r32.values[i], r64.values[i]));
  }
  EXPECT_LT(worst_chain, 2.0 * worst_ref + 1e-5) << "f32 chain vs f64, worst tensor, against the composed path's "
                                                << worst_ref;
}

TEST(ConvBnChain, ResNet18StepMatchesTheComposedBatchNorms) { expect_same_resnet_step(false); }
TEST(ConvBnChain, ResNet50StepMatchesTheComposedBatchNorms) { expect_same_resnet_step(true); }

TEST(ConvBnChain, RecomputationUpdatesTheRunningStatisticsOnce) {
  auto plain = testing::short_resnet(BlockKind::Bottleneck, 8);
  auto rerun = testing::short_resnet(BlockKind::Bottleneck, 8);
  plain->set_conv_bn_chain(true);
  rerun->set_conv_bn_chain(true);
  Generator data(2);
  const Tensor x = randn({2, 3, 8, 8}, {}, &data);
  sum((*plain)(x)).backward();
  // The first stage through checkpoint: its forward runs again inside the backward.
  Tensor h = checkpoint([&](const Tensor& in) { return (*rerun->stage(1))(in); }, rerun->stem().run(x));
  for (int i = 2; i <= 4; ++i) h = (*rerun->stage(i))(h);
  sum(rerun->head().run(h)).backward();
  const auto bp = plain->named_buffers(), br = rerun->named_buffers();
  for (size_t i = 0; i < bp.size(); ++i) EXPECT_EQ(bp[i].second.to_vector(), br[i].second.to_vector()) << bp[i].first;
  const auto pp = plain->named_parameters(), pr = rerun->named_parameters();
  for (size_t i = 0; i < pp.size(); ++i) {
    EXPECT_LT(rel_diff(pp[i].second.grad(), pr[i].second.grad()), 1e-5) << pp[i].first;
  }
}

TEST(ConvBnChain, ErrorsNameTheOpAndTheFix) {
  Chain c(DType::f32, false, 1);
  const Tensor scale = ones({6});
  try {
    conv2d_stats(c.x, scale, Tensor(), c.w1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("pass both"), std::string::npos) << e.what();
  }
  try {
    conv2d_stats(c.x, ones({5}), zeros({5}), c.w1);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in_scale has shape [5]"), std::string::npos) << e.what();
  }
  const ConvStats one{zeros({1, 8, 1, 1}), zeros({8}), zeros({8}), 1};
  try {
    bn_finalize(one, Tensor(), Tensor(), Tensor(), Tensor());
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("batch larger than 1"), std::string::npos) << e.what();
  }
}

// The composed backward (the CPU's) of a convolution that reads its input through an affine and a
// ReLU: with the input much larger than the rest, its peak is counted in input-sized buffers. The
// convolution's data gradient, the pre-activation, its mask (a byte a value, then f32) and the
// gradient through them are made one after another and each goes once read: about 3.25 at the
// most, with or without the input's own gradient (4.25 when each lived to the end).
TEST(ConvBnChain, TheComposedBackwardHoldsAtMostThreeInputSizedTemporaries) {
  for (const bool need_x : {false, true}) {
    Generator g(5);
    Tensor x = leaf({2, 64, 16, 16}, DType::f32, g, 1.0, 0.5);
    x.set_requires_grad(need_x);
    const Tensor w = leaf({1, 64, 1, 1}, DType::f32, g, 0.2);
    const Tensor scale = leaf({64}, DType::f32, g, 0.2, 1.0), bias = leaf({64}, DType::f32, g, 0.2);
    const Tensor loss = sum(conv2d_stats(x, scale, bias, w).y);
    const int64_t before = memory_stats().allocated_bytes;
    reset_peak_stats();
    loss.backward();
    const double peak =
        static_cast<double>(memory_stats().peak_allocated_bytes - before) / static_cast<double>(x.nbytes());
    EXPECT_LT(peak, 3.5) << "input-sized buffers at the backward's peak, need_x " << need_x;
    EXPECT_EQ(x.grad().defined(), need_x);
    EXPECT_TRUE(scale.grad().defined() && bias.grad().defined() && w.grad().defined());
  }
}

}  // namespace
}  // namespace minidl::nn
