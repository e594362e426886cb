// The emulated cuDNN graph API's fused batch-norm graphs, built through cudnn-frontend's builders
// exactly as a caller in kernels/cuda builds them (NHWC, f16 or f32 data, f32 per-channel tensors):
// scale-bias-ReLU-conv-genstats, the bn-finalize, dgrad + ReLU backward + batch-norm weight
// gradient, scale-bias-ReLU-wgrad, batch norm + add + ReLU and its backward. Each result is checked against an independent composition
// (the convolution written out, per-channel arithmetic, sums in double loops, the textbook batch-norm
// formulas with the running statistics' momentum). The rules are cudnn_fused_graph_rules_emu_test.cpp's.
#ifdef MINIDL_EMU_WITH_CUDNN_FRONTEND
#include "kernels/cuda/frontend.h"
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "tests/emu_libs/fused_graph_helpers.h"

namespace {

namespace emu = minidl::cuda::emu;
namespace fe = cudnn_frontend;
using namespace fused_test;   // NOLINT: the shared helpers

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

// A block's last batch norm in training, its residual add and ReLU: out = relu(bn(x) + residual).
TEST_P(FusedGraph, BnAddReluIsTheComposition) {
  const cudnnDataType_t dt = GetParam();
  Handle h;
  const std::vector<int64_t> xd{3, 8, 4, 5};
  const int64_t c = xd[1];
  const fe::Tensor x = tensor(X, xd, true, dt), res = tensor(DY, xd, true, dt), out = tensor(Y, xd, true, dt);
  const fe::Tensor bn = tensor(T1, xd, true, kF32, true), sum = tensor(T2, xd, true, kF32, true);
  const fe::Operation norm = fe::OperationBuilder(CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR)
                                 .setNormalizationMode(fe::NormMode_t::BATCH_NORM).setNormFwdPhase(fe::NormFwdPhase_t::TRAINING)
                                 .setxDesc(x).setyDesc(bn).setScaleAndBias(channel(S, c), channel(B, c))
                                 .setSavedMeanAndInvVar(channel(SAVED_M, c), channel(SAVED_IV, c))
                                 .setEpsilonTensor(by_value(EPS, kF32)).setExpDecayFactorTensor(by_value(MOMENTUM, kF32))
                                 .setPrevRunningMeanAndVar(channel(RM, c), channel(RV, c))
                                 .setNextRunningMeanAndVar(channel(NEXT_RM, c), channel(NEXT_RV, c)).build();
  const fe::Operation add = pointwise(CUDNN_POINTWISE_ADD, bn, &res, sum), relu = pointwise(CUDNN_POINTWISE_RELU_FWD, sum, nullptr, out);
  fe::ExecutionPlan plan = plan_of(h.get(), {&norm, &add, &relu});

  const auto cs = static_cast<size_t>(c);
  const std::vector<double> xv = rounded(wave(static_cast<size_t>(3 * 8 * 4 * 5), 0.4), xd, dt);
  const std::vector<double> rv = rounded(wave(xv.size(), 3.3), xd, dt);
  std::vector<float> scale = floats(wave(cs, 1.5)), bias = floats(wave(cs, 2.5)), rm(cs, 0.5f), rvar(cs, 2.0f);
  std::vector<float> mean(cs), inv(cs), next_rm(cs), next_rv(cs);
  float eps = 1e-5f, momentum = 0.25f;
  std::vector<unsigned char> bx, br, bo;
  store(bx, xv, xd, true, dt);
  store(br, rv, xd, true, dt);
  store(bo, std::vector<double>(xv.size(), 0.0), xd, true, dt);
  ASSERT_EQ(execute(h.get(), plan, {{X, bx.data()}, {DY, br.data()}, {Y, bo.data()}, {S, scale.data()}, {B, bias.data()},
                                    {SAVED_M, mean.data()}, {SAVED_IV, inv.data()}, {EPS, &eps}, {MOMENTUM, &momentum},
                                    {RM, rm.data()}, {RV, rvar.data()}, {NEXT_RM, next_rm.data()}, {NEXT_RV, next_rv.data()}}),
            CUDNN_STATUS_SUCCESS)
      << emu::last_error_detail();

  const double per = static_cast<double>(xv.size() / cs);
  std::vector<double> mu(cs, 0.0), var(cs, 0.0), want(xv.size()), want_rm(cs), want_rv(cs), want_inv(cs);
  each_channel(xd, [&](size_t i, size_t ch) { mu[ch] += xv[i] / per; });
  each_channel(xd, [&](size_t i, size_t ch) { var[ch] += (xv[i] - mu[ch]) * (xv[i] - mu[ch]) / per; });
  for (size_t ch = 0; ch < cs; ++ch) {
    want_inv[ch] = 1 / std::sqrt(var[ch] + eps);
    want_rm[ch] = 0.75 * rm[ch] + 0.25 * mu[ch];
    want_rv[ch] = 0.75 * rvar[ch] + 0.25 * var[ch] * per / (per - 1);
  }
  each_channel(xd, [&](size_t i, size_t ch) {
    want[i] = std::max(0.0, (xv[i] - mu[ch]) * want_inv[ch] * scale[ch] + bias[ch] + rv[i]);
  });
  expect_near(load(bo, xd, true, dt), want, tol_of(dt), "out");
  expect_near(doubles(mean), mu, 1e-5, "saved mean");
  expect_near(doubles(inv), want_inv, 1e-5, "saved inverse std");
  expect_near(doubles(next_rm), want_rm, 1e-5, "running mean");
  expect_near(doubles(next_rv), want_rv, 1e-5, "running variance");
}

// Its backward: the ReLU's gradient against the stored output (kept: the residual's gradient),
// then the batch norm's backward.
TEST_P(FusedGraph, DreluDbnIsTheComposition) {
  const cudnnDataType_t dt = GetParam();
  Handle h;
  const std::vector<int64_t> xd{3, 8, 4, 5};
  const int64_t c = xd[1];
  const fe::Tensor dy = tensor(DY, xd, true, dt), y = tensor(Y, xd, true, dt), dr = tensor(T1, xd, true, dt),
                   x = tensor(X, xd, true, dt), dx = tensor(DX, xd, true, dt);
  const fe::Operation relu_bwd = fe::OperationBuilder(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)
                                     .setdyDesc(dy).setxDesc(y).setdxDesc(dr).setpwDesc(pw(CUDNN_POINTWISE_RELU_BWD)).build();
  const fe::Operation dbn = fe::OperationBuilder(CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR)
                                .setNormalizationMode(fe::NormMode_t::BATCH_NORM).setxDesc(x).setdyDesc(dr)
                                .setScale(channel(S, c)).setSavedMeanAndInvVar(channel(M, c), channel(V, c))
                                .setDScaleAndDBias(channel(DS, c), channel(DB, c)).setdxDesc(dx).build();
  fe::ExecutionPlan plan = plan_of(h.get(), {&relu_bwd, &dbn});

  const auto cs = static_cast<size_t>(c);
  const size_t n = static_cast<size_t>(3 * 8 * 4 * 5);
  const std::vector<double> dyv = rounded(wave(n, 0.2), xd, dt), yv = rounded(wave(n, 1.2), xd, dt),
                            xv = rounded(wave(n, 2.2), xd, dt);
  std::vector<float> scale = floats(wave(cs, 3.5)), mean = floats(wave(cs, 4.5)), inv(cs, 1.25f), ds(cs), db(cs);
  std::vector<unsigned char> bdy, by, bdr, bx, bdx;
  store(bdy, dyv, xd, true, dt);
  store(by, yv, xd, true, dt);
  store(bx, xv, xd, true, dt);
  store(bdr, std::vector<double>(n, 0.0), xd, true, dt);
  store(bdx, std::vector<double>(n, 0.0), xd, true, dt);
  ASSERT_EQ(execute(h.get(), plan, {{DY, bdy.data()}, {Y, by.data()}, {T1, bdr.data()}, {X, bx.data()}, {DX, bdx.data()},
                                    {S, scale.data()}, {M, mean.data()}, {V, inv.data()}, {DS, ds.data()}, {DB, db.data()}}),
            CUDNN_STATUS_SUCCESS)
      << emu::last_error_detail();

  const double per = static_cast<double>(n / cs);
  std::vector<double> g(n), xhat(n), want_ds(cs, 0.0), want_db(cs, 0.0), want_dx(n);
  each_channel(xd, [&](size_t i, size_t ch) {
    g[i] = yv[i] > 0 ? dyv[i] : 0.0;
    xhat[i] = (xv[i] - mean[ch]) * inv[ch];
    want_db[ch] += g[i];
    want_ds[ch] += g[i] * xhat[i];
  });
  each_channel(xd, [&](size_t i, size_t ch) {
    want_dx[i] = scale[ch] * inv[ch] * (g[i] - want_db[ch] / per - xhat[i] * want_ds[ch] / per);
  });
  expect_near(load(bdr, xd, true, dt), g, tol_of(dt), "relu gradient");
  expect_near(doubles(db), want_db, tol_of(dt), "dbias");
  expect_near(doubles(ds), want_ds, tol_of(dt), "dscale");
  expect_near(load(bdx, xd, true, dt), want_dx, tol_of(dt), "dx");
}

INSTANTIATE_TEST_SUITE_P(Types, FusedGraph, ::testing::Values(CUDNN_DATA_HALF, CUDNN_DATA_FLOAT),
                         [](const ::testing::TestParamInfo<cudnnDataType_t>& i) {
                           return std::string(i.param == CUDNN_DATA_HALF ? "f16" : "f32");
                         });

}  // namespace
#endif  // MINIDL_EMU_WITH_CUDNN_FRONTEND
