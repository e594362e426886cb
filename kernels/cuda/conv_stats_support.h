// Which conv2d_stats calls (core/conv_bn.h) the CUDA backend runs as cuDNN's fused graphs
// (kernels/cuda/conv_stats.cu), so the meta device's model of a GPU (kernels/meta/cuda_model.cpp)
// answers as the GPU would. A plain C++ header: no CUDA types.
#pragma once
#include <initializer_list>

#include "core/op_options.h"
#include "core/tensor.h"

namespace minidl::cuda {

// The fused graphs take channels-last (NHWC) data and a KRSC filter in f16 or f32, groups 1, a
// contiguous f32 per-channel scale and bias. The backward runs fused only with the prologue
// (in_scale defined): without it the op's plain data and filter gradients are the convolution's own.
// `data` are the activation-shaped operands besides x and w (y; gy, gx), each undefined or
// channels-last in x's dtype. The library may still refuse a graph at planning: the call then
// answers false too (conv_stats.cu).
inline bool conv_stats_fused(const Tensor& x, const Tensor& in_scale, const Tensor& w, const Conv2dOptions& o,
                             bool backward, std::initializer_list<const Tensor*> data) {
  if (x.dim() != 4 || w.dim() != 4 || o.groups != 1) return false;
  if (x.dtype() != DType::f16 && x.dtype() != DType::f32) return false;
  if (w.dtype() != x.dtype() || !is_channels_last(x) || !is_channels_last(w)) return false;
  if (x.numel() == 0 || w.numel() == 0) return false;
  if (backward && !in_scale.defined()) return false;
  if (in_scale.defined() && (in_scale.dtype() != DType::f32 || !in_scale.is_contiguous())) return false;
  for (const Tensor* t : data)
    if (t->defined() && (t->dtype() != x.dtype() || !is_channels_last(*t))) return false;
  return true;
}

}  // namespace minidl::cuda
