// ResNet with the fused batch norm + ReLU and batch norm + add + ReLU (ResNetOptions::fused_bn_relu,
// on by default): the same training step as the module-by-module path, bit for bit on the CPU
// (BasicBlock and Bottleneck), the fused nodes actually in the graph (and f16 under autocast),
// the switch, and the composed fallback of a synchronised batch norm. Recomputation with the
// fused path is pinned by checkpoint_test.cpp and recompute_test.cpp, which run the default.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/generator.h"
#include "core/ops.h"
#include "nn/resnet.h"
#include "tests/nn/small_net.h"

namespace minidl::nn {
namespace {

std::string node_of(const Tensor& t) { return t.grad_fn() ? t.grad_fn()->name() : "(leaf)"; }

// One training step's logits; gradients and buffers stay in the model.
Tensor step(ResNet& model, uint64_t seed) {
  Generator data(seed);
  const Tensor x = randn({2, 3, 8, 8}, {}, &data);
  const Tensor w = randn({2, 10}, {}, &data);
  model.zero_grad();
  Tensor out = model(x);
  sum(out * w).backward();
  return out.detach();
}

using testing::short_resnet;

void expect_same_step(BlockKind kind) {
  const std::string arch = kind == BlockKind::Basic ? "BasicBlock" : "Bottleneck";
  auto fused = short_resnet(kind, 5);
  auto composed = short_resnet(kind, 5);
  ASSERT_TRUE(fused->options().fused_bn_relu);
  composed->set_fused_bn_relu(false);
  EXPECT_EQ(step(*fused, 9).to_vector(), step(*composed, 9).to_vector()) << arch << " logits";
  const auto pf = fused->named_parameters(), pc = composed->named_parameters();
  ASSERT_EQ(pf.size(), pc.size());
  for (size_t i = 0; i < pf.size(); ++i) {
    EXPECT_EQ(pf[i].second.grad().to_vector(), pc[i].second.grad().to_vector()) << arch << " " << pf[i].first;
  }
  const auto bf = fused->named_buffers(), bc = composed->named_buffers();
  for (size_t i = 0; i < bf.size(); ++i) {
    EXPECT_EQ(bf[i].second.to_vector(), bc[i].second.to_vector()) << arch << " " << bf[i].first;
  }
}

TEST(ResNetFused, BasicBlockStepIsBitIdenticalToTheComposedOps) { expect_same_step(BlockKind::Basic); }
TEST(ResNetFused, BottleneckStepIsBitIdenticalToTheComposedOps) { expect_same_step(BlockKind::Bottleneck); }

TEST(ResNetFused, TheFusedNodesAreInTheGraphAndTheSwitchTurnsThemOff) {
  auto model = short_resnet(BlockKind::Basic, 3);
  const Tensor x = randn({2, 3, 8, 8});
  const Tensor block_in = model->stem().run(x);
  EXPECT_EQ(node_of(block_in), "batch_norm_relu");
  Module& block = *model->stage(2)->child("0");   // stride 2: the identity is the downsample branch
  EXPECT_EQ(node_of(block(block_in)), "batch_norm_add_relu");
  model->set_fused_bn_relu(false);
  EXPECT_EQ(node_of(model->stem().run(x)), "relu");
  EXPECT_EQ(node_of(block(block_in)), "relu");
  model->set_fused_bn_relu(true);
  EXPECT_EQ(node_of(block(block_in)), "batch_norm_add_relu");
}

double normalised_error(const Tensor& a, const Tensor& ref) {
  return std::sqrt(sum(square(a - ref)).item() / sum(square(ref)).item());
}

TEST(ResNetFused, AutocastRunsTheFusedOpsInF16AsAccuratelyAsTheComposedOnes) {
  Generator data(12);
  auto fused = short_resnet(BlockKind::Basic, 11);
  auto composed = short_resnet(BlockKind::Basic, 11);
  auto reference = short_resnet(BlockKind::Basic, 11);   // f32, no autocast
  composed->set_fused_bn_relu(false);
  const Tensor x = randn({2, 3, 12, 12}, {}, &data);
  const Tensor w = randn({2, 64, 12, 12}, {}, &data);
  // The stem and the first stage (the whole net at this size leaves 2 values per channel to the
  // last batch norms, whose f16 statistics then amplify any rounding).
  auto run = [&](ResNet& m, bool autocast) {
    AutocastGuard guard(DType::f16, autocast);
    const Tensor h = (*m.stage(1))(m.stem().run(x));
    EXPECT_EQ(h.dtype(), autocast ? DType::f16 : DType::f32);
    EXPECT_EQ(node_of(h), m.options().fused_bn_relu ? "batch_norm_add_relu" : "relu");
    sum(h.to(DType::f32) * w).backward();
    return h.to(DType::f32);
  };
  const Tensor hf = run(*fused, true), hc = run(*composed, true), hr = run(*reference, false);
  auto conv1_grad = [](ResNet& m) { return m.named_parameters().front().second.grad(); };
  // f16 costs a few percent on conv1's gradient either way (training-mode batch norm's backward
  // cancels); the fused ops, which round less, must not cost more.
  EXPECT_LT(max(abs(hf - hc)).item(), 4e-3 * max(abs(hr)).item());
  EXPECT_LE(normalised_error(hf, hr), 1.25 * normalised_error(hc, hr));
  EXPECT_LE(normalised_error(conv1_grad(*fused), conv1_grad(*reference)),
            1.25 * normalised_error(conv1_grad(*composed), conv1_grad(*reference)));
}

TEST(ResNetFused, SynchronisedBatchNormTakesTheComposedPath) {
  BatchNorm2d bn(3);
  const Tensor x = randn({2, 3, 4, 4}), r = randn({2, 3, 4, 4});
  const Tensor fused = bn.forward_relu(x, r);
  EXPECT_EQ(node_of(fused), "batch_norm_add_relu");
  bn.set_stats_reducer([](const Tensor& t) { return t; });   // one process: the identity sum
  const Tensor sync = bn.forward_relu(x, r);
  EXPECT_EQ(node_of(sync), "relu");
  EXPECT_TRUE(allclose(sync, fused, 1e-5, 1e-6));
  EXPECT_EQ(bn.num_batches_tracked().item<int64_t>(), 2);
}

}  // namespace
}  // namespace minidl::nn
