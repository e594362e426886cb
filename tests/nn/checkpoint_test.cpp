// Recomputation must be invisible to training (DESIGN.md "Recomputation"): these tests pin that
// checkpointed runs give bit-identical gradients, batch-norm statistics and generator state to
// plain runs on the CPU, and that checkpointing actually lowers the allocator's peak.
#include <gtest/gtest.h>

#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/generator.h"
#include "core/ops.h"
#include "nn/checkpoint.h"
#include "nn/layers.h"
#include "nn/resnet.h"

namespace minidl::nn {
namespace {

std::shared_ptr<Sequential> small_net(uint64_t seed) {
  Generator gen(seed);
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Conv2d>(3, 8, 3, 1, 1, 1, true, &gen), std::make_shared<ReLU>(),
      std::make_shared<Dropout>(0.3), std::make_shared<Flatten>(), std::make_shared<Linear>(8 * 6 * 6, 5, true, &gen),
      std::make_shared<Dropout>(0.5)});
}

void expect_same_grads(const Module& a, const Module& b) {
  const auto pa = a.named_parameters();
  const auto pb = b.named_parameters();
  ASSERT_EQ(pa.size(), pb.size());
  for (size_t i = 0; i < pa.size(); ++i) {
    ASSERT_TRUE(pa[i].second.grad().defined()) << pa[i].first;
    ASSERT_TRUE(pb[i].second.grad().defined()) << pb[i].first;
    EXPECT_EQ(pa[i].second.grad().to_vector(), pb[i].second.grad().to_vector()) << pa[i].first;
  }
}

void expect_same_buffers(const Module& a, const Module& b) {
  const auto ba = a.named_buffers();
  const auto bb = b.named_buffers();
  ASSERT_EQ(ba.size(), bb.size());
  for (size_t i = 0; i < ba.size(); ++i) {
    EXPECT_EQ(ba[i].second.to_vector(), bb[i].second.to_vector()) << ba[i].first;
  }
}

TEST(CheckpointTest, SmallNetWithDropoutBitIdentical) {
  auto plain = small_net(3);
  auto ckpt = small_net(3);
  Generator data(11);
  const Tensor x0 = randn({4, 3, 6, 6}, {}, &data);
  const Tensor w = randn({4, 5}, {}, &data);

  manual_seed(99);
  Tensor xa = x0.detach().clone().set_requires_grad(true);
  sum((*plain)(xa) * w).backward();
  const uint64_t offset_plain = default_generator().offset();

  manual_seed(99);
  Tensor xb = x0.detach().clone().set_requires_grad(true);
  Tensor out = checkpoint([&](const Tensor& in) { return (*ckpt)(in); }, xb);
  EXPECT_TRUE(out.requires_grad());
  const uint64_t offset_after_forward = default_generator().offset();
  sum(out * w).backward();
  // The rerun replayed the draws and put the generator back: later draws are unaffected.
  EXPECT_EQ(default_generator().offset(), offset_after_forward);
  EXPECT_EQ(default_generator().offset(), offset_plain);

  EXPECT_EQ(xa.grad().to_vector(), xb.grad().to_vector());
  expect_same_grads(*plain, *ckpt);
}

// Dropout after layer2 (inside that link, so inside its checkpoint segment) on ResNet-18.
std::vector<ChainLink> with_dropout(std::vector<ChainLink> links, const std::string& after) {
  bool found = false;
  for (ChainLink& l : links) {
    if (l.name != after) continue;
    auto run = l.run;
    l.run = [run](const Tensor& x) { return dropout(run(x), 0.2, true); };
    found = true;
  }
  EXPECT_TRUE(found) << after;
  return links;
}

struct ResNetRun {
  std::shared_ptr<ResNet> model;
  Tensor x;
  Tensor loss;
};

// One forward+backward of a fresh small-input ResNet-18 (training mode) from fixed seeds.
// segments: as run_chain's; `fine` picks chain() (blocks) instead of stages().
void resnet_step(ResNet& model, int64_t batch, int64_t hw, bool fine, const std::vector<int>& segments) {
  Generator data(5);
  const Tensor x = randn({batch, 3, hw, hw}, {}, &data);
  const Tensor w = randn({batch, 10}, {}, &data);
  manual_seed(1234);
  auto links = fine ? with_dropout(model.chain(), "layer2.1") : with_dropout(model.stages(), "layer2");
  Tensor out = run_chain(links, x, segments);
  sum(out * w).backward();
}

TEST(CheckpointTest, ResNet18PerStageBitIdenticalWithBatchNormAndDropout) {
  Generator g1(42), g2(42);
  auto plain = resnet18(10, &g1, false, true);
  auto ckpt = resnet18(10, &g2, false, true);
  const size_t n = plain->stages().size();
  resnet_step(*plain, 4, 16, false, std::vector<int>(n, -1));
  const uint64_t offset_plain = default_generator().offset();
  std::vector<int> every(n);
  for (size_t i = 0; i < n; ++i) every[i] = static_cast<int>(i);
  resnet_step(*ckpt, 4, 16, false, every);
  EXPECT_EQ(default_generator().offset(), offset_plain);
  expect_same_grads(*plain, *ckpt);
  expect_same_buffers(*plain, *ckpt);  // running stats and num_batches_tracked updated once
  for (const auto& [name, b] : ckpt->named_buffers()) {
    if (name.find("num_batches_tracked") != std::string::npos) {
      EXPECT_EQ(b.to_vector()[0], 1.0) << name;
    }
  }
}

TEST(CheckpointTest, ResNet18SequentialSegmentsBitIdentical) {
  Generator g1(43), g2(43);
  auto plain = resnet18(10, &g1, false, true);
  auto ckpt = resnet18(10, &g2, false, true);
  const size_t n = plain->chain().size();  // stem, 8 blocks, head
  resnet_step(*plain, 4, 16, true, {});
  resnet_step(*ckpt, 4, 16, true, sequential_segments(n, 3));
  expect_same_grads(*plain, *ckpt);
  expect_same_buffers(*plain, *ckpt);
}

TEST(CheckpointTest, SequentialSegmentsAreEqualAndContiguous) {
  EXPECT_EQ(sequential_segments(10, 3), (std::vector<int>{0, 0, 0, 0, 1, 1, 1, 2, 2, 2}));
  EXPECT_EQ(sequential_segments(4, 4), (std::vector<int>{0, 1, 2, 3}));
  EXPECT_EQ(sequential_segments(3, 8), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(sequential_segments(3, 0), (std::vector<int>{0, 0, 0}));
  EXPECT_TRUE(sequential_segments(0, 2).empty());
}

int64_t peak_of_step(bool checkpointed) {
  Generator g(7);
  auto model = resnet18(10, &g, false, true);
  const size_t n = model->stages().size();
  std::vector<int> seg(n, -1);
  if (checkpointed) {
    for (size_t i = 0; i < n; ++i) seg[i] = static_cast<int>(i);
  }
  const int64_t before = memory_stats().allocated_bytes;
  reset_peak_stats();
  resnet_step(*model, 8, 32, false, seg);
  return memory_stats().peak_allocated_bytes - before;
}

TEST(CheckpointTest, PerStageLowersPeakMemory) {
  const int64_t plain = peak_of_step(false);
  const int64_t ckpt = peak_of_step(true);
  std::printf("[checkpoint] ResNet-18 small-input, batch 8, 32x32, train step peak above start: "
              "none %lld bytes, per-stage %lld bytes\n",
              static_cast<long long>(plain), static_cast<long long>(ckpt));
  RecordProperty("peak_none_bytes", std::to_string(plain));
  RecordProperty("peak_per_stage_bytes", std::to_string(ckpt));
  EXPECT_LT(ckpt, plain);
}

TEST(CheckpointTest, NoGradJustRunsTheFunction) {
  Tensor x = randn({3, 4}).set_requires_grad(true);
  int calls = 0;
  NoGradGuard no_grad;
  Tensor y = checkpoint(
      [&](const Tensor& in) {
        ++calls;
        return relu(in);
      },
      x);
  EXPECT_EQ(calls, 1);
  EXPECT_FALSE(y.requires_grad());
  EXPECT_TRUE(y.is_leaf());
}

TEST(CheckpointTest, IdentityFunctionLeavesInputAlone) {
  Tensor x = randn({3}).set_requires_grad(true);
  Tensor y = checkpoint([](const Tensor& in) { return in; }, x);
  EXPECT_TRUE(x.is_leaf());
  EXPECT_FALSE(y.is_leaf());
  sum(y * 2.0).backward();
  EXPECT_EQ(x.grad().to_vector(), std::vector<double>(3, 2.0));
}

TEST(CheckpointTest, SecondBackwardThrowsUnlessRetainedAndThenAccumulates) {
  Linear lin_a(4, 3), lin_b(4, 3);
  lin_b.load_state_dict(lin_a.state_dict());
  const Tensor x = randn({2, 4});  // needs no grad: the parameters still get theirs
  Tensor ya = lin_a(x);
  Tensor yb = checkpoint([&](const Tensor& in) { return lin_b(in); }, x);
  sum(ya).backward(Tensor(), true);
  sum(ya).backward();
  Tensor lb = sum(yb);
  lb.backward(Tensor(), true);
  lb.backward();
  EXPECT_EQ(lin_a.weight().grad().to_vector(), lin_b.weight().grad().to_vector());
  EXPECT_EQ(lin_a.bias().grad().to_vector(), lin_b.bias().grad().to_vector());
  EXPECT_THROW(lb.backward(), std::exception);
}

TEST(CheckpointTest, RecomputeGuardIsScopedAndNested) {
  EXPECT_FALSE(recomputing());
  {
    RecomputeGuard outer;
    EXPECT_TRUE(recomputing());
    {
      RecomputeGuard inner;
      EXPECT_TRUE(recomputing());
    }
    EXPECT_TRUE(recomputing());
  }
  EXPECT_FALSE(recomputing());
  NoGradGuard off;
  {
    EnableGradGuard on;
    EXPECT_TRUE(grad_enabled());
  }
  EXPECT_FALSE(grad_enabled());
}

}  // namespace
}  // namespace minidl::nn
