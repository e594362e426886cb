// A whole training step of ResNet-18 (torchvision's, small-input stem, 16x16 images) on the CUDA
// device against the CPU backend: the loss, every parameter's gradient, the parameters after one
// SGD-with-momentum step and the batch-norm running statistics. Every op family of a real network
// runs here at once (convolutions, batch norm, pooling, residual adds, the fused loss, the
// optimizer), so it is the end-to-end check of the backend; on the emulated device it runs in CI.
#include <gtest/gtest.h>

#include <string>

#include "core/ops.h"
#include "nn/resnet.h"
#include "optim/sgd.h"
#include "tests/support/parity_helpers.h"

namespace minidl::testing::parity {
namespace {

TEST_F(Parity, ResNet18TrainingStepMatchesCpu) {
  Generator gc(7), gd(7), gx(8);
  auto cpu = nn::resnet18(10, &gc, false, /*small_input=*/true);
  auto dev = nn::resnet18(10, &gd, false, /*small_input=*/true);
  dev->to(kGpu);
  const Tensor x = randn({2, 3, 16, 16}, {}, &gx);
  const Tensor y = from_vector({3, 7}, {2}, {.dtype = DType::i64});
  optim::SGD sc(cpu->parameters(), {.lr = 0.1, .momentum = 0.9});
  optim::SGD sd(dev->parameters(), {.lr = 0.1, .momentum = 0.9});

  const Tensor lc = cross_entropy((*cpu)(x), y);
  const Tensor ld = cross_entropy((*dev)(to_target(x)), to_target(y));
  lc.backward();
  ld.backward();
  ASSERT_TRUE(close(lc.detach(), ld.detach(), 1e-5, "loss"));

  const auto pc = cpu->named_parameters(), pd = dev->named_parameters();
  ASSERT_EQ(pc.size(), pd.size());
  for (size_t i = 0; i < pc.size(); ++i) {
    ASSERT_TRUE(pd[i].second.grad().defined()) << pd[i].first;
    EXPECT_TRUE(close(pc[i].second.grad(), pd[i].second.grad(), 1e-4, "grad of " + pc[i].first));
  }
  sc.step();
  sd.step();
  for (size_t i = 0; i < pc.size(); ++i) {
    EXPECT_TRUE(close(pc[i].second.detach(), pd[i].second.detach(), 1e-5, "stepped " + pc[i].first));
  }
  const auto bc = cpu->named_buffers(), bd = dev->named_buffers();
  ASSERT_EQ(bc.size(), bd.size());
  for (size_t i = 0; i < bc.size(); ++i) {
    if (is_floating(bc[i].second.dtype())) {
      EXPECT_TRUE(close(bc[i].second, bd[i].second, 1e-5, "buffer " + bc[i].first));
    }
  }
}

}  // namespace
}  // namespace minidl::testing::parity
