// kernels/common: the host-side checks and geometry both backends call. Each message names the
// backend it was asked for, and the layouts accepted are exactly the ones the caller allows.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/ops.h"
#include "core/tensor.h"
#include "kernels/common/checks.h"
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

}  // namespace
}  // namespace minidl
