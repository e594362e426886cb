// The cuDNN stand-ins' objects (the structs behind the opaque handle and descriptor types of
// <cudnn.h>) and the checks that every entry point runs on them, shared by cudnn_emu.cpp (handles,
// descriptors and the convolutions) and cudnn_algos.cpp (the algorithm and workspace queries).
#pragma once
#include <cudnn.h>

#include "cuda_emu/emu_libs_internal.h"

struct cudnnContext {
  cudaStream_t stream = nullptr;
};

struct cudnnTensorStruct {
  bool set = false;
  cudnnDataType_t dtype = CUDNN_DATA_FLOAT;
  int n = 0, c = 0, h = 0, w = 0;
  int64_t ns = 0, cs = 0, hs = 0, ws = 0;   // element strides
};

struct cudnnFilterStruct {
  bool set = false;
  cudnnDataType_t dtype = CUDNN_DATA_FLOAT;
  cudnnTensorFormat_t format = CUDNN_TENSOR_NCHW;   // NCHW: [k][c][h][w]; NHWC: [k][h][w][c]
  int k = 0, c = 0, h = 0, w = 0;
};

struct cudnnConvolutionStruct {
  bool set = false;   // by cudnnSetConvolution2dDescriptor
  int pad_h = 0, pad_w = 0, u = 1, v = 1, dil_h = 1, dil_w = 1;
  cudnnConvolutionMode_t mode = CUDNN_CROSS_CORRELATION;
  cudnnDataType_t compute = CUDNN_DATA_FLOAT;
  int groups = 1;
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
};

namespace minidl::cuda::emu::detail {

// The status of a failed check, CUDNN_STATUS_SUCCESS otherwise; the detail names fn and arg.
cudnnStatus_t check_handle(const char* fn, cudnnHandle_t h);
cudnnStatus_t check_tensor(const char* fn, const char* arg, cudnnTensorDescriptor_t d);
cudnnStatus_t check_filter(const char* fn, const char* arg, cudnnFilterDescriptor_t d);
cudnnStatus_t check_conv(const char* fn, const char* arg, cudnnConvolutionDescriptor_t d);

// The spatial output size cudnnGetConvolution2dForwardOutputDim gives, or a failed status.
cudnnStatus_t conv_output_dims(const char* fn, const cudnnConvolutionStruct& conv, const cudnnTensorStruct& x,
                               const cudnnFilterStruct& w, int& n, int& c, int& h, int& wd);

bool elem_of(cudnnDataType_t t, Elem& e);
const char* dtype_name(cudnnDataType_t t);
const char* math_name(cudnnMathType_t m);

}  // namespace minidl::cuda::emu::detail
