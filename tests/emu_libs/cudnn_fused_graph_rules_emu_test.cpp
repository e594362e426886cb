// The rules of the emulated cuDNN graph API's fused graphs, as real cuDNN checks them: per-channel
// shapes at the operation, the running statistics' operands together, graphs outside the fused
// patterns (or of layouts and types no fused engine runs) refused at the heuristics, and a variant
// pack that binds every stored tensor and nothing else.
#ifdef MINIDL_EMU_WITH_CUDNN_FRONTEND
#include "kernels/cuda/frontend.h"
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "tests/emu_libs/fused_graph_helpers.h"

namespace {

namespace emu = minidl::cuda::emu;
namespace fe = cudnn_frontend;
using namespace fused_test;   // NOLINT: the shared helpers

cudnnStatus_t build_status(const std::function<void()>& build) {
  try {
    build();
    return CUDNN_STATUS_SUCCESS;
  } catch (fe::cudnnException& e) {
    return e.getCudnnStatus();
  }
}

// Per-channel operands must match the data they apply to, as cuDNN checks at the operation.
TEST(FusedGraphRules, MismatchedShapesAreRefusedAtTheOperation) {
  const std::vector<int64_t> xd{2, 8, 4, 4};
  const fe::Tensor x = tensor(X, xd, true, CUDNN_DATA_HALF), wrong = channel(S, 6), t = tensor(T1, xd, true, kF32, true);
  EXPECT_EQ(build_status([&] { pointwise(CUDNN_POINTWISE_MUL, x, &wrong, t); }), CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH);
  EXPECT_EQ(build_status([&] {
              fe::OperationBuilder(CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR).setxDesc(x).setSumDesc(channel(SUM, 8))
                  .setSqSumDesc(wrong).setGenStatsMode(CUDNN_GENSTATS_SUM_SQSUM).setMathPrecision(kF32).build();
            }),
            CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH);
  EXPECT_EQ(build_status([&] {
              fe::OperationBuilder(CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR).setxDesc(x).setdyDesc(x)
                  .setSavedMeanAndInvVar(channel(M, 8), channel(V, 8)).setScale(wrong).setDScaleAndDBias(channel(DS, 8), channel(DB, 8))
                  .setEqScalesAndBias(channel(EQ_DY, 8), channel(EQ_X, 8), channel(EQ_B, 8)).setMathPrecision(kF32).build();
            }),
            CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH);
}

// The running statistics' update needs its five operands together.
TEST(FusedGraphRules, AHalfSetRunningUpdateIsRefused) {
  EXPECT_EQ(build_status([] {
              fe::OperationBuilder(CUDNN_BACKEND_OPERATION_BN_FINALIZE_STATISTICS_DESCRIPTOR).setComputeType(kF32)
                  .setBNFinalizeMode(CUDNN_BN_FINALIZE_STATISTICS_TRAINING).setSumDesc(channel(SUM, 4)).setSqSumDesc(channel(SQ, 4))
                  .setScaleAndBias(channel(S, 4), channel(B, 4)).setEqScaleAndBias(channel(EQ_DY, 4), channel(EQ_B, 4))
                  .setEpsilonTensor(by_value(EPS, kF32)).setAccumCountTensor(by_value(COUNT, CUDNN_DATA_INT64))
                  .setPrevRunningMeanAndVar(channel(RM, 4), channel(RV, 4)).build();
            }),
            CUDNN_STATUS_BAD_PARAM);
  EXPECT_NE(std::string(emu::last_error_detail()).find("2 of 5"), std::string::npos) << emu::last_error_detail();
}

// Graphs outside the fused patterns are refused at the heuristics, as cuDNN refuses a graph no
// engine fuses: another activation, a statistics operation without its convolution; a fused
// convolution stored NCHW is a pattern with no engine for its layout.
TEST(FusedGraphRules, OtherGraphsAreRefusedAtTheHeuristics) {
  Handle h;
  const Geo g{2, 8, 4, 4, 8, 3, 3, 1, 1, 1, 1, true};
  const std::vector<fe::Operation> tanh = sbrcs(g, CUDNN_DATA_HALF, CUDNN_POINTWISE_TANH_FWD);
  EXPECT_EQ(plan_status(h.get(), ptrs(tanh)), CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN);
  EXPECT_NE(std::string(emu::last_error_detail()).find("is not part of the scale_bias_relu_conv_genstats pattern"),
            std::string::npos)
      << emu::last_error_detail();
  EXPECT_EQ(plan_status(h.get(), {&tanh.back()}), CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN);   // gen-stats alone
  Geo nchw = g;
  nchw.nhwc = false;
  const std::vector<fe::Operation> planar = sbrcs(nchw, CUDNN_DATA_HALF);
  EXPECT_EQ(plan_status(h.get(), ptrs(planar)), CUDNN_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(plan_status(h.get(), ptrs(sbrcs(g, CUDNN_DATA_HALF))), CUDNN_STATUS_SUCCESS) << emu::last_error_detail();
  // A ReLU mask of BOOLEAN (bit-packed in cuDNN) before a batch norm's backward.
  const std::vector<int64_t> xd{2, 8, 4, 4};
  const fe::Tensor dy = tensor(DY, xd, true, CUDNN_DATA_HALF), mask = tensor(M, xd, true, CUDNN_DATA_BOOLEAN),
                   dr = tensor(T1, xd, true, kF32, true), x = tensor(X, xd, true, CUDNN_DATA_HALF),
                   dx = tensor(DX, xd, true, CUDNN_DATA_HALF);
  const fe::Operation masked = pointwise(CUDNN_POINTWISE_MUL, dy, &mask, dr);
  const fe::Operation dbn = fe::OperationBuilder(CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR)
                                .setNormalizationMode(fe::NormMode_t::BATCH_NORM).setxDesc(x).setdyDesc(dr)
                                .setScale(channel(S, 8)).setSavedMeanAndInvVar(channel(SAVED_M, 8), channel(V, 8))
                                .setDScaleAndDBias(channel(DS, 8), channel(DB, 8)).setdxDesc(dx).build();
  EXPECT_EQ(plan_status(h.get(), {&masked, &dbn}), CUDNN_STATUS_NOT_SUPPORTED);
}

// Every stored tensor bound, and nothing else: not a virtual one.
TEST(FusedGraphRules, ExecuteNeedsEveryStoredTensorAndNoVirtualOne) {
  Handle h;
  const Geo g{1, 8, 4, 4, 8, 3, 3, 1, 1, 1, 1, true};
  const std::vector<fe::Operation> ops = sbrcs(g, CUDNN_DATA_HALF);
  fe::ExecutionPlan plan = plan_of(h.get(), ptrs(ops));
  alignas(16) static unsigned char x[4096], w[4096], y[4096], ch[6][64];
  Binds all{{X, x}, {S, ch[0]}, {B, ch[1]}, {W, w}, {Y, y}, {SUM, ch[2]}, {SQ, ch[3]}};
  Binds no_sum(all.begin(), all.end() - 2);
  no_sum.push_back(all.back());
  EXPECT_EQ(execute(h.get(), plan, no_sum), CUDNN_STATUS_BAD_PARAM);
  EXPECT_NE(std::string(emu::last_error_detail()).find("no pointer to unique id"), std::string::npos);
  Binds with_virtual = all;
  with_virtual.emplace_back(T1, ch[4]);
  EXPECT_EQ(execute(h.get(), plan, with_virtual), CUDNN_STATUS_BAD_PARAM);
  Binds skewed = all;
  skewed[0].second = x + 2;
  EXPECT_EQ(execute(h.get(), plan, skewed), CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER);
  EXPECT_EQ(execute(h.get(), plan, all), CUDNN_STATUS_SUCCESS) << emu::last_error_detail();
}

}  // namespace
#endif  // MINIDL_EMU_WITH_CUDNN_FRONTEND
