// The emulated cuDNN's reference convolutions: direct loops over dense f64 arrays, deliberately
// plain (no im2col, no minidl kernels), so that they are an independent second implementation of
// what the backend and the CPU kernels compute. Layouts, strides and dtypes are handled around
// them: run_conv (conv_reference.cpp) loads the operands into these logical arrays and stores
// the result back.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace minidl::cuda::emu::detail {

struct ConvGeometry {
  int64_t n = 0, c = 0, h = 0, w = 0;   // x [n, c, h, w]
  int64_t k = 0, r = 0, s = 0;          // w [k, c / groups, r, s]
  int64_t oh = 0, ow = 0;               // y [n, k, oh, ow]
  int64_t groups = 1;
  int64_t pad_h = 0, pad_w = 0, stride_h = 1, stride_w = 1, dil_h = 1, dil_w = 1;
  bool flip = false;   // CUDNN_CONVOLUTION: the filter is applied rotated by 180 degrees
};

// Each returns its output, accumulated in f64 (sizes n*k*oh*ow, n*c*h*w and k*(c/groups)*r*s).
// Every element sums its terms from 0 in one fixed order, each product added by one fused
// multiply-add (std::fma), so a result does not depend on how the loops are arranged or on what
// the compiler contracts: y[n][k][oh][ow] over (c, r, s), dx[n][c][h][w] over (k, oh, ow) and
// dw[k][c][r][s] over (n, oh, ow), each in increasing order.
std::vector<double> conv_forward_ref(const ConvGeometry& g, const std::vector<double>& x, const std::vector<double>& w);
std::vector<double> conv_backward_data_ref(const ConvGeometry& g, const std::vector<double>& dy,
                                           const std::vector<double>& w);
std::vector<double> conv_backward_filter_ref(const ConvGeometry& g, const std::vector<double>& x,
                                             const std::vector<double>& dy);

// The same into a caller's vector (resized), whose storage a caller that convolves again and
// again (the emulated library's calls) reuses instead of fresh megabytes, a page fault a page,
// each call.
void conv_forward_ref(const ConvGeometry& g, const std::vector<double>& x, const std::vector<double>& w,
                      std::vector<double>& y);
void conv_backward_data_ref(const ConvGeometry& g, const std::vector<double>& dy, const std::vector<double>& w,
                            std::vector<double>& dx);
void conv_backward_filter_ref(const ConvGeometry& g, const std::vector<double>& x, const std::vector<double>& dy,
                              std::vector<double>& dw);

}  // namespace minidl::cuda::emu::detail
