// The cuDNN convolution stand-ins against a direct computation (forward as a written-out sum,
// backward-data and backward-filter through the adjoint identities), for strides, padding,
// dilation, groups, NHWC, the flipped CUDNN_CONVOLUTION mode, f16 and TF32; and the algorithm
// queries, workspace sizes and Find*Ex that conv.cu relies on (the rules and invalid calls:
// cudnn_conv_rules_emu_test.cpp).
#include <cudnn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/emu_libs/legacy_conv_helpers.h"

namespace {

using namespace legacy_conv;

TEST(CudnnConvEmu, ThreeDirectionsMatchDirectSumAndAdjointIdentities) {
  for (const Geo& g : kGeos) {
    SCOPED_TRACE(testing::Message() << "geometry " << g.n << "x" << g.c << "x" << g.h << "x" << g.w << " k " << g.k
                                    << " groups " << g.groups << " nhwc " << (g.fmt == CUDNN_TENSOR_NHWC));
    Descs d(g, CUDNN_DATA_DOUBLE, CUDNN_DATA_DOUBLE, CUDNN_DEFAULT_MATH);
    const auto x = fill(static_cast<size_t>(g.n * g.c * g.h * g.w), 0.3);
    const auto w = fill(static_cast<size_t>(g.k * (g.c / g.groups) * g.r * g.s), 1.1);
    const auto dy = fill(static_cast<size_t>(g.n * g.k * g.oh() * g.ow()), 2.9);
    const double one = 1, zero = 0;
    std::vector<double> y(dy.size(), std::nan("")), dx(x.size(), std::nan("")), dw(w.size(), std::nan(""));
    ASSERT_EQ(cudnnConvolutionForward(d.h, &one, d.x, x.data(), d.w, w.data(), d.conv,
                                      CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0, &zero, d.y, y.data()),
              CUDNN_STATUS_SUCCESS)
        << emu::last_error_detail();
    const auto want = direct_forward(g, x, w);
    for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], want[i], 1e-12) << i;
    ASSERT_EQ(cudnnConvolutionBackwardData(d.h, &one, d.w, w.data(), d.y, dy.data(), d.conv,
                                           CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, nullptr, 0, &zero, d.x, dx.data()),
              CUDNN_STATUS_SUCCESS)
        << emu::last_error_detail();
    ASSERT_EQ(cudnnConvolutionBackwardFilter(d.h, &one, d.x, x.data(), d.y, dy.data(), d.conv,
                                             CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0, nullptr, 0, &zero, d.w, dw.data()),
              CUDNN_STATUS_SUCCESS)
        << emu::last_error_detail();
    // <conv(x, w), dy> = <x, dconv/dx^T dy> = <w, dconv/dw^T dy>: the backward passes are the
    // forward's adjoints in each argument.
    const double ref = dot(want, dy);
    EXPECT_NEAR(dot(x, dx), ref, 1e-10);
    EXPECT_NEAR(dot(w, dw), ref, 1e-10);
    // beta = 1 accumulates, alpha scales.
    const double two = 2;
    ASSERT_EQ(cudnnConvolutionForward(d.h, &two, d.x, x.data(), d.w, w.data(), d.conv,
                                      CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0, &one, d.y, y.data()),
              CUDNN_STATUS_SUCCESS);
    for (size_t i = 0; i < y.size(); ++i) EXPECT_NEAR(y[i], 3 * want[i], 1e-12) << i;
  }
}

TEST(CudnnConvEmu, HalfRoundsOnceAndFloatDefaultMathRoundsToTf32) {
  namespace dt = emu::detail;
  const Geo g{1, 1, 1, 3, 1, 1, 3, 0, 1, 1, 1};   // a 1x3 dot product
  {
    Descs d(g, CUDNN_DATA_HALF, CUDNN_DATA_FLOAT, CUDNN_DEFAULT_MATH);
    const uint16_t tenth = dt::float_to_half_bits(0.1f), one_h = dt::float_to_half_bits(1.f);
    const std::vector<uint16_t> x(3, tenth), w(3, one_h);
    uint16_t y = 0;
    const float one = 1, zero = 0;
    ASSERT_EQ(cudnnConvolutionForward(d.h, &one, d.x, x.data(), d.w, w.data(), d.conv,
                                      CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0, &zero, d.y, &y),
              CUDNN_STATUS_SUCCESS)
        << emu::last_error_detail();
    EXPECT_EQ(y, dt::float_to_half_bits(static_cast<float>(3.0 * dt::half_bits_to_float(tenth))));
  }
  for (const auto math : {CUDNN_DEFAULT_MATH, CUDNN_FMA_MATH}) {
    Descs d(g, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, math);
    const float v = 1.f + std::ldexp(1.f, -12);   // exact in f32, 1 in TF32
    const std::vector<float> x = {v, 0.f, 0.f}, w = {1.f, 1.f, 1.f};
    float y = 0;
    const float one = 1, zero = 0;
    ASSERT_EQ(cudnnConvolutionForward(d.h, &one, d.x, x.data(), d.w, w.data(), d.conv,
                                      CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0, &zero, d.y, &y),
              CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(y, math == CUDNN_FMA_MATH ? v : 1.f);
  }
}

TEST(CudnnConvEmu, QueriesRankAlgorithmsAndExecutionEnforcesTheirWorkspace) {
  const Geo g{2, 4, 8, 8, 4, 3, 3, 1, 1, 1, 1};
  Descs d(g, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, CUDNN_DEFAULT_MATH);
  cudnnConvolutionFwdAlgoPerf_t perf[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
  int n = 0;
  ASSERT_EQ(cudnnGetConvolutionForwardAlgorithm_v7(d.h, d.x, d.w, d.conv, d.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n,
                                                   perf),
            CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(n, CUDNN_CONVOLUTION_FWD_ALGO_COUNT);
  bool seen_unsupported = false;
  const std::vector<float> x(static_cast<size_t>(g.n * g.c * g.h * g.w), 0.5f), w(static_cast<size_t>(g.k * g.c * 9), 0.25f);
  std::vector<float> y(static_cast<size_t>(g.n * g.k * g.oh() * g.ow()));
  const float one = 1, zero = 0;
  for (int i = 0; i < n; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) {
      seen_unsupported = true;
      // The unsupported ones come last, and executing one returns its status.
      EXPECT_NE(cudnnConvolutionForward(d.h, &one, d.x, x.data(), d.w, w.data(), d.conv, perf[i].algo, nullptr, 0,
                                        &zero, d.y, y.data()),
                CUDNN_STATUS_SUCCESS);
      continue;
    }
    EXPECT_FALSE(seen_unsupported) << "a supported algorithm after an unsupported one";
    size_t ws = 0;
    ASSERT_EQ(cudnnGetConvolutionForwardWorkspaceSize(d.h, d.x, d.w, d.conv, d.y, perf[i].algo, &ws),
              CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(ws, perf[i].memory);
    std::vector<unsigned char> buf(ws + 1);
    if (ws > 0) {
      EXPECT_EQ(cudnnConvolutionForward(d.h, &one, d.x, x.data(), d.w, w.data(), d.conv, perf[i].algo, buf.data(),
                                        ws - 1, &zero, d.y, y.data()),
                CUDNN_STATUS_BAD_PARAM)
          << "algo " << perf[i].algo;
    }
    ASSERT_EQ(cudnnConvolutionForward(d.h, &one, d.x, x.data(), d.w, w.data(), d.conv, perf[i].algo, buf.data(), ws,
                                      &zero, d.y, y.data()),
              CUDNN_STATUS_SUCCESS)
        << emu::last_error_detail();
    // Centre pixel: 4 channels x 9 taps x 0.5 x 0.25.
    EXPECT_FLOAT_EQ(y[static_cast<size_t>(3 * g.ow() + 3)], 4.5f);
  }
  EXPECT_TRUE(seen_unsupported);   // DIRECT is never supported
  // The workspace depends on the math type: FMA needs no padded index table.
  size_t ws_tc = 0, ws_fma = 0;
  ASSERT_EQ(cudnnGetConvolutionForwardWorkspaceSize(d.h, d.x, d.w, d.conv, d.y,
                                                    CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, &ws_tc),
            CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnSetConvolutionMathType(d.conv, CUDNN_FMA_MATH), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnGetConvolutionForwardWorkspaceSize(d.h, d.x, d.w, d.conv, d.y,
                                                    CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM, &ws_fma),
            CUDNN_STATUS_SUCCESS);
  EXPECT_LT(ws_fma, ws_tc);
  size_t ws = 0;
  EXPECT_EQ(cudnnGetConvolutionForwardWorkspaceSize(d.h, d.x, d.w, d.conv, d.y, CUDNN_CONVOLUTION_FWD_ALGO_DIRECT, &ws),
            CUDNN_STATUS_NOT_SUPPORTED);
  EXPECT_EQ(cudnnGetConvolutionForwardWorkspaceSize(d.h, d.x, d.w, d.conv, d.y,
                                                    static_cast<cudnnConvolutionFwdAlgo_t>(42), &ws),
            CUDNN_STATUS_BAD_PARAM);
}

TEST(CudnnConvEmu, FindExTimesWhatFitsTheWorkspaceAndWritesTheResult) {
  const Geo g{1, 2, 6, 6, 3, 3, 3, 1, 1, 1, 1};
  Descs d(g, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, CUDNN_FMA_MATH);
  const auto xd = fill(static_cast<size_t>(g.n * g.c * g.h * g.w), 0.2), wd = fill(static_cast<size_t>(g.k * g.c * 9), 0.9);
  const std::vector<float> x(xd.begin(), xd.end()), w(wd.begin(), wd.end());
  std::vector<float> dx(x.size(), -1.f), dy(static_cast<size_t>(g.n * g.k * g.oh() * g.ow()));
  for (size_t i = 0; i < dy.size(); ++i) dy[i] = static_cast<float>(i % 5) - 2.f;
  cudnnConvolutionBwdDataAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
  int n = 0;
  std::vector<unsigned char> ws(64);   // small: the FFT algorithms need more
  ASSERT_EQ(cudnnFindConvolutionBackwardDataAlgorithmEx(d.h, d.w, w.data(), d.y, dy.data(), d.conv, d.x, dx.data(),
                                                        CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, perf, ws.data(),
                                                        ws.size()),
            CUDNN_STATUS_SUCCESS)
      << emu::last_error_detail();
  ASSERT_EQ(n, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT);
  int ok = 0;
  for (int i = 0; i < n; ++i) {
    if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
    ++ok;
    EXPECT_EQ(i + 1, ok) << "successful results come first";
    EXPECT_LE(perf[i].memory, ws.size());
    EXPECT_GE(perf[i].time, 0.f);
    if (i > 0) {
      EXPECT_LE(perf[i - 1].time, perf[i].time);
    }
  }
  EXPECT_GE(ok, 1);
  EXPECT_LT(ok, n);
  // dx holds the backward-data result: compare with a run of one algorithm.
  std::vector<float> ref(x.size());
  const float one = 1, zero = 0;
  ASSERT_EQ(cudnnConvolutionBackwardData(d.h, &one, d.w, w.data(), d.y, dy.data(), d.conv,
                                         CUDNN_CONVOLUTION_BWD_DATA_ALGO_0, nullptr, 0, &zero, d.x, ref.data()),
            CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(dx, ref);
  EXPECT_EQ(cudnnFindConvolutionBackwardDataAlgorithmEx(d.h, d.w, w.data(), d.y, dy.data(), d.conv, d.x, dx.data(), 0,
                                                        &n, perf, ws.data(), ws.size()),
            CUDNN_STATUS_BAD_PARAM);
}

TEST(CudnnConvEmu, StridedTensorsReadAndWriteOnlyTheirElements) {
  // x and y as views with padded rows and a padded batch (cudnnSetTensor4dDescriptorEx), against
  // the same convolution on packed tensors.
  const Geo g{2, 2, 4, 5, 3, 3, 3, 1, 1, 1, 1};
  Descs packed(g, CUDNN_DATA_DOUBLE, CUDNN_DATA_DOUBLE, CUDNN_DEFAULT_MATH);
  const int xhs = g.w + 3, xcs = xhs * g.h, xns = xcs * g.c + 7;
  const int yhs = g.ow() + 2, ycs = yhs * g.oh(), yns = ycs * g.k + 1;
  Descs view(g, CUDNN_DATA_DOUBLE, CUDNN_DATA_DOUBLE, CUDNN_DEFAULT_MATH);
  ASSERT_EQ(cudnnSetTensor4dDescriptorEx(view.x, CUDNN_DATA_DOUBLE, g.n, g.c, g.h, g.w, xns, xcs, xhs, 1),
            CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnSetTensor4dDescriptorEx(view.y, CUDNN_DATA_DOUBLE, g.n, g.k, g.oh(), g.ow(), yns, ycs, yhs, 1),
            CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(cudnnSetTensor4dDescriptorEx(view.y, CUDNN_DATA_DOUBLE, g.n, g.k, g.oh(), g.ow(), yns, ycs, 0, 1),
            CUDNN_STATUS_BAD_PARAM);
  const auto x = fill(static_cast<size_t>(g.n * g.c * g.h * g.w), 0.4), w = fill(static_cast<size_t>(g.k * g.c * 9), 1.7);
  std::vector<double> xv(static_cast<size_t>(xns * g.n), 1e30);
  for (int n = 0; n < g.n; ++n)
    for (int c = 0; c < g.c; ++c)
      for (int h = 0; h < g.h; ++h)
        for (int j = 0; j < g.w; ++j)
          xv[static_cast<size_t>(n * xns + c * xcs + h * xhs + j)] = x[static_cast<size_t>(((n * g.c + c) * g.h + h) * g.w + j)];
  const double one = 1, zero = 0;
  std::vector<double> y(static_cast<size_t>(g.n * g.k * g.oh() * g.ow())), yv(static_cast<size_t>(yns * g.n), -5.0);
  ASSERT_EQ(cudnnConvolutionForward(packed.h, &one, packed.x, x.data(), packed.w, w.data(), packed.conv,
                                    CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0, &zero, packed.y, y.data()),
            CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnConvolutionForward(view.h, &one, view.x, xv.data(), view.w, w.data(), view.conv,
                                    CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, nullptr, 0, &zero, view.y, yv.data()),
            CUDNN_STATUS_SUCCESS)
      << emu::last_error_detail();
  size_t seen = 0;
  for (size_t i = 0; i < yv.size(); ++i) {
    const int n = static_cast<int>(i) / yns, rem = static_cast<int>(i) % yns;
    const int k = rem / ycs, i2 = rem % ycs / yhs, j = rem % yhs;
    if (k < g.k && i2 < g.oh() && j < g.ow()) {
      EXPECT_EQ(yv[i], y[static_cast<size_t>(((n * g.k + k) * g.oh() + i2) * g.ow() + j)]) << i;
      ++seen;
    } else {
      EXPECT_EQ(yv[i], -5.0) << "padding element " << i << " written";
    }
  }
  EXPECT_EQ(seen, y.size());
  cudaStream_t s = reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(1));
  ASSERT_EQ(cudnnGetStream(view.h, &s), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(s, nullptr);
}

// conv.cu's sequence for one direction: the _v7 ranking, then per candidate the math type it
// reported, the workspace query under it, and the call with exactly that workspace. The
// workspace the ranking reports must be the one the query gives, and every candidate must run
// and agree with the others.
TEST(CudnnConvEmu, TheBackendsHeuristicSequenceRunsEveryCandidate) {
  const Geo g{2, 3, 6, 6, 4, 3, 3, 1, 1, 1, 1};
  for (const auto math : {CUDNN_DEFAULT_MATH, CUDNN_FMA_MATH}) {
    Descs d(g, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, math);
    const auto xd = fill(static_cast<size_t>(g.n * g.c * g.h * g.w), 0.5);
    const auto dyd = fill(static_cast<size_t>(g.n * g.k * g.oh() * g.ow()), 1.5);
    const std::vector<float> x(xd.begin(), xd.end()), dy(dyd.begin(), dyd.end());
    cudnnConvolutionBwdFilterAlgoPerf_t perf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    int n = 0;
    ASSERT_EQ(cudnnGetConvolutionBackwardFilterAlgorithm_v7(d.h, d.x, d.y, d.conv, d.w,
                                                            CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, perf),
              CUDNN_STATUS_SUCCESS);
    std::vector<float> first;
    int ran = 0;
    for (int i = 0; i < n; ++i) {
      if (perf[i].status != CUDNN_STATUS_SUCCESS) continue;
      EXPECT_EQ(perf[i].mathType, math == CUDNN_FMA_MATH ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH);
      ASSERT_EQ(cudnnSetConvolutionMathType(d.conv, perf[i].mathType), CUDNN_STATUS_SUCCESS);
      size_t ws = 0;
      ASSERT_EQ(cudnnGetConvolutionBackwardFilterWorkspaceSize(d.h, d.x, d.y, d.conv, d.w, perf[i].algo, &ws),
                CUDNN_STATUS_SUCCESS);
      EXPECT_EQ(ws, perf[i].memory) << "algo " << perf[i].algo;
      std::vector<unsigned char> buf(ws);
      std::vector<float> dw(static_cast<size_t>(g.k * g.c * 9));
      const float one = 1, zero = 0;
      ASSERT_EQ(cudnnConvolutionBackwardFilter(d.h, &one, d.x, x.data(), d.y, dy.data(), d.conv, perf[i].algo,
                                               buf.data(), ws, &zero, d.w, dw.data()),
                CUDNN_STATUS_SUCCESS)
          << emu::last_error_detail();
      if (first.empty()) first = dw;
      EXPECT_EQ(dw, first) << "algo " << perf[i].algo;
      ++ran;
    }
    EXPECT_GE(ran, 3);
  }
}

// The support rules of the fake table, each through the workspace query conv.cu makes.

}  // namespace
