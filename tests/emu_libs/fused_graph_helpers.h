// What the tests of the emulated fused graphs share (cudnn_fused_graph_emu_test.cpp,
// cudnn_fused_graph_rules_emu_test.cpp): per-channel and by-value tensors, pointwise operations,
// planning a graph through the heuristics and executing it with a variant pack, as a caller in
// kernels/cuda does through cudnn-frontend's builders; the forward graph every rule starts from;
// the unique ids the graphs use; comparisons.
#pragma once
#include "kernels/cuda/frontend.h"
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <utility>
#include <vector>

#include "tests/emu_libs/backend_test_helpers.h"

namespace fused_test {

namespace fe = cudnn_frontend;
using namespace backend_test;   // NOLINT: the shared helpers

inline constexpr cudnnDataType_t kF32 = CUDNN_DATA_FLOAT;

// A per-channel f32 tensor [1, C, 1, 1] (scale, bias, mean, statistics).
inline fe::Tensor channel(int64_t uid, int64_t c) { return tensor(uid, {1, c, 1, 1}, true, kF32); }

// A scalar passed by value: the variant pack binds a host pointer, read at the execute.
inline fe::Tensor by_value(int64_t uid, cudnnDataType_t dt) {
  const int64_t one[4] = {1, 1, 1, 1};
  return fe::TensorBuilder().setDim(4, one).setStride(4, one).setId(uid).setAlignment(alignof(float)).setDataType(dt)
      .setByValue(true).build();
}

inline fe::PointWiseDesc pw(cudnnPointwiseMode_t mode) {
  return fe::PointWiseDescBuilder().setMode(mode).setComputeType(kF32).build();
}

// y = mode(x, b), or y = mode(x) without b.
inline fe::Operation pointwise(cudnnPointwiseMode_t mode, const fe::Tensor& x, const fe::Tensor* b, const fe::Tensor& y) {
  fe::OperationBuilder ob(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  ob.setxDesc(x).setyDesc(y).setpwDesc(pw(mode));
  if (b != nullptr) ob.setbDesc(*b);
  return ob.build();
}

inline fe::ConvDesc conv_desc(const Geo& g) {
  const int64_t pad[2] = {g.pad, g.pad}, stride[2] = {g.stride, g.stride}, dil[2] = {g.dil, g.dil};
  return fe::ConvDescBuilder().setComputeType(kF32).setMathMode(CUDNN_CROSS_CORRELATION).setSpatialDimCount(2)
      .setSpatialStride(2, stride).setPrePadding(2, pad).setPostPadding(2, pad).setDilation(2, dil).build();
}

inline fe::ExecutionPlan plan_of(cudnnHandle_t h, const std::vector<const fe::Operation*>& ops) {
  std::vector<const fe::Operation*> v = ops;
  fe::OperationGraph og = fe::OperationGraphBuilder().setHandle(h).setOperationGraph(v.size(), v.data()).build();
  fe::EngineHeuristics heur = fe::EngineHeuristicsBuilder().setOperationGraph(og).setHeurMode(CUDNN_HEUR_MODE_A).build();
  auto& cfgs = heur.getEngineConfig(heur.getEngineConfigCount());
  EXPECT_EQ(cfgs.size(), 1u);
  return fe::ExecutionPlanBuilder().setHandle(h).setEngineConfig(cfgs.front(), og.getTag()).build();
}

// The status of planning ops (the heuristics' refusal shows here).
inline cudnnStatus_t plan_status(cudnnHandle_t h, const std::vector<const fe::Operation*>& ops) {
  try {
    plan_of(h, ops);
    return CUDNN_STATUS_SUCCESS;
  } catch (fe::cudnnException& e) {
    return e.getCudnnStatus();
  }
}

using Binds = std::vector<std::pair<int64_t, void*>>;

inline cudnnStatus_t execute(cudnnHandle_t h, fe::ExecutionPlan& plan, const Binds& binds) {
  std::vector<unsigned char> ws(static_cast<size_t>(plan.getWorkspaceSize()) + 16, 0);
  std::vector<int64_t> uids;
  std::vector<void*> ptrs;
  for (const auto& [u, p] : binds) {
    uids.push_back(u);
    ptrs.push_back(p);
  }
  auto pack = fe::VariantPackBuilder().setWorkspacePointer(ws.data()).setDataPointers(ptrs.size(), ptrs.data())
                  .setUids(uids.size(), uids.data()).build();
  return cudnnBackendExecute(h, plan.get_raw_desc(), pack.get_raw_desc());
}

// Data rounded to what a tensor of dt holds.
inline std::vector<double> rounded(const std::vector<double>& v, const std::vector<int64_t>& dims, cudnnDataType_t dt) {
  std::vector<unsigned char> tmp;
  store(tmp, v, dims, false, dt);
  return load(tmp, dims, false, dt);
}
inline std::vector<float> floats(const std::vector<double>& v) { return {v.begin(), v.end()}; }

// Per-channel values of an NCHW logical array, with the channel's index.
template <class F>
inline void each_channel(const std::vector<int64_t>& d, F&& f) {
  for (int64_t i = 0; i < d[0] * d[1] * d[2] * d[3]; ++i) f(static_cast<size_t>(i), static_cast<size_t>((i / (d[2] * d[3])) % d[1]));
}

inline double tol_of(cudnnDataType_t dt) { return dt == CUDNN_DATA_HALF ? 2e-2 : 1e-5; }

inline void expect_near(const std::vector<double>& got, const std::vector<double>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << what << "[" << i << "]";
}
template <class T>
inline std::vector<double> doubles(const std::vector<T>& v) { return {v.begin(), v.end()}; }

enum Uid : int64_t {
  X = 1, W, Y, DY, DX, DW, S, B, M, V, SUM, SQ, DS, DB, EQ_DY, EQ_X, EQ_B,
  RM, RV, NEXT_RM, NEXT_RV, SAVED_M, SAVED_IV, EPS, MOMENTUM, COUNT, T1 = 100, T2, T3, T4, T5
};

// The forward graph a caller builds: x * scale + bias, the activation (ReLU), the convolution into y,
// y's per-channel sum and sum of squares.
inline std::vector<fe::Operation> sbrcs(const Geo& g, cudnnDataType_t dt, cudnnPointwiseMode_t act = CUDNN_POINTWISE_RELU_FWD) {
  const std::vector<int64_t> xd{g.n, g.c, g.h, g.w}, wd{g.k, g.c, g.r, g.s}, yd{g.n, g.k, g.oh(), g.ow()};
  const fe::Tensor x = tensor(X, xd, g.nhwc, dt), s = channel(S, g.c), b = channel(B, g.c);
  const fe::Tensor t1 = tensor(T1, xd, g.nhwc, kF32, true), t2 = tensor(T2, xd, g.nhwc, kF32, true),
                   t3 = tensor(T3, xd, g.nhwc, kF32, true);
  const fe::Tensor w = tensor(W, wd, g.nhwc, dt), y = tensor(Y, yd, g.nhwc, dt), sum = channel(SUM, g.k),
                   sq = channel(SQ, g.k);
  std::vector<fe::Operation> ops;
  ops.push_back(pointwise(CUDNN_POINTWISE_MUL, x, &s, t1));
  ops.push_back(pointwise(CUDNN_POINTWISE_ADD, t1, &b, t2));
  ops.push_back(pointwise(act, t2, nullptr, t3));
  ops.push_back(fe::OperationBuilder(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR)
                    .setxDesc(t3).setwDesc(w).setyDesc(y).setcDesc(conv_desc(g)).setAlpha(1.0f).setBeta(0.0f).build());
  ops.push_back(fe::OperationBuilder(CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR)
                    .setxDesc(y).setSumDesc(sum).setSqSumDesc(sq).setGenStatsMode(CUDNN_GENSTATS_SUM_SQSUM)
                    .setMathPrecision(kF32).build());
  return ops;
}
inline std::vector<const fe::Operation*> ptrs(const std::vector<fe::Operation>& ops) {
  std::vector<const fe::Operation*> v;
  for (const fe::Operation& op : ops) v.push_back(&op);
  return v;
}

}  // namespace fused_test
