// Bad input must produce a minidl::Error that tells the user which op failed, with which shapes
// or dtypes, and how to fix it, never a crash or a bare "invalid argument". These tests pin the
// substrings a user relies on.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/ops.h"
#include "core/tensor.h"

namespace minidl {
namespace {

// Runs fn, expects a minidl::Error whose what() contains every one of `parts`.
void expect_error(const std::function<void()>& fn, const std::vector<std::string>& parts) {
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const auto& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "missing '" << p << "' in: " << msg;
    return;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "threw a non-minidl exception: " << e.what();
    return;
  }
  ADD_FAILURE() << "no exception thrown";
}

// As expect_error, but at least one of `alternatives` must appear as well.
void expect_error_any(const std::function<void()>& fn, const std::vector<std::string>& parts,
                      const std::vector<std::string>& alternatives) {
  expect_error(fn, parts);
  try {
    fn();
  } catch (const Error& e) {
    const std::string msg = e.what();
    bool found = false;
    for (const auto& a : alternatives) found = found || msg.find(a) != std::string::npos;
    std::string all;
    for (const auto& a : alternatives) all += " '" + a + "'";
    EXPECT_TRUE(found) << "none of" << all << " in: " << msg;
  } catch (...) {
  }
}

Tensor f32(const Shape& s) { return zeros(s); }

TEST(Errors, AddIncompatibleShapes) {
  expect_error([] { add(f32({2, 3}), f32({4})); }, {"add", "[2, 3]", "[4]"});
  expect_error([] { (void)(f32({2, 3}) * f32({3, 2})); }, {"mul", "[2, 3]", "[3, 2]"});
  expect_error([] { broadcast_shapes({5, 2}, {3, 2}, "my_op"); }, {"my_op", "[5, 2]", "[3, 2]"});
}

TEST(Errors, DtypeMismatchNamesBothAndTheFix) {
  // The fix is an explicit conversion of one operand.
  expect_error([] { add(f32({2}), zeros({2}, {.dtype = DType::f64})); }, {"add", "f32", "f64", ".to("});
  expect_error([] { matmul(f32({2, 2}), zeros({2, 2}, {.dtype = DType::f64})); }, {"matmul", "f32", "f64"});
}

TEST(Errors, MatmulInnerDimMismatch) {
  expect_error([] { matmul(f32({2, 3}), f32({4, 5})); }, {"matmul", "[2, 3]", "[4, 5]"});
  expect_error([] { matmul(f32({2, 2, 3}), f32({2, 4, 5})); }, {"matmul", "[2, 2, 3]", "[2, 4, 5]"});
  expect_error([] { matmul(f32({3}), f32({4})); }, {"matmul", "[3]", "[4]"});
  expect_error([] { linear(f32({5, 3}), f32({2, 4})); }, {"linear", "[5, 3]", "[2, 4]"});
}

TEST(Errors, ViewIncompatibleNumel) {
  expect_error([] { f32({2, 3}).view({4}); }, {"view", "[2, 3]", "[4]"});
  expect_error([] { f32({2, 3}).reshape({4, 2}); }, {"reshape", "[2, 3]", "[4, 2]"});
  // A transposed tensor cannot be viewed; the fix is reshape() or contiguous().
  expect_error_any([] { f32({2, 3}).t().view({6}); }, {"view", "[3, 2]"}, {"reshape", "contiguous"});
}

TEST(Errors, PermuteRepeatedDim) {
  expect_error([] { f32({2, 3, 4}).permute({0, 0, 1}); }, {"permute", "[2, 3, 4]", "[0, 0, 1]"});
  expect_error([] { f32({2, 3, 4}).permute({0, 1}); }, {"permute", "[2, 3, 4]"});
}

TEST(Errors, SliceAndSelectOutOfRange) {
  expect_error([] { f32({4, 5}).slice(2, 0, 1); }, {"slice", "[4, 5]"});
  expect_error([] { f32({4, 5}).slice(0, 0, 4, 0); }, {"slice", "[4, 5]"});
  expect_error([] { f32({4, 5}).select(0, 4); }, {"select", "[4, 5]"});
  expect_error([] { f32({4, 5}).select(3, 0); }, {"select", "[4, 5]"});
  expect_error([] { f32({4, 5}).transpose(0, 2); }, {"transpose", "[4, 5]"});
}

TEST(Errors, Conv2dChannelMismatch) {
  expect_error([] { conv2d(f32({1, 3, 8, 8}), f32({4, 2, 3, 3})); }, {"conv2d", "[1, 3, 8, 8]", "[4, 2, 3, 3]"});
  expect_error([] { conv2d(f32({1, 3, 8, 8}), f32({4, 3, 3, 3}), f32({5})); }, {"conv2d", "[5]"});
}

TEST(Errors, Conv2dWrongRank) {
  expect_error([] { conv2d(f32({3, 8, 8}), f32({4, 3, 3, 3})); }, {"conv2d", "[3, 8, 8]"});
  expect_error([] { conv2d(f32({1, 3, 8, 8}), f32({4, 3, 3})); }, {"conv2d", "[4, 3, 3]"});
}

TEST(Errors, Conv2dKernelTooLarge) {
  expect_error([] { conv2d(f32({1, 3, 4, 4}), f32({2, 3, 5, 5})); }, {"conv2d", "5", "4"});
  expect_error([] { conv2d(f32({1, 3, 4, 4}), f32({2, 3, 3, 3}), Tensor(), {.stride = {0, 1}}); }, {"conv2d"});
  expect_error([] { conv_output_size(4, 5, 1, 0, 1, false, "conv2d"); }, {"conv2d"});
}

TEST(Errors, MaxPoolBadPadding) {
  expect_error([] { max_pool2d(f32({1, 1, 6, 6}), {.kernel = {2, 2}, .padding = {-1, 0}}); }, {"max_pool2d"});
  // PyTorch's rule: padding at most half the kernel.
  expect_error([] { max_pool2d(f32({1, 1, 6, 6}), {.kernel = {2, 2}, .padding = {2, 2}}); }, {"max_pool2d"});
  expect_error([] { max_pool2d(f32({6, 6}), {.kernel = {2, 2}}); }, {"max_pool2d", "[6, 6]"});
  expect_error([] { avg_pool2d(f32({1, 1, 6, 6}), {.kernel = {2, 2}, .padding = {-1, 0}}); }, {"avg_pool2d"});
}

TEST(Errors, CrossEntropyTargetOutOfRange) {
  const Tensor logits = f32({3, 4});
  const Tensor target = from_vector({0, 4, 1}, {3}, {.dtype = DType::i64});
  expect_error([&] { cross_entropy(logits, target); }, {"4"});
  expect_error_any([&] { cross_entropy(logits, target); }, {}, {"cross_entropy", "nll_loss"});
  const Tensor negative = from_vector({0, -1, 1}, {3}, {.dtype = DType::i64});
  expect_error([&] { cross_entropy(logits, negative); }, {"-1"});
  expect_error([&] { nll_loss(logits, target); }, {"nll_loss", "4"});
}

TEST(Errors, CrossEntropyTargetWrongDtypeOrShape) {
  const Tensor logits = f32({3, 4});
  expect_error([&] { cross_entropy(logits, f32({3})); }, {"cross_entropy", "i64", "f32"});
  expect_error([&] { cross_entropy(logits, zeros({2}, {.dtype = DType::i64})); }, {"cross_entropy", "[3, 4]", "[2]"});
  expect_error([&] { cross_entropy(logits, zeros({3}, {.dtype = DType::i64}), Reduction::Mean, 1.0); },
               {"cross_entropy", "label_smoothing"});
}

TEST(Errors, OtherOpsNameTheirShapes) {
  expect_error([] { binary_cross_entropy_with_logits(f32({3}), f32({4})); },
               {"binary_cross_entropy_with_logits", "[3]", "[4]"});
  expect_error([] { batch_norm(f32({2, 3, 4}), f32({4}), Tensor(), Tensor(), Tensor(), true); },
               {"batch_norm", "[4]", "[2, 3, 4]"});
  expect_error([] { softmax(f32({2, 3}), 2); }, {"softmax", "2", "[2, 3]"});
  expect_error([] { log_softmax(f32({2, 3}), -3); }, {"log_softmax", "[2, 3]"});
  expect_error([] { sum(f32({2, 3}), {2}); }, {"sum", "[2, 3]"});
  expect_error([] { max(f32({2, 3}), {-3}); }, {"max", "[2, 3]"});
  expect_error([] { dropout(f32({2, 3}), 1.5, true); }, {"dropout", "1.5"});
  expect_error([] { f32({2, 3}).expand({4, 3}); }, {"expand", "[2, 3]", "[4, 3]"});
  expect_error([] { f32({2, 3}).squeeze(5); }, {"squeeze", "[2, 3]"});
  expect_error([] { f32({2, 3}).flatten(1, 0); }, {"flatten", "[2, 3]"});
}

TEST(Errors, AutogradMisuse) {
  Tensor x = zeros({2}, {.dtype = DType::f64});
  expect_error([&] { sum(x).backward(); }, {"backward", "require grad"});
  x.set_requires_grad(true);
  // The fix for an in-place update of a parameter is NoGradGuard, as optimizers do.
  expect_error([&] { x.add_(x); }, {"add_", "NoGradGuard"});
}

TEST(Errors, InPlaceSourceOverlappingPartOfTheTarget) {
  // x.sub_(x[0]) would read row 0 after overwriting it (on the GPU in no fixed order): refused.
  Tensor x = arange(0, 6, 1, {.dtype = DType::f32}).reshape({2, 3});
  expect_error([&] { x.add_(x.select(0, 0), -1.0); }, {"add_", "overlaps part of the in-place target", "clone"});
  expect_error([&] { x.mul_(x.select(0, 1)); }, {"mul_", "overlaps"});
  expect_error([&] { x.copy_(x.select(0, 0)); }, {"copy_", "overlaps"});
  EXPECT_EQ(sum(x.to(DType::f64)).item(), 15.0) << "a refused update must not have written anything";
  // The same view, a clone, or disjoint rows of one storage stay allowed.
  x.add_(x);
  x.add_(x.select(0, 0).clone(), -1.0);
  x.select(0, 1).copy_(x.select(0, 0));
  EXPECT_EQ(sum(x.to(DType::f64)).item(), 0.0);
}

TEST(Errors, ItemOnMultiElementTensor) {
  expect_error([] { (void)f32({2, 3}).item(); }, {"item", "[2, 3]"});
}

TEST(Errors, CudaTensorInCpuOnlyBuild) {
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present: the CPU-only error does not apply";
  // The message must say CUDA is unavailable and how to get it (a CUDA build / a GPU) or avoid it.
  expect_error_any([] { zeros({2}, {.device = Device::cuda()}); }, {"CUDA"}, {"MINIDL_CUDA", "Device::cpu", "cpu"});
  expect_error([] { f32({2}).to(Device::cuda()); }, {"CUDA"});
}

TEST(Errors, BackwardErrorsAreMinidlErrors) {
  Tensor x = zeros({2}, {.dtype = DType::f64});
  x.set_requires_grad(true);
  Tensor y = x * 2.0;
  expect_error([&] { y.backward(); }, {"scalar"});
  expect_error([&] { y.backward(zeros({3}, {.dtype = DType::f64})); }, {"[2]", "[3]"});
}

}  // namespace
}  // namespace minidl
