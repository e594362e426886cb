// Finite-difference gradient checks in f64 of the fused batch norm + (residual add) + ReLU
// (batch_norm_relu, batch_norm_add_relu): training and evaluation, with and without the affine
// parameters, NCHW and channels-last inputs. Seeded inputs keep every pre-activation far from the
// ReLU's kink compared with the step, so central differences are exact to rounding.
#include <gtest/gtest.h>

#include <vector>

#include "core/ops.h"
#include "core/tensor.h"
#include "tests/support/gradcheck.h"
#include "tests/support/gradcheck_builders.h"

namespace minidl {
namespace {

using testing::plain;
using testing::rand_f64;
using V = std::vector<Tensor>;

// A leaf holding t's values in channels-last memory.
Tensor channels_last_leaf(const Tensor& t) {
  Tensor v = to_channels_last(t.detach()).detach();
  v.set_requires_grad(true);
  return v;
}

Tensor stats(int64_t c, double v, bool requires_grad = false) {
  return full({c}, v, {.dtype = DType::f64, .requires_grad = requires_grad});
}

TEST(GradcheckNormAct, BatchNormReluTraining) {
  const auto f = [](const V& in) { return batch_norm_relu(in[0], in[1], in[2], Tensor(), Tensor(), true); };
  EXPECT_GRADCHECK(f, {plain({4, 3, 2, 2}, 1), rand_f64({3}, 2, 0.5, 1.5), plain({3}, 3)});
  EXPECT_GRADCHECK(f, {plain({6, 3}, 4), rand_f64({3}, 5, 0.5, 1.5), plain({3}, 6)});
  EXPECT_GRADCHECK(f, {channels_last_leaf(plain({3, 4, 2, 3}, 7)), rand_f64({4}, 8, 0.5, 1.5), plain({4}, 9)});
  EXPECT_GRADCHECK([](const V& in) { return batch_norm_relu(in[0], Tensor(), Tensor(), Tensor(), Tensor(), true); },
                   {plain({5, 2, 3, 1}, 10)});
}

TEST(GradcheckNormAct, BatchNormAddReluTraining) {
  const auto f = [](const V& in) {
    const int64_t c = in[0].size(1);
    return batch_norm_add_relu(in[0], in[1], in[2], in[3], stats(c, 0.0), stats(c, 1.0), true);
  };
  EXPECT_GRADCHECK(f, {plain({4, 3, 2, 2}, 1), plain({4, 3, 2, 2}, 2), rand_f64({3}, 3, 0.5, 1.5), plain({3}, 4)});
  EXPECT_GRADCHECK(f, {channels_last_leaf(plain({2, 3, 3, 2}, 5)), channels_last_leaf(plain({2, 3, 3, 2}, 6)),
                       rand_f64({3}, 7, 0.5, 1.5), plain({3}, 8)});
  // A residual in NCHW memory beside a channels-last input: it is brought to x's layout.
  EXPECT_GRADCHECK(f, {channels_last_leaf(plain({2, 3, 2, 2}, 9)), plain({2, 3, 2, 2}, 10),
                       rand_f64({3}, 11, 0.5, 1.5), plain({3}, 12)});
}

TEST(GradcheckNormAct, Evaluation) {
  const Tensor rm = rand_f64({3}, 20, -0.5, 0.5, false);
  const Tensor rv = rand_f64({3}, 21, 0.5, 2.0, false);
  EXPECT_GRADCHECK([](const V& in) { return batch_norm_relu(in[0], in[1], in[2], in[3], in[4], false); },
                   {plain({4, 3, 2, 2}, 1), rand_f64({3}, 2, 0.5, 1.5), plain({3}, 3), rm, rv});
  EXPECT_GRADCHECK([](const V& in) { return batch_norm_add_relu(in[0], in[1], in[2], in[3], in[4], in[5], false); },
                   {channels_last_leaf(plain({2, 3, 2, 3}, 4)), plain({2, 3, 2, 3}, 5), rand_f64({3}, 6, 0.5, 1.5),
                    plain({3}, 7), rm, rv});
}

}  // namespace
}  // namespace minidl
