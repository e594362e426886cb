// What the tests of the cuDNN legacy convolution stand-ins share: a geometry, descriptors set as
// conv.cu sets them, deterministic data, each layout's indexing and the convolution written out from
// its definition (cudnn_conv_emu_test.cpp, cudnn_conv_rules_emu_test.cpp).
#pragma once
#include <cudnn.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "cuda_emu/emu_libs.h"
#include "cuda_emu/emu_libs_internal.h"

namespace legacy_conv {

namespace emu = minidl::cuda::emu;

struct Geo {
  int n, c, h, w, k, r, s, pad, stride, dil, groups;
  cudnnTensorFormat_t fmt = CUDNN_TENSOR_NCHW;
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  int oh() const { return (h + 2 * pad - (dil * (r - 1) + 1)) / stride + 1; }
  int ow() const { return (w + 2 * pad - (dil * (s - 1) + 1)) / stride + 1; }
};

inline std::vector<double> fill(size_t n, double seed) {
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
inline size_t xo(const Geo& g, int n, int c, int h, int w) {
  return static_cast<size_t>(g.fmt == CUDNN_TENSOR_NHWC ? ((n * g.h + h) * g.w + w) * g.c + c
                                                        : ((n * g.c + c) * g.h + h) * g.w + w);
}
inline size_t yo(const Geo& g, int n, int k, int i, int j) {
  return static_cast<size_t>(g.fmt == CUDNN_TENSOR_NHWC ? ((n * g.oh() + i) * g.ow() + j) * g.k + k
                                                        : ((n * g.k + k) * g.oh() + i) * g.ow() + j);
}
inline size_t wo(const Geo& g, int k, int c, int r, int s) {
  const int cg = g.c / g.groups;
  return static_cast<size_t>(g.fmt == CUDNN_TENSOR_NHWC ? ((k * g.r + r) * g.s + s) * cg + c
                                                        : ((k * cg + c) * g.r + r) * g.s + s);
}

// y = conv(x, w) written out from the definition, in the layout's own indexing.
inline std::vector<double> direct_forward(const Geo& g, const std::vector<double>& x, const std::vector<double>& w) {
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

inline double dot(const std::vector<double>& a, const std::vector<double>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += a[i] * b[i];
  return s;
}

inline const Geo kGeos[] = {
    {2, 3, 7, 6, 4, 3, 3, 1, 2, 1, 1},                                     // stride 2, pad 1
    {1, 4, 6, 7, 6, 3, 2, 2, 1, 2, 2},                                     // dilation 2, 2 groups, 3x2 filter
    {2, 3, 5, 5, 2, 3, 3, 1, 1, 1, 1, CUDNN_TENSOR_NHWC},                  // NHWC
    {1, 2, 5, 4, 3, 2, 3, 0, 1, 1, 1, CUDNN_TENSOR_NCHW, CUDNN_CONVOLUTION},   // flipped filter
};

}  // namespace legacy_conv
