// The emulated cuDNN graph API's fused batch-norm graphs, built through cudnn-frontend's builders
// exactly as a caller in kernels/cuda builds them (NHWC, f16 or f32 data, f32 per-channel tensors):
// scale-bias-ReLU-conv-genstats, the bn-finalize, dgrad + ReLU backward + batch-norm weight
// gradient, scale-bias-ReLU-wgrad. Each result is checked against an independent composition
// (the convolution written out, per-channel arithmetic, sums in double loops, the textbook batch-norm
// formulas with the running statistics' momentum); then the rules: shapes, patterns, bindings.
#ifdef MINIDL_EMU_WITH_CUDNN_FRONTEND
#include <cudnn_frontend.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "tests/emu_libs/backend_test_helpers.h"

namespace {

namespace emu = minidl::cuda::emu;
namespace fe = cudnn_frontend;
using namespace backend_test;   // NOLINT: the shared helpers

constexpr cudnnDataType_t kF32 = CUDNN_DATA_FLOAT;

// A per-channel f32 tensor [1, C, 1, 1] (scale, bias, mean, statistics).
fe::Tensor channel(int64_t uid, int64_t c) { return tensor(uid, {1, c, 1, 1}, true, kF32); }

// A scalar passed by value: the variant pack binds a host pointer, read at the execute.
fe::Tensor by_value(int64_t uid, cudnnDataType_t dt) {
  const int64_t one[4] = {1, 1, 1, 1};
  return fe::TensorBuilder().setDim(4, one).setStride(4, one).setId(uid).setAlignment(alignof(float)).setDataType(dt)
      .setByValue(true).build();
}

fe::PointWiseDesc pw(cudnnPointwiseMode_t mode) {
  return fe::PointWiseDescBuilder().setMode(mode).setComputeType(kF32).build();
}

// y = mode(x, b), or y = mode(x) without b.
fe::Operation pointwise(cudnnPointwiseMode_t mode, const fe::Tensor& x, const fe::Tensor* b, const fe::Tensor& y) {
  fe::OperationBuilder ob(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  ob.setxDesc(x).setyDesc(y).setpwDesc(pw(mode));
  if (b != nullptr) ob.setbDesc(*b);
  return ob.build();
}

fe::ConvDesc conv_desc(const Geo& g) {
  const int64_t pad[2] = {g.pad, g.pad}, stride[2] = {g.stride, g.stride}, dil[2] = {g.dil, g.dil};
  return fe::ConvDescBuilder().setComputeType(kF32).setMathMode(CUDNN_CROSS_CORRELATION).setSpatialDimCount(2)
      .setSpatialStride(2, stride).setPrePadding(2, pad).setPostPadding(2, pad).setDilation(2, dil).build();
}

fe::ExecutionPlan plan_of(cudnnHandle_t h, const std::vector<const fe::Operation*>& ops) {
  std::vector<const fe::Operation*> v = ops;
  fe::OperationGraph og = fe::OperationGraphBuilder().setHandle(h).setOperationGraph(v.size(), v.data()).build();
  fe::EngineHeuristics heur = fe::EngineHeuristicsBuilder().setOperationGraph(og).setHeurMode(CUDNN_HEUR_MODE_A).build();
  auto& cfgs = heur.getEngineConfig(heur.getEngineConfigCount());
  EXPECT_EQ(cfgs.size(), 1u);
  return fe::ExecutionPlanBuilder().setHandle(h).setEngineConfig(cfgs.front(), og.getTag()).build();
}

// The status of planning ops (the heuristics' refusal shows here).
cudnnStatus_t plan_status(cudnnHandle_t h, const std::vector<const fe::Operation*>& ops) {
  try {
    plan_of(h, ops);
    return CUDNN_STATUS_SUCCESS;
  } catch (fe::cudnnException& e) {
    return e.getCudnnStatus();
  }
}

using Binds = std::vector<std::pair<int64_t, void*>>;

cudnnStatus_t execute(cudnnHandle_t h, fe::ExecutionPlan& plan, const Binds& binds) {
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
std::vector<double> rounded(const std::vector<double>& v, const std::vector<int64_t>& dims, cudnnDataType_t dt) {
  std::vector<unsigned char> tmp;
  store(tmp, v, dims, false, dt);
  return load(tmp, dims, false, dt);
}
std::vector<float> floats(const std::vector<double>& v) { return {v.begin(), v.end()}; }

// Per-channel values of an NCHW logical array, with the channel's index.
template <class F>
void each_channel(const std::vector<int64_t>& d, F&& f) {
  for (int64_t i = 0; i < d[0] * d[1] * d[2] * d[3]; ++i) f(static_cast<size_t>(i), static_cast<size_t>((i / (d[2] * d[3])) % d[1]));
}

double tol_of(cudnnDataType_t dt) { return dt == CUDNN_DATA_HALF ? 2e-2 : 1e-5; }

void expect_near(const std::vector<double>& got, const std::vector<double>& want, double tol, const char* what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i)
    ASSERT_NEAR(got[i], want[i], tol * (1 + std::abs(want[i]))) << what << "[" << i << "]";
}
template <class T>
std::vector<double> doubles(const std::vector<T>& v) { return {v.begin(), v.end()}; }

enum Uid : int64_t {
  X = 1, W, Y, DY, DX, DW, S, B, M, V, SUM, SQ, DS, DB, EQ_DY, EQ_X, EQ_B,
  RM, RV, NEXT_RM, NEXT_RV, SAVED_M, SAVED_IV, EPS, MOMENTUM, COUNT, T1 = 100, T2, T3, T4, T5
};

// The forward graph a caller builds: x * scale + bias, the activation (ReLU), the convolution into y,
// y's per-channel sum and sum of squares.
std::vector<fe::Operation> sbrcs(const Geo& g, cudnnDataType_t dt, cudnnPointwiseMode_t act = CUDNN_POINTWISE_RELU_FWD) {
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
std::vector<const fe::Operation*> ptrs(const std::vector<fe::Operation>& ops) {
  std::vector<const fe::Operation*> v;
  for (const fe::Operation& op : ops) v.push_back(&op);
  return v;
}

class FusedGraph : public ::testing::TestWithParam<cudnnDataType_t> {};

// Forward: y = conv(relu(x * scale + bias), w); sum and sum of squares of y per output channel.
TEST_P(FusedGraph, ScaleBiasReluConvGenstatsIsTheComposition) {
  const cudnnDataType_t dt = GetParam();
  Handle h;
  const Geo g{2, 8, 5, 5, 8, 3, 3, 1, 1, 1, 1, true};
  const std::vector<int64_t> xd{g.n, g.c, g.h, g.w}, wd{g.k, g.c, g.r, g.s}, yd{g.n, g.k, g.oh(), g.ow()};
  const std::vector<fe::Operation> ops = sbrcs(g, dt);
  fe::ExecutionPlan plan = plan_of(h.get(), ptrs(ops));

  const std::vector<double> xv = rounded(wave(static_cast<size_t>(g.n * g.c * g.h * g.w), 0.3), xd, dt);
  const std::vector<double> wv = rounded(wave(static_cast<size_t>(g.k * g.c * g.r * g.s), 1.1), wd, dt);
  std::vector<float> scale = floats(wave(static_cast<size_t>(g.c), 2.0)), bias = floats(wave(static_cast<size_t>(g.c), 5.0));
  std::vector<unsigned char> bx, bw, by;
  store(bx, xv, xd, true, dt);
  store(bw, wv, wd, true, dt);
  store(by, std::vector<double>(static_cast<size_t>(g.n * g.k * g.oh() * g.ow()), 0.0), yd, true, dt);
  std::vector<float> vsum(static_cast<size_t>(g.k)), vsq(static_cast<size_t>(g.k));
  ASSERT_EQ(execute(h.get(), plan, {{X, bx.data()}, {S, scale.data()}, {B, bias.data()}, {W, bw.data()}, {Y, by.data()},
                                    {SUM, vsum.data()}, {SQ, vsq.data()}}),
            CUDNN_STATUS_SUCCESS)
      << emu::last_error_detail();

  std::vector<double> act(xv.size());   // the composition: per-channel scale, bias, ReLU, then the convolution
  each_channel(xd, [&](size_t i, size_t c) { act[i] = std::max(0.0, xv[i] * scale[c] + bias[c]); });
  const std::vector<double> want = direct_forward(g, act, wv);
  expect_near(load(by, yd, true, dt), want, tol_of(dt), "y");
  std::vector<double> want_sum(static_cast<size_t>(g.k), 0.0), want_sq(static_cast<size_t>(g.k), 0.0);
  each_channel(yd, [&](size_t i, size_t c) {
    want_sum[c] += want[i];
    want_sq[c] += want[i] * want[i];
  });
  expect_near(doubles(vsum), want_sum, tol_of(dt), "sum");
  expect_near(doubles(vsq), want_sq, tol_of(dt), "sum of squares");
}

// Backward: dgrad, the ReLU's backward against the batch norm's output recomputed from its input
// (x - mean) * inv_std * scale + bias, and the batch norm's weight gradient with the coefficients of dx.
TEST_P(FusedGraph, DgradDreluDbnWeightIsTheComposition) {
  const cudnnDataType_t dt = GetParam();
  Handle h;
  const Geo g{2, 8, 5, 5, 8, 3, 3, 1, 1, 1, 1, true};
  const std::vector<int64_t> xd{g.n, g.c, g.h, g.w}, wd{g.k, g.c, g.r, g.s}, yd{g.n, g.k, g.oh(), g.ow()};
  const fe::Tensor dy = tensor(DY, yd, true, dt), w = tensor(W, wd, true, dt), x = tensor(X, xd, true, dt);
  const fe::Tensor m = channel(M, g.c), v = channel(V, g.c), s = channel(S, g.c), b = channel(B, g.c);
  const fe::Tensor dgrad = tensor(T1, xd, true, kF32, true), t2 = tensor(T2, xd, true, kF32, true),
                   t3 = tensor(T3, xd, true, kF32, true), t4 = tensor(T4, xd, true, kF32, true),
                   bn = tensor(T5, xd, true, kF32, true), drelu = tensor(DX, xd, true, dt);
  const fe::Tensor ds = channel(DS, g.c), db = channel(DB, g.c), eq_dy = channel(EQ_DY, g.c), eq_x = channel(EQ_X, g.c),
                   eq_b = channel(EQ_B, g.c);
  const fe::Operation conv = fe::OperationBuilder(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR)
                                 .setdxDesc(dgrad).setwDesc(w).setdyDesc(dy).setcDesc(conv_desc(g)).setAlpha(1.0f).setBeta(0.0f).build();
  const fe::Operation sub = pointwise(CUDNN_POINTWISE_SUB, x, &m, t2), norm = pointwise(CUDNN_POINTWISE_MUL, t2, &v, t3),
                      mul = pointwise(CUDNN_POINTWISE_MUL, t3, &s, t4), add = pointwise(CUDNN_POINTWISE_ADD, t4, &b, bn);
  const fe::Operation relu_bwd = fe::OperationBuilder(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)
                                     .setdyDesc(dgrad).setxDesc(bn).setdxDesc(drelu).setpwDesc(pw(CUDNN_POINTWISE_RELU_BWD)).build();
  const fe::Operation dbn = fe::OperationBuilder(CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR)
                                .setxDesc(x).setdyDesc(drelu).setSavedMeanAndInvVar(m, v).setScale(s)
                                .setDScaleAndDBias(ds, db).setEqScalesAndBias(eq_dy, eq_x, eq_b).setMathPrecision(kF32).build();
  fe::ExecutionPlan plan = plan_of(h.get(), {&conv, &sub, &norm, &mul, &add, &relu_bwd, &dbn});

  const std::vector<double> dyv = rounded(wave(static_cast<size_t>(g.n * g.k * g.oh() * g.ow()), 0.7), yd, dt);
  const std::vector<double> wv = rounded(wave(static_cast<size_t>(g.k * g.c * g.r * g.s), 1.9), wd, dt);
  const std::vector<double> xv = rounded(wave(static_cast<size_t>(g.n * g.c * g.h * g.w), 2.3), xd, dt);
  std::vector<float> mean = floats(wave(static_cast<size_t>(g.c), 3.0)), scale = floats(wave(static_cast<size_t>(g.c), 4.0)),
                     bias = floats(wave(static_cast<size_t>(g.c), 6.0)), inv(static_cast<size_t>(g.c));
  for (size_t c = 0; c < inv.size(); ++c) inv[c] = 1.5f + 0.1f * static_cast<float>(c);
  std::vector<unsigned char> bdy, bw, bx, bdx;
  store(bdy, dyv, yd, true, dt);
  store(bw, wv, wd, true, dt);
  store(bx, xv, xd, true, dt);
  store(bdx, std::vector<double>(xv.size(), 0.0), xd, true, dt);
  const auto cs = static_cast<size_t>(g.c);
  std::vector<float> vds(cs), vdb(cs), veq_dy(cs), veq_x(cs), veq_b(cs);
  ASSERT_EQ(execute(h.get(), plan, {{DY, bdy.data()}, {W, bw.data()}, {X, bx.data()}, {M, mean.data()}, {V, inv.data()},
                                    {S, scale.data()}, {B, bias.data()}, {DX, bdx.data()}, {DS, vds.data()},
                                    {DB, vdb.data()}, {EQ_DY, veq_dy.data()}, {EQ_X, veq_x.data()}, {EQ_B, veq_b.data()}}),
            CUDNN_STATUS_SUCCESS)
      << emu::last_error_detail();

  const std::vector<double> dgv = direct_dgrad(g, dyv, wv);
  std::vector<double> dr(xv.size()), xhat(xv.size());
  std::vector<double> want_ds(cs, 0.0), want_db(cs, 0.0);
  each_channel(xd, [&](size_t i, size_t c) {
    xhat[i] = (xv[i] - mean[c]) * inv[c];
    dr[i] = xhat[i] * scale[c] + bias[c] > 0 ? dgv[i] : 0.0;
    want_db[c] += dr[i];
    want_ds[c] += dr[i] * xhat[i];
  });
  expect_near(load(bdx, xd, true, dt), dr, tol_of(dt), "relu gradient");
  expect_near(doubles(vdb), want_db, tol_of(dt), "dbias");
  expect_near(doubles(vds), want_ds, tol_of(dt), "dscale");
  // The coefficients give the textbook data gradient scale * inv_std * (dy - mean(dy) - x_hat * mean(dy * x_hat)).
  const double per = static_cast<double>(g.n * g.h * g.w);
  std::vector<double> dx(xv.size()), want_dx(xv.size());
  each_channel(xd, [&](size_t i, size_t c) {
    dx[i] = veq_dy[c] * dr[i] + veq_x[c] * xv[i] + veq_b[c];
    want_dx[i] = scale[c] * inv[c] * (dr[i] - want_db[c] / per - xhat[i] * want_ds[c] / per);
  });
  expect_near(dx, want_dx, 10 * tol_of(dt), "dx from the coefficients");
}

// The filter gradient reads its input through scale, bias and ReLU.
TEST_P(FusedGraph, ScaleBiasReluWgradIsTheComposition) {
  const cudnnDataType_t dt = GetParam();
  Handle h;
  const Geo g{2, 8, 6, 6, 8, 3, 3, 1, 2, 1, 1, true};
  const std::vector<int64_t> xd{g.n, g.c, g.h, g.w}, wd{g.k, g.c, g.r, g.s}, yd{g.n, g.k, g.oh(), g.ow()};
  const fe::Tensor x = tensor(X, xd, true, dt), s = channel(S, g.c), b = channel(B, g.c), dy = tensor(DY, yd, true, dt),
                   dw = tensor(DW, wd, true, dt);
  const fe::Tensor t1 = tensor(T1, xd, true, kF32, true), t2 = tensor(T2, xd, true, kF32, true),
                   t3 = tensor(T3, xd, true, kF32, true);
  const fe::Operation mul = pointwise(CUDNN_POINTWISE_MUL, x, &s, t1), add = pointwise(CUDNN_POINTWISE_ADD, t1, &b, t2),
                      relu = pointwise(CUDNN_POINTWISE_RELU_FWD, t2, nullptr, t3);
  const fe::Operation conv = fe::OperationBuilder(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR)
                                 .setxDesc(t3).setdwDesc(dw).setdyDesc(dy).setcDesc(conv_desc(g)).setAlpha(1.0f).setBeta(0.0f).build();
  fe::ExecutionPlan plan = plan_of(h.get(), {&mul, &add, &relu, &conv});

  const std::vector<double> xv = rounded(wave(static_cast<size_t>(g.n * g.c * g.h * g.w), 0.9), xd, dt);
  const std::vector<double> dyv = rounded(wave(static_cast<size_t>(g.n * g.k * g.oh() * g.ow()), 1.3), yd, dt);
  std::vector<float> scale = floats(wave(static_cast<size_t>(g.c), 7.0)), bias = floats(wave(static_cast<size_t>(g.c), 8.0));
  std::vector<unsigned char> bx, bdy, bdw;
  store(bx, xv, xd, true, dt);
  store(bdy, dyv, yd, true, dt);
  store(bdw, std::vector<double>(static_cast<size_t>(g.k * g.c * g.r * g.s), 0.0), wd, true, dt);
  ASSERT_EQ(execute(h.get(), plan, {{X, bx.data()}, {S, scale.data()}, {B, bias.data()}, {DY, bdy.data()}, {DW, bdw.data()}}),
            CUDNN_STATUS_SUCCESS)
      << emu::last_error_detail();
  std::vector<double> act(xv.size());
  each_channel(xd, [&](size_t i, size_t c) { act[i] = std::max(0.0, xv[i] * scale[c] + bias[c]); });
  expect_near(load(bdw, wd, true, dt), direct_wgrad(g, act, dyv), 2 * tol_of(dt), "dw");
}

INSTANTIATE_TEST_SUITE_P(Types, FusedGraph, ::testing::Values(CUDNN_DATA_HALF, CUDNN_DATA_FLOAT),
                         [](const ::testing::TestParamInfo<cudnnDataType_t>& i) {
                           return std::string(i.param == CUDNN_DATA_HALF ? "f16" : "f32");
                         });

// The finalize a caller builds after the forward graph: the sums, scale and bias in; the equivalent
// scale and bias of the next graph, the saved mean and inverse standard deviation, and the running
// statistics' update out; epsilon, momentum (f32) and the per-channel count (i64) by value.
fe::Operation bn_finalize(int64_t c, bool running = true) {
  fe::OperationBuilder ob(CUDNN_BACKEND_OPERATION_BN_FINALIZE_STATISTICS_DESCRIPTOR);
  ob.setComputeType(kF32).setBNFinalizeMode(CUDNN_BN_FINALIZE_STATISTICS_TRAINING)
      .setSumDesc(channel(SUM, c)).setSqSumDesc(channel(SQ, c)).setScaleAndBias(channel(S, c), channel(B, c))
      .setEqScaleAndBias(channel(EQ_DY, c), channel(EQ_B, c)).setSavedMeanAndInvVar(channel(SAVED_M, c), channel(SAVED_IV, c))
      .setEpsilonTensor(by_value(EPS, kF32)).setAccumCountTensor(by_value(COUNT, CUDNN_DATA_INT64));
  if (running) {
    ob.setPrevRunningMeanAndVar(channel(RM, c), channel(RV, c)).setNextRunningMeanAndVar(channel(NEXT_RM, c), channel(NEXT_RV, c))
        .setExpDecayFactorTensor(by_value(MOMENTUM, kF32));
  }
  return ob.build();
}

// Three training steps: each step's sums give the textbook mean, biased variance, inverse standard
// deviation and equivalent scale and bias, and the running statistics move by the momentum toward
// the mean and the unbiased variance.
TEST(FusedGraphFinalize, BnFinalizeIsTheTextbookFormulas) {
  Handle h;
  const int64_t c = 6, count = 50;
  const fe::Operation fin = bn_finalize(c);
  fe::ExecutionPlan plan = plan_of(h.get(), {&fin});
  const auto cs = static_cast<size_t>(c);
  std::vector<float> scale = floats(wave(cs, 1.0)), bias = floats(wave(cs, 2.0)), rm(cs, 0.0f), rv(cs, 1.0f);
  std::vector<double> want_rm(cs, 0.0), want_rv(cs, 1.0);
  float eps = 1e-3f, momentum = 0.1f;
  int64_t n = count;
  for (int step = 0; step < 3; ++step) {
    const std::vector<double> data = wave(cs * count, 0.5 + step);   // [count][c]
    std::vector<float> sum(cs, 0.0f), sq(cs, 0.0f), eq_scale(cs), eq_bias(cs), next_rm(cs), next_rv(cs), mean(cs), inv(cs);
    std::vector<double> dsum(cs, 0.0), dsq(cs, 0.0);
    for (size_t i = 0; i < data.size(); ++i) {
      dsum[i % cs] += data[i] + step;
      dsq[i % cs] += (data[i] + step) * (data[i] + step);
    }
    for (size_t i = 0; i < cs; ++i) {
      sum[i] = static_cast<float>(dsum[i]);
      sq[i] = static_cast<float>(dsq[i]);
    }
    ASSERT_EQ(execute(h.get(), plan, {{SUM, sum.data()}, {SQ, sq.data()}, {S, scale.data()}, {B, bias.data()},
                                      {EQ_DY, eq_scale.data()}, {EQ_B, eq_bias.data()}, {SAVED_M, mean.data()},
                                      {SAVED_IV, inv.data()}, {EPS, &eps}, {COUNT, &n}, {RM, rm.data()}, {RV, rv.data()},
                                      {NEXT_RM, next_rm.data()}, {NEXT_RV, next_rv.data()}, {MOMENTUM, &momentum}}),
              CUDNN_STATUS_SUCCESS)
        << emu::last_error_detail();
    for (size_t i = 0; i < cs; ++i) {
      const double mu = sum[i] / double(count), var = sq[i] / double(count) - mu * mu, is = 1 / std::sqrt(var + eps);
      EXPECT_NEAR(mean[i], mu, 1e-5) << "step " << step << " channel " << i;
      EXPECT_NEAR(inv[i], is, 1e-4 * is);
      EXPECT_NEAR(eq_scale[i], scale[i] * is, 1e-4 * is);
      EXPECT_NEAR(eq_bias[i], bias[i] - mu * scale[i] * is, 1e-4 * (1 + std::abs(mu * is)));
      want_rm[i] = 0.9 * want_rm[i] + 0.1 * mu;
      want_rv[i] = 0.9 * want_rv[i] + 0.1 * var * count / (count - 1.0);
      EXPECT_NEAR(next_rm[i], want_rm[i], 1e-5 * (1 + std::abs(want_rm[i])));
      EXPECT_NEAR(next_rv[i], want_rv[i], 1e-5 * (1 + want_rv[i]));
    }
    rm = next_rm;
    rv = next_rv;
  }
}

// ---- the rules ----

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
