// The cuDNN legacy convolution stand-ins' rules: which algorithm runs which problem (cuDNN's
// documented limits), the statuses of invalid calls, and the descriptors' checks, counts and output
// dimensions, which conv.cu relies on to fall back and to report.
#include <cudnn.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <string>
#include <vector>

#include "tests/emu_libs/legacy_conv_helpers.h"

namespace {

using namespace legacy_conv;

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
