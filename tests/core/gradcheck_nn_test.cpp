// Finite-difference gradient checks in f64 for the network ops with a backward: convolution,
// pooling, batch norm, dropout, softmax and the losses. Split from gradcheck_test.cpp (the
// tensor-level ops) to keep files small; the builders both use are in gradcheck_builders.h.
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/generator.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "tests/support/gradcheck.h"
#include "tests/support/gradcheck_builders.h"

namespace minidl {
namespace {

using testing::distinct_f64;
using testing::plain;
using testing::rand_f64;
using testing::random_labels;
using testing::random_shape;
using testing::strided_leaf;
using testing::transposed_leaf;
using V = std::vector<Tensor>;

// ---- Convolution ----

void check_conv(const Shape& xs, const Shape& ws, bool with_bias, const Conv2dOptions& o, uint64_t seed) {
  SCOPED_TRACE("conv2d x " + shape_str(xs) + " w " + shape_str(ws) + (with_bias ? " bias" : " no bias") + " stride " +
               std::to_string(o.stride[0]) + "," + std::to_string(o.stride[1]) + " pad " + std::to_string(o.padding[0]) +
               "," + std::to_string(o.padding[1]) + " dil " + std::to_string(o.dilation[0]) + "," +
               std::to_string(o.dilation[1]) + " groups " + std::to_string(o.groups));
  if (with_bias) {
    EXPECT_GRADCHECK([o](const V& in) { return conv2d(in[0], in[1], in[2], o); },
                     {plain(xs, seed), plain(ws, seed + 1), plain({ws[0]}, seed + 2)});
  } else {
    EXPECT_GRADCHECK([o](const V& in) { return conv2d(in[0], in[1], Tensor(), o); }, {plain(xs, seed), plain(ws, seed + 1)});
  }
}

TEST(GradcheckConv, Basic) {
  check_conv({2, 3, 5, 5}, {4, 3, 3, 3}, true, {}, 1);
  check_conv({1, 2, 4, 4}, {3, 2, 1, 1}, false, {}, 4);
}
TEST(GradcheckConv, StridePadding) {
  check_conv({2, 2, 6, 5}, {3, 2, 3, 3}, true, {.stride = {2, 2}, .padding = {1, 1}}, 1);
  check_conv({1, 2, 5, 6}, {2, 2, 3, 3}, false, {.stride = {2, 1}, .padding = {0, 2}}, 4);
}
TEST(GradcheckConv, Dilation) {
  check_conv({1, 2, 7, 6}, {3, 2, 3, 2}, true, {.padding = {1, 1}, .dilation = {2, 2}}, 1);
  check_conv({2, 2, 6, 7}, {2, 2, 2, 3}, false, {.stride = {1, 2}, .dilation = {1, 2}}, 4);
}
TEST(GradcheckConv, NonSquareEverything) {
  check_conv({2, 3, 6, 5}, {4, 3, 3, 2}, true, {.stride = {2, 1}, .padding = {1, 2}, .dilation = {1, 2}}, 1);
}
// Grouped convolution is outside this version's scope (ResNets need groups = 1); until it exists
// the op must refuse it clearly rather than compute something else.
TEST(GradcheckConv, GroupsAreRefusedClearly) {
  try {
    conv2d(zeros({1, 4, 5, 5}, {.dtype = DType::f64}), zeros({6, 2, 3, 3}, {.dtype = DType::f64}), Tensor(),
           {.padding = {1, 1}, .groups = 2});
    FAIL() << "expected minidl::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("groups=2 is not supported"), std::string::npos) << e.what();
  }
}
TEST(GradcheckConv, NonContiguousInputs) {
  const Conv2dOptions o{.stride = {2, 1}, .padding = {1, 1}};
  const auto f = [o](const V& in) { return conv2d(in[0], in[1], in[2], o); };
  EXPECT_GRADCHECK(f, {transposed_leaf(plain({2, 2, 5, 4}, 1)), plain({3, 2, 3, 3}, 2), plain({3}, 3)});
  EXPECT_GRADCHECK(f, {strided_leaf(plain({1, 2, 5, 4}, 4)), strided_leaf(plain({3, 2, 3, 2}, 5)), strided_leaf(plain({3}, 6))});
  // NHWC-style memory, as a channels-last caller would pass it.
  EXPECT_GRADCHECK([o](const V& in) { return conv2d(in[0].permute({0, 3, 1, 2}), in[1], in[2], o); },
                   {plain({2, 5, 4, 2}, 7), plain({3, 2, 3, 3}, 8), plain({3}, 9)});
}

// ---- Pooling ----

void check_pool(bool is_max, const Shape& xs, const Pool2dOptions& o, uint64_t seed) {
  SCOPED_TRACE(std::string(is_max ? "max_pool2d" : "avg_pool2d") + " x " + shape_str(xs) + " kernel " +
               std::to_string(o.kernel[0]) + "," + std::to_string(o.kernel[1]) + " stride " + std::to_string(o.stride[0]) +
               "," + std::to_string(o.stride[1]) + " pad " + std::to_string(o.padding[0]) + "," +
               std::to_string(o.padding[1]) + (o.ceil_mode ? " ceil" : "") +
               (o.count_include_pad ? "" : " count_include_pad=false"));
  const auto f = [o, is_max](const V& in) { return is_max ? max_pool2d(in[0], o) : avg_pool2d(in[0], o); };
  // Distinct values keep the max-pool argmax stable under a perturbation of eps.
  EXPECT_GRADCHECK(f, {distinct_f64(xs, seed)});
  EXPECT_GRADCHECK(f, {transposed_leaf(distinct_f64(xs, seed + 1))});
}

TEST(GradcheckPool, MaxPool) {
  check_pool(true, {2, 2, 6, 6}, {.kernel = {2, 2}}, 1);
  check_pool(true, {1, 2, 7, 6}, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}}, 3);
  check_pool(true, {1, 2, 5, 5}, {.kernel = {2, 2}, .stride = {2, 2}, .ceil_mode = true}, 5);
  check_pool(true, {1, 2, 5, 7}, {.kernel = {2, 3}, .stride = {1, 2}, .padding = {1, 1}}, 7);
  check_pool(true, {1, 1, 6, 6}, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}, .ceil_mode = true}, 9);
}
TEST(GradcheckPool, AvgPool) {
  check_pool(false, {2, 2, 6, 6}, {.kernel = {2, 2}}, 1);
  check_pool(false, {1, 2, 5, 5}, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}}, 3);
  check_pool(false, {1, 2, 5, 5}, {.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}, .count_include_pad = false}, 5);
  check_pool(false, {1, 2, 5, 5}, {.kernel = {2, 2}, .stride = {2, 2}, .ceil_mode = true}, 7);
  check_pool(false, {1, 2, 6, 5}, {.kernel = {3, 2}, .stride = {2, 2}, .padding = {1, 1}, .ceil_mode = true}, 9);
  check_pool(false, {1, 2, 6, 5},
             {.kernel = {3, 2}, .stride = {2, 2}, .padding = {1, 1}, .ceil_mode = true, .count_include_pad = false}, 11);
  check_pool(false, {1, 1, 7, 6}, {.kernel = {3, 3}, .stride = {1, 2}}, 13);
}
TEST(GradcheckPool, AdaptiveAvgPool) {
  EXPECT_GRADCHECK([](const V& in) { return adaptive_avg_pool2d(in[0]); }, {plain({2, 3, 4, 5}, 1)});
  EXPECT_GRADCHECK([](const V& in) { return adaptive_avg_pool2d(in[0], {1, 1}); }, {transposed_leaf(plain({2, 3, 3, 2}, 2))});
}

// ---- Normalisation and regularisation ----

TEST(GradcheckNorm, BatchNormTrainingWithAffine) {
  const auto f = [](const V& in) {
    const int64_t c = in[0].size(1);
    return batch_norm(in[0], in[1], in[2], zeros({c}, {.dtype = DType::f64}), ones({c}, {.dtype = DType::f64}), true);
  };
  EXPECT_GRADCHECK(f, {plain({4, 3, 2, 2}, 1), rand_f64({3}, 2, 0.5, 1.5), plain({3}, 3)});
  EXPECT_GRADCHECK(f, {plain({6, 3}, 4), rand_f64({3}, 5, 0.5, 1.5), plain({3}, 6)});
  EXPECT_GRADCHECK(f, {plain({3, 2, 4}, 7), rand_f64({2}, 8, 0.5, 1.5), plain({2}, 9)});
  EXPECT_GRADCHECK(f, {transposed_leaf(plain({4, 3, 2, 2}, 10)), rand_f64({3}, 11, 0.5, 1.5), plain({3}, 12)});
}
TEST(GradcheckNorm, BatchNormTrainingWithoutAffine) {
  EXPECT_GRADCHECK([](const V& in) { return batch_norm(in[0], Tensor(), Tensor(), Tensor(), Tensor(), true); },
                   {plain({4, 3, 2, 2}, 1)});
  EXPECT_GRADCHECK([](const V& in) { return batch_norm(in[0], Tensor(), in[1], Tensor(), Tensor(), true); },
                   {plain({5, 2}, 2), plain({2}, 3)});
}
TEST(GradcheckNorm, BatchNormTrainingRunningStatsGetNoGrad) {
  // The running statistics are updated in place on every evaluation; they are inputs without
  // requires_grad, and gradcheck verifies they receive no .grad.
  const Tensor rm = zeros({3}, {.dtype = DType::f64});
  const Tensor rv = ones({3}, {.dtype = DType::f64});
  EXPECT_GRADCHECK([](const V& in) { return batch_norm(in[0], in[1], in[2], in[3], in[4], true, 0.1, 1e-5); },
                   {plain({4, 3, 2, 2}, 1), rand_f64({3}, 2, 0.5, 1.5), plain({3}, 3), rm, rv});
}
TEST(GradcheckNorm, BatchNormEval) {
  const Tensor rm = rand_f64({3}, 10, -0.5, 0.5, false);
  const Tensor rv = rand_f64({3}, 11, 0.5, 2.0, false);
  EXPECT_GRADCHECK([](const V& in) { return batch_norm(in[0], in[1], in[2], in[3], in[4], false); },
                   {plain({4, 3, 2, 2}, 1), rand_f64({3}, 2, 0.5, 1.5), plain({3}, 3), rm, rv});
  EXPECT_GRADCHECK([](const V& in) { return batch_norm(in[0], Tensor(), Tensor(), in[1], in[2], false); },
                   {plain({4, 3, 2, 2}, 4), rm, rv});
  EXPECT_GRADCHECK([](const V& in) { return batch_norm(in[0], Tensor(), in[1], in[2], in[3], false); },
                   {transposed_leaf(plain({5, 3}, 5)), plain({3}, 6), rm, rv});
}

TEST(GradcheckNorm, Dropout) {
  // A fresh Generator with the same seed in every evaluation: the mask is the same each time.
  const auto f = [](const V& in) {
    Generator g(1234);
    return dropout(in[0], 0.3, true, &g);
  };
  EXPECT_GRADCHECK(f, {plain({4, 5}, 1)});
  EXPECT_GRADCHECK(f, {transposed_leaf(plain({3, 6}, 2))});
  EXPECT_GRADCHECK([](const V& in) { return dropout(in[0], 0.5, false); }, {plain({4, 5}, 3)});
  // The mask is not trivial (some kept, some dropped) and is the same for the same seed.
  Generator g1(1234), g2(1234);
  const Tensor x = ones({200}, {.dtype = DType::f64});
  const std::vector<double> a = dropout(x, 0.3, true, &g1).to_vector();
  const std::vector<double> b = dropout(x, 0.3, true, &g2).to_vector();
  EXPECT_EQ(a, b);
  int zeros_seen = 0;
  for (double v : a) {
    if (v == 0.0) {
      ++zeros_seen;
    } else {
      EXPECT_NEAR(v, 1.0 / 0.7, 1e-12);
    }
  }
  EXPECT_GT(zeros_seen, 20);
  EXPECT_LT(zeros_seen, 100);
}

// ---- Softmax and losses ----

using SoftmaxFn = Tensor (*)(const Tensor&, int64_t);

// The cases softmax and log_softmax share: along every dim of a 3-D input, plain and transposed,
// and along the only dim of a 1-D one.
void expect_gradcheck_along_every_dim(SoftmaxFn f) {
  for (int64_t d : {0, 1, 2, -1}) {
    SCOPED_TRACE("dim " + std::to_string(d));
    EXPECT_GRADCHECK([f, d](const V& in) { return f(in[0], d); }, {plain({3, 4, 5}, 1)});
    EXPECT_GRADCHECK([f, d](const V& in) { return f(in[0], d); }, {transposed_leaf(plain({3, 4, 5}, 2))});
  }
  EXPECT_GRADCHECK([f](const V& in) { return f(in[0], 0); }, {plain({6}, 3)});
}

TEST(GradcheckSoftmax, Softmax) {
  expect_gradcheck_along_every_dim(softmax);
  EXPECT_GRADCHECK([](const V& in) { return softmax(in[0], 1); }, {strided_leaf(plain({2, 5}, 4))});
  const Shape s = random_shape(51, 3, 1, 5);
  EXPECT_GRADCHECK([](const V& in) { return softmax(in[0], 1); }, {plain(s, 5)});
}
TEST(GradcheckSoftmax, LogSoftmax) {
  expect_gradcheck_along_every_dim(log_softmax);
  // Large logits: the stable formulation must not lose the gradient.
  EXPECT_GRADCHECK([](const V& in) { return log_softmax(in[0] * 30.0, 1); }, {plain({2, 5}, 4)});
}

// Every reduction, and the name a failure's trace gives it.
struct ReductionCase {
  Reduction r;
  const char* name;
};
constexpr ReductionCase kReductions[] = {{Reduction::None, "none"}, {Reduction::Mean, "mean"}, {Reduction::Sum, "sum"}};

TEST(GradcheckLoss, CrossEntropy) {
  const Tensor target = random_labels(5, 4, 1);
  for (double smoothing : {0.0, 0.1}) {
    for (const ReductionCase& c : kReductions) {
      SCOPED_TRACE(std::string("reduction ") + c.name + " label_smoothing " + std::to_string(smoothing));
      const Reduction r = c.r;
      const auto f = [r, smoothing](const V& in) { return cross_entropy(in[0], in[1], r, smoothing); };
      EXPECT_GRADCHECK(f, {rand_f64({5, 4}, 2, -2, 2), target});
      EXPECT_GRADCHECK(f, {transposed_leaf(rand_f64({5, 4}, 3, -2, 2)), target});
    }
  }
}
TEST(GradcheckLoss, NllLoss) {
  const Tensor target = random_labels(5, 4, 1);
  for (const ReductionCase& c : kReductions) {
    SCOPED_TRACE(std::string("reduction ") + c.name);
    const Reduction r = c.r;
    EXPECT_GRADCHECK([r](const V& in) { return nll_loss(in[0], in[1], r); }, {plain({5, 4}, 2), target});
    EXPECT_GRADCHECK([r](const V& in) { return nll_loss(log_softmax(in[0], 1), in[1], r); },
                     {transposed_leaf(plain({5, 4}, 3)), target});
  }
}
TEST(GradcheckLoss, BinaryCrossEntropyWithLogits) {
  const Tensor target = rand_f64({3, 4}, 1, 0.0, 1.0, false);
  for (const ReductionCase& c : kReductions) {
    SCOPED_TRACE(std::string("reduction ") + c.name);
    const Reduction r = c.r;
    const auto f = [r](const V& in) { return binary_cross_entropy_with_logits(in[0], in[1], r); };
    EXPECT_GRADCHECK(f, {rand_f64({3, 4}, 2, -3, 3), target});
    EXPECT_GRADCHECK(f, {transposed_leaf(rand_f64({3, 4}, 3, -3, 3)), target});
    // Large logits of both signs: the stable form must keep the gradient sigmoid(x) - t.
    EXPECT_GRADCHECK([r](const V& in) { return binary_cross_entropy_with_logits(in[0] * 20.0, in[1], r); },
                     {rand_f64({3, 4}, 4, -2, 2), target});
  }
}
TEST(GradcheckLoss, BinaryCrossEntropyWithLogitsTargetGrad) {
  // PyTorch differentiates this loss with respect to the target too (soft labels, distillation).
  EXPECT_GRADCHECK([](const V& in) { return binary_cross_entropy_with_logits(in[0], in[1]); },
                   {rand_f64({3, 4}, 1, -3, 3), rand_f64({3, 4}, 2, 0.0, 1.0)});
}

}  // namespace
}  // namespace minidl
