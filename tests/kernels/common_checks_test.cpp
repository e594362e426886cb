// kernels/common: the host-side checks, geometry, dtype dispatch and scalar formulas both backends
// call. Each message names the backend it was asked for, and the layouts accepted are exactly the
// ones the caller allows.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "core/ops.h"
#include "core/tensor.h"
#include "kernels/common/checks.h"
#include "kernels/common/dispatch.h"
#include "kernels/common/scalar_ops.h"
#include "tests/support/error_of.h"

namespace minidl {
namespace {

using ::minidl::testing::error_of;
using ::testing::HasSubstr;

TEST(KernelsCommon, SoftmaxLayoutSplitsAroundTheDim) {
  const Tensor x = zeros({2, 3, 4, 5});
  const common::SoftmaxLayout L = common::softmax_layout("cpu", x, -2, "softmax");
  EXPECT_EQ(L.outer, 6);
  EXPECT_EQ(L.C, 4);
  EXPECT_EQ(L.inner, 5);
  EXPECT_THAT(error_of([&] { common::softmax_layout("cuda", x, 4, "log_softmax"); }),
              HasSubstr("log_softmax (cuda): dim 4 out of range"));
  EXPECT_THAT(error_of([&] { common::softmax_layout("cpu", x.permute({0, 1, 3, 2}), 1, "softmax"); }),
              HasSubstr("softmax (cpu): input must be contiguous"));
}

TEST(KernelsCommon, ChannelLayoutTakesChannelsLastOnlyWhenAllowed) {
  const Tensor nhwc = to_channels_last(zeros({2, 3, 4, 5}));
  const common::ChannelLayout L = common::channel_layout("cuda", nhwc, "batch_norm", "x", true);
  EXPECT_TRUE(L.channels_last);
  EXPECT_EQ(L.N, 2);
  EXPECT_EQ(L.C, 3);
  EXPECT_EQ(L.S, 20);
  EXPECT_THAT(error_of([&] { common::channel_layout("cpu", nhwc, "batch_norm", "gy", false); }),
              HasSubstr("batch_norm (cpu): gy"));
  EXPECT_THAT(error_of([&] { common::channel_layout("cpu", zeros({4}), "batch_norm", "x", true); }),
              HasSubstr("must be [N, C, ...]"));
  EXPECT_FALSE(common::channel_layout("cpu", zeros({2, 3}), "batch_norm", "x", false).channels_last);
}

TEST(KernelsCommon, PoolGeomAndTargetChecksNameTheBackend) {
  Pool2dOptions o;
  o.stride = {2, 2};
  o.count_include_pad = false;
  const common::PoolGeom g = common::pool_geom("cpu", {2, 3, 8, 6}, {2, 3, 4, 3}, o, "avg_pool2d_forward");
  EXPECT_EQ(g.planes, 6);
  EXPECT_EQ(g.oh, 4);
  EXPECT_EQ(g.ow, 3);
  EXPECT_FALSE(g.include_pad);
  o.stride = {0, 0};
  EXPECT_THAT(error_of([&] { common::pool_geom("cuda", {2, 3, 8, 6}, {2, 3, 4, 3}, o, "max_pool2d_forward"); }),
              HasSubstr("max_pool2d_forward (cuda): stride must be resolved"));
  const Tensor target = zeros({3}, {DType::i64});
  EXPECT_NO_THROW(common::check_class_target("cpu", target, 3, "nll_loss"));
  EXPECT_THAT(error_of([&] { common::check_class_target("cuda", target, 4, "cross_entropy"); }),
              HasSubstr("cross_entropy (cuda): target must be i64 of shape [4]"));
  EXPECT_EQ(common::grad_step("cpu", zeros({3}), "bce"), 1);
  EXPECT_EQ(common::grad_step("cpu", zeros({1}).expand({3}), "bce"), 0);
  const Tensor undefined, strided = zeros({4, 4}).permute({1, 0});
  EXPECT_NO_THROW(common::check_contiguous("cpu", "conv2d_forward", {&target, &undefined}));
  EXPECT_THAT(error_of([&] { common::check_contiguous("cuda", "conv2d", {&target, &strided}); }),
              HasSubstr("conv2d (cuda): kernel expects contiguous tensors"));
}

// A stand-in for a backend's f16 type: the dispatch only needs to name it.
struct FakeHalf {
  unsigned short bits;
};

TEST(KernelsCommon, DispatchTakesEachFamilysDtypes) {
  constexpr common::Dispatch<FakeHalf, common::DTypeFamily::Arith> arith{"cuda"};
  constexpr common::Dispatch<void, common::DTypeFamily::Floating> wide{"cpu"};
  constexpr common::Dispatch<FakeHalf, common::DTypeFamily::All> all{"cpu"};
  size_t size = 0;
  auto record = [&](auto t) { size = sizeof(t); };
  arith(DType::f16, "add", record);
  EXPECT_EQ(size, sizeof(FakeHalf));
  arith(DType::i64, "add", record);
  EXPECT_EQ(size, 8u);
  all(DType::boolean, "copy", record);
  EXPECT_EQ(size, sizeof(bool));
  wide(DType::f64, "matmul", record);
  EXPECT_EQ(size, 8u);
  EXPECT_THAT(error_of([&] { arith(DType::u8, "add", record); }),
              HasSubstr("add (cuda): needs a numeric tensor (f32, f64, f16, i32 or i64), got u8"));
  EXPECT_THAT(error_of([&] { wide(DType::f16, "matmul", record); }),
              HasSubstr("matmul (cpu): needs a floating tensor (f32 or f64), got f16"));
  // A backend without a bf16 type refuses bf16 naming the conversion; one with it takes it.
  EXPECT_THAT(error_of([&] { arith(DType::bf16, "add", record); }),
              HasSubstr("add (cuda): needs a numeric tensor (f32, f64, f16, i32 or i64), got bf16; convert with "
                        ".to(DType::f32)"));
  EXPECT_THAT(error_of([&] { all(DType::bf16, "copy", record); }),
              HasSubstr("copy (cpu): needs a dtype it has kernels for, got bf16"));
  struct FakeBf16 {
    uint16_t bits[3];  // a size of its own, so the test tells it from FakeHalf
  };
  constexpr common::Dispatch<FakeHalf, common::DTypeFamily::Floating, FakeBf16> floating16{"cpu"};
  size = 0;
  floating16(DType::bf16, "relu", record);
  EXPECT_EQ(size, sizeof(FakeBf16));
  EXPECT_THAT(error_of([&] { floating16(DType::i32, "relu", record); }),
              HasSubstr("relu (cpu): needs a floating tensor (f32, f64, f16 or bf16), got i32"));
}

TEST(KernelsCommon, BinaryFormulasPropagateNaNAndCompare) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(std::isnan(common::apply_arith<float>(BinaryOp::Maximum, nan, 1.0f, 1.0f)));
  EXPECT_TRUE(std::isnan(common::apply_arith<float>(BinaryOp::Minimum, 1.0f, nan, 1.0f)));
  EXPECT_EQ(common::apply_arith<int64_t>(BinaryOp::Maximum, 3, 5, 1), 5);
  EXPECT_EQ(common::apply_arith<double>(BinaryOp::Sub, 1.0, 2.0, 0.5), 0.0);
  EXPECT_EQ(common::apply_arith<float>(BinaryOp::ReluGrad, 2.0f, -1.0f, 1.0f), 0.0f);
  EXPECT_TRUE(common::apply_compare<int32_t>(BinaryOp::Le, 2, 2));
  EXPECT_FALSE(common::apply_compare<float>(BinaryOp::Eq, nan, nan));
}

TEST(KernelsCommon, LossChecksNameTheBackendAndOperand) {
  const Tensor logits = zeros({2, 3}), target = zeros({2}, {DType::i64}), lse = zeros({2}, {DType::f64});
  EXPECT_EQ(common::check_nll_forward("cpu", logits, target, zeros({2})), 2);
  EXPECT_THAT(error_of([&] { common::check_nll_backward("cuda", zeros({3}), target, logits); }),
              HasSubstr("nll_loss_backward (cuda): g must be [2]"));
  EXPECT_THAT(error_of([&] { common::check_cross_entropy_forward("cpu", logits, target, zeros({2}), zeros({2})); }),
              HasSubstr("cross_entropy (cpu): lse must be a contiguous f64 [2]"));
  EXPECT_THAT(error_of([&] {
                common::check_cross_entropy_backward("cuda", zeros({2}), logits, target, lse, zeros({3, 2}));
              }),
              HasSubstr("cross_entropy_backward (cuda): glogits"));
}

}  // namespace
}  // namespace minidl
