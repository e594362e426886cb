// A channels-last ResNet on the CPU reference (Module::to_channels_last + a channels-last input):
// the same training step as NCHW bit for bit (f32 and under f16 autocast, fused and composed batch
// norm, BasicBlock and Bottleneck), every stage's output and every gradient still channels-last,
// optimizers whose state takes the weights' format, and recomputation that keeps the gradients.
// The GPU's side (cuDNN on NHWC descriptors, no transposes) is channels_last_cuda_test.cpp.
#include <gtest/gtest.h>

#include <memory>
#include <string>
#include <vector>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/generator.h"
#include "core/ops.h"
#include "nn/recompute.h"
#include "nn/resnet.h"
#include "tests/nn/small_net.h"
#include "optim/adam.h"
#include "optim/sgd.h"

namespace minidl::nn {
namespace {

using testing::short_resnet;

// 16 px keeps layer4's activations 2x2 (channels-last and NCHW differ); 8 px is cheaper.
Tensor input(bool cl, uint64_t seed = 3, int64_t size = 8) {
  Generator g(seed);
  const Tensor x = randn({2, 3, size, size}, {}, &g);
  return cl ? to_channels_last(x) : x;
}

struct Step {
  std::vector<double> loss;
  std::vector<std::vector<double>> grads, params, buffers;
};

// Two SGD-with-momentum steps (the second uses the momentum buffers the first made).
Step train(ResNet& m, bool cl, bool amp, optim::Optimizer& opt) {
  Step s;
  const Tensor y = from_vector({3, 7}, {2}, {.dtype = DType::i64});
  for (int i = 0; i < 2; ++i) {
    opt.zero_grad();
    Tensor loss;
    {
      AutocastGuard ag(DType::f16, amp);
      loss = cross_entropy(m(input(cl, 3 + i)).to(DType::f32), y);
    }
    loss.backward();
    s.loss.push_back(loss.item());
    if (i == 0)
      for (const auto& [n, p] : m.named_parameters()) s.grads.push_back(p.grad().to_vector());
    opt.step();
  }
  for (const auto& [n, p] : m.named_parameters()) s.params.push_back(p.to_vector());
  for (const auto& [n, b] : m.named_buffers()) s.buffers.push_back(b.to_vector());
  return s;
}

void expect_same_training(BlockKind kind, bool fused, bool amp) {
  const std::string tag = std::string(kind == BlockKind::Basic ? "BasicBlock" : "Bottleneck") +
                          (fused ? " fused" : " composed") + (amp ? " autocast f16" : " f32");
  auto a = short_resnet(kind, 5), b = short_resnet(kind, 5);
  a->set_fused_bn_relu(fused);
  b->set_fused_bn_relu(fused);
  EXPECT_GT(b->to_channels_last(), 0) << tag;
  optim::SGD oa(a->parameters(), {.lr = 0.05, .momentum = 0.9}), ob(b->parameters(), {.lr = 0.05, .momentum = 0.9});
  const Step sa = train(*a, false, amp, oa), sb = train(*b, true, amp, ob);
  EXPECT_EQ(sa.loss, sb.loss) << tag;
  EXPECT_EQ(sa.grads, sb.grads) << tag;
  EXPECT_EQ(sa.params, sb.params) << tag;
  EXPECT_EQ(sa.buffers, sb.buffers) << tag;
  for (const auto& [n, p] : b->named_parameters()) {
    if (p.dim() != 4 || p.size(2) * p.size(3) == 1) continue;
    EXPECT_TRUE(prefers_channels_last(p)) << tag << " " << n << " " << shape_str(p.strides());
    EXPECT_TRUE(p.grad().strides() == p.strides()) << tag << " grad of " << n;
  }
}

TEST(ChannelsLastResNet, TrainingEqualsNchwBitForBit) {
  for (BlockKind kind : {BlockKind::Basic, BlockKind::Bottleneck})
    for (bool fused : {true, false}) expect_same_training(kind, fused, false);
}

TEST(ChannelsLastResNet, AutocastTrainingEqualsNchwBitForBit) {
  expect_same_training(BlockKind::Basic, true, true);
  expect_same_training(BlockKind::Bottleneck, false, true);
}

// Every link of the chain (stem, each block, head) hands on a channels-last activation, fused and
// composed, and the input's gradient comes back channels-last: no op in between fell back to NCHW.
TEST(ChannelsLastResNet, EveryStageKeepsTheFormat) {
  for (BlockKind kind : {BlockKind::Basic, BlockKind::Bottleneck}) {
    for (bool fused : {true, false}) {
      auto m = short_resnet(kind, 6);
      m->set_fused_bn_relu(fused);
      m->to_channels_last();
      Tensor x = input(true, 3, 16).detach();
      x.set_requires_grad(true);
      Tensor h = x;
      for (const ChainLink& link : m->chain()) {
        h = link.run(h);
        if (h.dim() == 4 && h.size(2) * h.size(3) > 1) {
          EXPECT_TRUE(prefers_channels_last(h)) << link.name << (fused ? " fused" : " composed") << ": "
                                                << shape_str(h.strides());
        }
      }
      sum(h * h).backward();
      EXPECT_TRUE(prefers_channels_last(x.grad())) << shape_str(x.grad().strides());
    }
  }
}

TEST(ChannelsLastResNet, ToChannelsLastConvertsWeightsInPlace) {
  auto m = short_resnet(BlockKind::Basic, 7);
  const Tensor w = m->named_parameters().front().second;   // conv1.weight, [64, 3, 3, 3]
  const std::vector<double> before = w.to_vector();
  const auto state_before = m->state_dict();
  int64_t to_convert = 0;   // 4-d weights not already channels-last (1x1 filters are both formats)
  for (const auto& [name, p] : m->named_parameters()) to_convert += p.dim() == 4 && !is_channels_last(p) ? 1 : 0;
  EXPECT_GT(to_convert, 0);
  EXPECT_EQ(m->to_channels_last(), to_convert);
  EXPECT_TRUE(prefers_channels_last(w)) << "the same handle sees the new memory";
  EXPECT_TRUE(w.requires_grad() && w.is_leaf());
  EXPECT_EQ(w.to_vector(), before);
  EXPECT_EQ(m->to_channels_last(), 0) << "a second call changes nothing";
  m->to(DType::f64);
  EXPECT_TRUE(prefers_channels_last(w)) << "dtype moves keep the format";
  for (const auto& [name, t] : m->state_dict()) {
    EXPECT_EQ(t.to(DType::f64).to_vector(), state_before.at(name).to(DType::f64).to_vector()) << name;
  }
}

TEST(ChannelsLastResNet, AdamStateTakesTheWeightsFormat) {
  auto a = short_resnet(BlockKind::Basic, 8), b = short_resnet(BlockKind::Basic, 8);
  b->to_channels_last();
  optim::Adam oa(a->parameters(), {.lr = 1e-3}), ob(b->parameters(), {.lr = 1e-3});
  const Step sa = train(*a, false, false, oa), sb = train(*b, true, false, ob);
  EXPECT_EQ(sa.params, sb.params);
}

// Recomputation reruns the checkpointed segments in channels-last and gives the plain forward's
// gradients bit for bit (as it does in NCHW).
TEST(ChannelsLastResNet, RecomputationKeepsTheGradients) {
  for (const char* mode : {"stages", "sequential:2"}) {
    auto plain = short_resnet(BlockKind::Basic, 9), ckpt = short_resnet(BlockKind::Basic, 9);
    plain->to_channels_last();
    ckpt->to_channels_last();
    Recomputer rc(*ckpt, RecomputeMode::parse(mode));
    const Tensor lp = sum((*plain)(input(true)));
    const Tensor lc = sum(rc.forward(input(true)));
    lp.backward();
    lc.backward();
    EXPECT_EQ(lp.item(), lc.item()) << mode;
    const auto pp = plain->named_parameters(), pc = ckpt->named_parameters();
    for (size_t i = 0; i < pp.size(); ++i) {
      EXPECT_EQ(pp[i].second.grad().to_vector(), pc[i].second.grad().to_vector()) << mode << " " << pp[i].first;
    }
  }
}

}  // namespace
}  // namespace minidl::nn
