// The cuDNN convolution stand-ins against a direct computation (forward as a written-out sum,
// backward-data and backward-filter through the adjoint identities), for strides, padding,
// dilation, groups, NHWC, the flipped CUDNN_CONVOLUTION mode, f16 and TF32; and the algorithm
// queries, workspace sizes, Find*Ex and the statuses of invalid calls that conv.cu relies on.
#include <cudnn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_emu/emu_libs.h"
#include "cuda_emu/emu_libs_internal.h"

namespace {

namespace emu = minidl::cuda::emu;

struct Geo {
  int n, c, h, w, k, r, s, pad, stride, dil, groups;
  cudnnTensorFormat_t fmt = CUDNN_TENSOR_NCHW;
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  int oh() const { return (h + 2 * pad - (dil * (r - 1) + 1)) / stride + 1; }
  int ow() const { return (w + 2 * pad - (dil * (s - 1) + 1)) / stride + 1; }
};

std::vector<double> fill(size_t n, double seed) {
  std::vector<double> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = std::sin(seed + 0.61 * static_cast<double>(i));
  return v;
}

// Descriptors for one geometry, set as conv.cu sets them.
class Descs {
 public:
  Descs(const Geo& g, cudnnDataType_t dt, cudnnDataType_t compute, cudnnMathType_t math) {
    EXPECT_EQ(cudnnCreate(&h), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnCreateTensorDescriptor(&x), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnCreateTensorDescriptor(&y), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnCreateFilterDescriptor(&w), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnCreateConvolutionDescriptor(&conv), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnSetTensor4dDescriptor(x, g.fmt, dt, g.n, g.c, g.h, g.w), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnSetTensor4dDescriptor(y, g.fmt, dt, g.n, g.k, g.oh(), g.ow()), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnSetFilter4dDescriptor(w, dt, g.fmt, g.k, g.c / g.groups, g.r, g.s), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnSetConvolution2dDescriptor(conv, g.pad, g.pad, g.stride, g.stride, g.dil, g.dil, g.mode, compute),
              CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnSetConvolutionGroupCount(conv, g.groups), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnSetConvolutionMathType(conv, math), CUDNN_STATUS_SUCCESS);
  }
  ~Descs() {
    EXPECT_EQ(cudnnDestroyConvolutionDescriptor(conv), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnDestroyFilterDescriptor(w), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnDestroyTensorDescriptor(y), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnDestroyTensorDescriptor(x), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(cudnnDestroy(h), CUDNN_STATUS_SUCCESS);
  }
  Descs(const Descs&) = delete;
  Descs& operator=(const Descs&) = delete;
  cudnnHandle_t h = nullptr;
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
};

// Logical [n][c][h][w] / [k][c][r][s] element to its offset in the layout.
size_t xo(const Geo& g, int n, int c, int h, int w) {
  return static_cast<size_t>(g.fmt == CUDNN_TENSOR_NHWC ? ((n * g.h + h) * g.w + w) * g.c + c
                                                        : ((n * g.c + c) * g.h + h) * g.w + w);
}
size_t yo(const Geo& g, int n, int k, int i, int j) {
  return static_cast<size_t>(g.fmt == CUDNN_TENSOR_NHWC ? ((n * g.oh() + i) * g.ow() + j) * g.k + k
                                                        : ((n * g.k + k) * g.oh() + i) * g.ow() + j);
}
size_t wo(const Geo& g, int k, int c, int r, int s) {
  const int cg = g.c / g.groups;
  return static_cast<size_t>(g.fmt == CUDNN_TENSOR_NHWC ? ((k * g.r + r) * g.s + s) * cg + c
                                                        : ((k * cg + c) * g.r + r) * g.s + s);
}

// y = conv(x, w) written out from the definition, in the layout's own indexing.
std::vector<double> direct_forward(const Geo& g, const std::vector<double>& x, const std::vector<double>& w) {
  std::vector<double> y(static_cast<size_t>(g.n * g.k * g.oh() * g.ow()), 0.0);
  const int cg = g.c / g.groups, kg = g.k / g.groups;
  for (int n = 0; n < g.n; ++n)
    for (int k = 0; k < g.k; ++k)
      for (int i = 0; i < g.oh(); ++i)
        for (int j = 0; j < g.ow(); ++j) {
          double acc = 0;
          for (int c = 0; c < cg; ++c)
            for (int r = 0; r < g.r; ++r)
              for (int s = 0; s < g.s; ++s) {
                const int ih = i * g.stride - g.pad + r * g.dil, iw = j * g.stride - g.pad + s * g.dil;
                if (ih < 0 || ih >= g.h || iw < 0 || iw >= g.w) continue;
                const int fr = g.mode == CUDNN_CONVOLUTION ? g.r - 1 - r : r;
                const int fs = g.mode == CUDNN_CONVOLUTION ? g.s - 1 - s : s;
                acc += x[xo(g, n, (k / kg) * cg + c, ih, iw)] * w[wo(g, k, c, fr, fs)];
              }
          y[yo(g, n, k, i, j)] = acc;
        }
  return y;
}

double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

const Geo kGeos[] = {
    {2, 3, 7, 6, 4, 3, 3, 1, 2, 1, 1},                                     // stride 2, pad 1
    {1, 4, 6, 7, 6, 3, 2, 2, 1, 2, 2},                                     // dilation 2, 2 groups, 3x2 filter
    {2, 3, 5, 5, 2, 3, 3, 1, 1, 1, 1, CUDNN_TENSOR_NHWC},                  // NHWC
    {1, 2, 5, 4, 3, 2, 3, 0, 1, 1, 1, CUDNN_TENSOR_NCHW, CUDNN_CONVOLUTION},   // flipped filter
};

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
cudnnStatus_t fwd_ws_status(const Geo& g, cudnnConvolutionFwdAlgo_t algo) {
  Descs d(g, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, CUDNN_DEFAULT_MATH);
  size_t ws = 0;
  return cudnnGetConvolutionForwardWorkspaceSize(d.h, d.x, d.w, d.conv, d.y, algo, &ws);
}

TEST(CudnnConvEmu, AlgorithmSupportFollowsCudnnsDocumentedLimits) {
  const Geo base{1, 2, 8, 8, 2, 3, 3, 1, 1, 1, 1};
  Geo strided = base, grouped = base, nhwc = base, five = base;
  strided.stride = 2;
  grouped.groups = 2;
  nhwc.fmt = CUDNN_TENSOR_NHWC;
  five.r = five.s = 5;
  five.pad = 2;
  EXPECT_EQ(fwd_ws_status(base, CUDNN_CONVOLUTION_FWD_ALGO_FFT), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(fwd_ws_status(strided, CUDNN_CONVOLUTION_FWD_ALGO_FFT), CUDNN_STATUS_NOT_SUPPORTED_SHAPE);
  EXPECT_EQ(fwd_ws_status(grouped, CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING), CUDNN_STATUS_NOT_SUPPORTED_SHAPE);
  EXPECT_EQ(fwd_ws_status(nhwc, CUDNN_CONVOLUTION_FWD_ALGO_FFT), CUDNN_STATUS_NOT_SUPPORTED_LAYOUT);
  EXPECT_EQ(fwd_ws_status(nhwc, CUDNN_CONVOLUTION_FWD_ALGO_GEMM), CUDNN_STATUS_NOT_SUPPORTED_LAYOUT);
  EXPECT_EQ(fwd_ws_status(nhwc, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(fwd_ws_status(base, CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(fwd_ws_status(five, CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD), CUDNN_STATUS_NOT_SUPPORTED_SHAPE);
  EXPECT_EQ(fwd_ws_status(five, CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(fwd_ws_status(strided, CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD_NONFUSED), CUDNN_STATUS_NOT_SUPPORTED_SHAPE);
  Descs d(base, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, CUDNN_DEFAULT_MATH);
  size_t ws = 0;
  EXPECT_EQ(cudnnGetConvolutionBackwardFilterWorkspaceSize(d.h, d.x, d.y, d.conv, d.w,
                                                           CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD, &ws),
            CUDNN_STATUS_NOT_SUPPORTED);
  EXPECT_NE(std::string(emu::last_error_detail()).find("not implemented by cuDNN"), std::string::npos);
}

const void* g_live = nullptr;
size_t g_live_bytes = 0;
bool in_live(const void* p, size_t bytes) {
  const auto* b = static_cast<const unsigned char*>(g_live);
  const auto* q = static_cast<const unsigned char*>(p);
  return q >= b && q + bytes <= b + g_live_bytes;
}

TEST(CudnnConvEmu, InvalidCallsReturnCudnnStatuses) {
  const Geo g{1, 2, 5, 5, 2, 3, 3, 0, 1, 1, 1};
  Descs d(g, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, CUDNN_FMA_MATH);
  std::vector<float> x(50, 1.f), w(36, 1.f), y(18, 0.f);
  const float one = 1, zero = 0;
  auto fwd = [&](cudnnTensorDescriptor_t xd, const void* xp, cudnnTensorDescriptor_t yd, void* yp) {
    return cudnnConvolutionForward(d.h, &one, xd, xp, d.w, w.data(), d.conv, CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM,
                                   nullptr, 0, &zero, yd, yp);
  };
  // An output tensor of the wrong size.
  cudnnTensorDescriptor_t bad = nullptr;
  ASSERT_EQ(cudnnCreateTensorDescriptor(&bad), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(fwd(d.x, x.data(), bad, y.data()), CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED);
  ASSERT_EQ(cudnnSetTensor4dDescriptor(bad, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 2, 4, 3), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(fwd(d.x, x.data(), bad, y.data()), CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH);
  EXPECT_NE(std::string(emu::last_error_detail()).find("gives 1x2x3x3"), std::string::npos) << emu::last_error_detail();
  // Mixed data types.
  ASSERT_EQ(cudnnSetTensor4dDescriptor(bad, CUDNN_TENSOR_NCHW, CUDNN_DATA_HALF, 1, 2, 3, 3), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(fwd(d.x, x.data(), bad, y.data()), CUDNN_STATUS_BAD_PARAM);
  // A destroyed descriptor is recognised, not followed.
  ASSERT_EQ(cudnnDestroyTensorDescriptor(bad), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(fwd(d.x, x.data(), bad, y.data()), CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(cudnnDestroyTensorDescriptor(bad), CUDNN_STATUS_BAD_PARAM);
  // NULL and misaligned data.
  EXPECT_EQ(fwd(d.x, nullptr, d.y, y.data()), CUDNN_STATUS_BAD_PARAM_NULL_POINTER);
  EXPECT_EQ(fwd(d.x, reinterpret_cast<const char*>(x.data()) + 2, d.y, y.data()),
            CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER);
  // Negative padding; f64 data with an f32 compute type; FFT in f64.
  cudnnConvolutionDescriptor_t c64 = nullptr;
  ASSERT_EQ(cudnnCreateConvolutionDescriptor(&c64), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(cudnnSetConvolution2dDescriptor(c64, -1, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
            CUDNN_STATUS_BAD_PARAM);
  ASSERT_EQ(cudnnDestroyConvolutionDescriptor(c64), CUDNN_STATUS_SUCCESS);
  {
    Descs d64(g, CUDNN_DATA_DOUBLE, CUDNN_DATA_FLOAT, CUDNN_DEFAULT_MATH);
    size_t ws = 0;
    EXPECT_EQ(cudnnGetConvolutionForwardWorkspaceSize(d64.h, d64.x, d64.w, d64.conv, d64.y,
                                                      CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM, &ws),
              CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE);
  }
  {
    Descs d64(g, CUDNN_DATA_DOUBLE, CUDNN_DATA_DOUBLE, CUDNN_DEFAULT_MATH);
    size_t ws = 0;
    EXPECT_EQ(cudnnGetConvolutionForwardWorkspaceSize(d64.h, d64.x, d64.w, d64.conv, d64.y,
                                                      CUDNN_CONVOLUTION_FWD_ALGO_FFT, &ws),
              CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE);
  }
  // Buffers outside live device memory are faults of the launched work.
  g_live = y.data();
  g_live_bytes = y.size() * sizeof(float);
  emu::set_device_range_checker(in_live);
  EXPECT_EQ(fwd(d.x, x.data(), d.y, y.data()), CUDNN_STATUS_EXECUTION_FAILED);
  EXPECT_NE(std::string(emu::last_error_detail()).find("x = ["), std::string::npos) << emu::last_error_detail();
  emu::set_device_range_checker(nullptr);
  // A stream that died after cudnnSetStream.
  emu::set_stream_checker([](cudaStream_t s) { return s == nullptr; });
  EXPECT_EQ(cudnnSetStream(d.h, reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(0x40))), CUDNN_STATUS_BAD_PARAM);
  emu::set_stream_checker(nullptr);
  ASSERT_EQ(cudnnSetStream(d.h, reinterpret_cast<cudaStream_t>(static_cast<uintptr_t>(0x40))), CUDNN_STATUS_SUCCESS);
  emu::set_stream_checker([](cudaStream_t s) { return s == nullptr; });
  EXPECT_EQ(fwd(d.x, x.data(), d.y, y.data()), CUDNN_STATUS_EXECUTION_FAILED);
  emu::set_stream_checker(nullptr);
  EXPECT_EQ(y, std::vector<float>(18, 0.f));   // nothing refused wrote anything
  EXPECT_EQ(fwd(d.x, x.data(), d.y, y.data()), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(y, std::vector<float>(18, 18.f));
}

TEST(CudnnConvEmu, DescriptorsAreCheckedCountedAndGiveTheOutputDims) {
  const emu::LibObjectCounts before = emu::live_object_counts();
  {
    const Geo g{3, 4, 9, 11, 5, 3, 2, 1, 2, 2, 1};
    Descs d(g, CUDNN_DATA_FLOAT, CUDNN_DATA_FLOAT, CUDNN_DEFAULT_MATH);
    const emu::LibObjectCounts during = emu::live_object_counts();
    EXPECT_EQ(during.tensor_descriptors, before.tensor_descriptors + 2);
    EXPECT_EQ(during.filter_descriptors, before.filter_descriptors + 1);
    EXPECT_EQ(during.convolution_descriptors, before.convolution_descriptors + 1);
    EXPECT_EQ(during.cudnn_handles, before.cudnn_handles + 1);
    int n = 0, c = 0, h = 0, w = 0;
    ASSERT_EQ(cudnnGetConvolution2dForwardOutputDim(d.conv, d.x, d.w, &n, &c, &h, &w), CUDNN_STATUS_SUCCESS);
    EXPECT_EQ(n, 3);
    EXPECT_EQ(c, 5);
    EXPECT_EQ(h, g.oh());   // (9 + 2 - 5) / 2 + 1 = 4
    EXPECT_EQ(w, g.ow());   // (11 + 2 - 3) / 2 + 1 = 6
    EXPECT_EQ(h, 4);
    EXPECT_EQ(w, 6);
  }
  // Descriptor setters refuse what cuDNN refuses.
  cudnnTensorDescriptor_t t = nullptr;
  cudnnFilterDescriptor_t f = nullptr;
  cudnnConvolutionDescriptor_t c = nullptr;
  ASSERT_EQ(cudnnCreateTensorDescriptor(&t), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnCreateFilterDescriptor(&f), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnCreateConvolutionDescriptor(&c), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 0, 1, 1, 1), CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW_VECT_C, CUDNN_DATA_FLOAT, 1, 4, 1, 1),
            CUDNN_STATUS_NOT_SUPPORTED_LAYOUT);
  EXPECT_EQ(cudnnSetFilter4dDescriptor(f, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 2, -3, 1, 1), CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(cudnnSetConvolutionGroupCount(c, 0), CUDNN_STATUS_BAD_PARAM);
  EXPECT_EQ(cudnnSetConvolutionMathType(c, static_cast<cudnnMathType_t>(99)), CUDNN_STATUS_BAD_PARAM);
  int n = 0, ch = 0, h = 0, w = 0;
  EXPECT_EQ(cudnnGetConvolution2dForwardOutputDim(c, t, f, &n, &ch, &h, &w), CUDNN_STATUS_BAD_PARAM_NOT_FINALIZED);
  ASSERT_EQ(cudnnSetTensor4dDescriptor(t, CUDNN_TENSOR_NCHW, CUDNN_DATA_FLOAT, 1, 3, 4, 4), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnSetFilter4dDescriptor(f, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 2, 2, 3, 3), CUDNN_STATUS_SUCCESS);
  ASSERT_EQ(cudnnSetConvolution2dDescriptor(c, 0, 0, 1, 1, 1, 1, CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
            CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(cudnnGetConvolution2dForwardOutputDim(c, t, f, &n, &ch, &h, &w), CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH);
  ASSERT_EQ(cudnnSetFilter4dDescriptor(f, CUDNN_DATA_FLOAT, CUDNN_TENSOR_NCHW, 2, 3, 5, 5), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(cudnnGetConvolution2dForwardOutputDim(c, t, f, &n, &ch, &h, &w), CUDNN_STATUS_BAD_PARAM);   // 5x5 > 4x4
  EXPECT_EQ(cudnnDestroyConvolutionDescriptor(c), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(cudnnDestroyFilterDescriptor(f), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(cudnnDestroyTensorDescriptor(t), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(cudnnDestroyTensorDescriptor(nullptr), CUDNN_STATUS_SUCCESS);
  EXPECT_EQ(cudnnCreate(nullptr), CUDNN_STATUS_BAD_PARAM_NULL_POINTER);
  EXPECT_EQ(cudnnGetVersion(), static_cast<size_t>(CUDNN_VERSION));

  const emu::LibObjectCounts after = emu::live_object_counts();
  EXPECT_EQ(after.tensor_descriptors, before.tensor_descriptors);
  EXPECT_EQ(after.cudnn_handles, before.cudnn_handles);
  EXPECT_STREQ(cudnnGetErrorString(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH), "CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH");
}

}  // namespace
