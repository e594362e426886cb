// Which conv2d_stats calls (core/conv_bn.h) the CUDA backend runs as cuDNN's fused graphs
// (kernels/cuda/conv_stats.cu), and which bn_finalize calls as its one-launch kernels
// (kernels/cuda/bn_finalize.cu), so the meta device's model of a GPU (kernels/meta/) answers as
// the GPU would. A plain C++ header: no CUDA types.
#pragma once
#include <initializer_list>

#include "core/op_options.h"
#include "core/tensor.h"

namespace minidl::cuda {

// The fused graphs take channels-last (NHWC) data and a KRSC filter in f16, bf16 or f32, groups 1, a
// contiguous f32 per-channel scale and bias. The backward runs fused only with the prologue
// (in_scale defined): without it the op's plain data and filter gradients are the convolution's own.
// `data` are the activation-shaped operands besides x and w (y; gy, gx), each undefined or
// channels-last in x's dtype. The library may still refuse a graph at planning: the call then
// answers false too (conv_stats.cu).
inline bool conv_stats_fused(const Tensor& x, const Tensor& in_scale, const Tensor& w, const Conv2dOptions& o,
                             bool backward, std::initializer_list<const Tensor*> data) {
  if (x.dim() != 4 || w.dim() != 4 || o.groups != 1) return false;
  if (x.dtype() != DType::f16 && x.dtype() != DType::bf16 && x.dtype() != DType::f32) return false;
  if (w.dtype() != x.dtype() || !is_channels_last(x) || !is_channels_last(w)) return false;
  if (x.numel() == 0 || w.numel() == 0) return false;
  if (backward && !in_scale.defined()) return false;
  if (in_scale.defined() && (in_scale.dtype() != DType::f32 || !in_scale.is_contiguous())) return false;
  for (const Tensor* t : data)
    if (t->defined() && (t->dtype() != x.dtype() || !is_channels_last(*t))) return false;
  return true;
}

// conv2d_stats_output_grad's kernel: y channels-last f16 or f32, gy and g like it (gy may be
// undefined), the statistics' gradients [C] contiguous f32 (either may be undefined).
inline bool conv_stats_output_grad_fused(const Tensor& gy, const Tensor& gsum, const Tensor& gsumsq, const Tensor& y,
                                         const Tensor& g) {
  if (y.dim() != 4 || y.numel() == 0 || !is_channels_last(y)) return false;
  if (y.dtype() != DType::f16 && y.dtype() != DType::bf16 && y.dtype() != DType::f32) return false;
  for (const Tensor* t : {&gy, &g})
    if (t->defined() && (t->shape() != y.shape() || t->dtype() != y.dtype() || !is_channels_last(*t))) return false;
  for (const Tensor* t : {&gsum, &gsumsq})
    if (t->defined() && (t->dim() != 1 || t->size(0) != y.size(1) || t->dtype() != DType::f32 || !t->is_contiguous()))
      return false;
  return g.defined();
}

// bn_finalize's kernels: the sums [C], contiguous, f32 or f64, with every other given tensor (the
// rest may be undefined) of their shape, dtype and device and contiguous, and more than one value
// a channel. Anything else composes.
inline bool bn_finalize_fused(const Tensor& sum, int64_t count, std::initializer_list<const Tensor*> others) {
  if (count < 2 || sum.dim() != 1 || !sum.is_contiguous()) return false;
  if (sum.dtype() != DType::f32 && sum.dtype() != DType::f64) return false;
  for (const Tensor* t : others)
    if (t->defined() && (t->shape() != sum.shape() || t->dtype() != sum.dtype() || !t->is_contiguous() ||
                         t->device() != sum.device()))
      return false;
  return true;
}

}  // namespace minidl::cuda
