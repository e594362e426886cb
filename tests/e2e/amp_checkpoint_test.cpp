// AMP combined with recomputation (the "four ways" study combines them): a checkpointed block
// must recompute in the precision its forward ran in, even though backward runs outside the
// autocast scope, so the gradients are bit-identical to the AMP run without recomputation.
#include <gtest/gtest.h>

#include "core/autocast.h"
#include "core/generator.h"
#include "core/ops.h"
#include "nn/checkpoint.h"

namespace minidl {
namespace {

TEST(AmpCheckpoint, RecomputesInTheForwardsPrecision) {
  Generator gen(4);
  const Tensor x = randn(Shape{2, 3, 8, 8}, {}, &gen);
  Tensor w1 = (randn(Shape{4, 3, 3, 3}, {}, &gen) * 0.3).set_requires_grad(true);
  Tensor w2 = (randn(Shape{2, 4 * 8 * 8}, {}, &gen) * 0.05).set_requires_grad(true);
  Tensor rm = zeros({4}), rv = ones({4});
  const Tensor target = from_vector({0, 1}, {2}, {.dtype = DType::i64});
  auto block = [&](const Tensor& h) {
    return relu(batch_norm(conv2d(h, w1, Tensor(), {.padding = {1, 1}}), Tensor(), Tensor(), rm, rv, true));
  };
  auto run = [&](bool recompute) {
    Tensor loss;
    {
      AutocastGuard amp;
      const Tensor h = recompute ? nn::checkpoint(block, x) : block(x);
      EXPECT_EQ(h.dtype(), DType::f16);
      loss = cross_entropy(linear(h.flatten(1), w2), target);
    }
    loss.backward();  // outside the autocast scope, as in the usual recipe
    std::vector<std::vector<double>> g{w1.grad().to_vector(), w2.grad().to_vector()};
    w1.zero_grad();
    w2.zero_grad();
    autocast_clear_cache();
    return g;
  };
  const auto plain = run(false);
  const auto recomputed = run(true);
  EXPECT_EQ(plain, recomputed);
}

}  // namespace
}  // namespace minidl
