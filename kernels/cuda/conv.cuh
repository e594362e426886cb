// cuDNN convolutions on raw device pointers, NCHW or NHWC, used by the backend (NCHW tensors,
// channels-last tensors, or NCHW tensors transposed around these for set_conv_nhwc) and by the
// benchmarks (which time each layout directly). Algorithm choice follows set_cudnn_benchmark (runtime.h).
#pragma once
#include "core/ops.h"
#include "kernels/cuda/context.cuh"

namespace minidl::cuda {

struct ConvShape {
  int64_t n = 0, c = 0, h = 0, w = 0;   // input
  int64_t k = 0, r = 0, s = 0;          // filters [k, c / groups, r, s]
  int64_t oh = 0, ow = 0;               // output
  Conv2dOptions o;
  DType dtype = DType::f32;
  bool nhwc = false;                    // memory layout of x, y and the filters (KRSC)
};

// y = conv(x, w); dx = conv_transpose(dy, w); dw = correlation of x and dy. Each overwrites its
// output. Workspaces come from the context's caching allocator.
void conv_forward_raw(DeviceContext& ctx, const ConvShape& cs, const void* x, const void* w, void* y);
// add: dx += the data gradient (cuDNN's beta = 1) instead of dx = it.
void conv_backward_data_raw(DeviceContext& ctx, const ConvShape& cs, const void* dy, const void* w, void* dx,
                            bool add = false);
void conv_backward_filter_raw(DeviceContext& ctx, const ConvShape& cs, const void* x, const void* dy, void* dw);

}  // namespace minidl::cuda
