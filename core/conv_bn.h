// Batch norm carried by the convolutions, as NVIDIA's ResNet-50 trains it (docs/conv_bn.md): a
// convolution emits the per-channel sum and sum of squares of its output as it writes it, a tiny
// finalize turns those into the batch norm's per-channel scale and bias, and the next convolution
// applies that scale, bias and ReLU to its input as it loads it. The normalised activation is never
// written, and the backward needs only the convolutions' raw outputs.
//
//   y1, s1 = conv2d_stats(x, -, -, w1)           a1 = bn1.finalize(s1)
//   y2, s2 = conv2d_stats(y1, a1.scale, a1.bias, w2)   ...
//   out = scale_bias_relu(yk, ak.scale, ak.bias, shortcut)
//
// equals conv -> batch_norm -> relu -> conv ... -> batch_norm -> add -> relu, forward and backward
// (the batch variance is E[y^2] - E[y]^2 here, in f32, as cuDNN's finalize computes it), and
// updates the running statistics as batch_norm does. These are the ops; a backend runs
// conv2d_stats as fused library calls and bn_finalize as one launch each way where it has them
// (the CUDA backend: cuDNN's fused graphs on channels-last f16 / f32, bn_finalize.cu), and every
// other case runs the composition written in ops_conv_bn.cpp.
#pragma once
#include <cstdint>

#include "core/op_options.h"
#include "core/tensor.h"

namespace minidl {

// A convolution's output and its per-channel statistics: sum and sumsq are [C_out] f32 (f64 for
// f64 inputs), over N * H_out * W_out values each (count).
struct ConvStats {
  Tensor y, sum, sumsq;
  int64_t count = 0;
};

// y = conv2d(relu(x * in_scale + in_bias), w) with the per-channel in_scale and in_bias ([C_in],
// f32 for f16 x) broadcast over x's channels, or conv2d(x, w) when both are undefined; no bias.
// Differentiable in x, in_scale, in_bias and w through all three outputs. Autocast casts x and w
// as conv2d does; channels-last in, channels-last out. The backward keeps x, in_scale, in_bias, w
// and y, never the activation relu(x * in_scale + in_bias), which it recomputes.
ConvStats conv2d_stats(const Tensor& x, const Tensor& in_scale, const Tensor& in_bias, const Tensor& w,
                       const Conv2dOptions& opts = {});

// Batch norm's per-channel affine from a ConvStats: with mean = sum / count and
// var = sumsq / count - mean^2, scale = weight / sqrt(var + eps) and bias = bias - mean * scale
// (weight / bias undefined: 1 and 0). Differentiable in the statistics, weight and bias. Updates
// running_mean / running_var (when defined) as batch_norm's training forward does (momentum,
// unbiased variance), except in a checkpoint rerun (recomputing()).
struct BnAffine {
  Tensor scale, bias;
};
BnAffine bn_finalize(const ConvStats& s, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                     const Tensor& running_var, double momentum = 0.1, double eps = 1e-5);

// The affine of evaluation mode, from the running statistics: scale = weight / sqrt(running_var +
// eps), bias = bias - running_mean * scale. Differentiable in weight and bias.
BnAffine bn_running_affine(const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                           const Tensor& running_var, double eps = 1e-5);

// How conv2d_stats calls ran since the process started, on every device and thread: as the
// backend's fused library calls (a forward, or a backward's masked data and filter gradients), or
// composed of minidl's own ops. A backward without the input's prologue (a block's first
// convolution) counts as composed: it is the plain convolution's data and filter gradients. What a
// run says about its conv-bn chain (RunResult::conv_stats) is the difference of two readings.
struct ConvStatsCounts {
  int64_t fused_forward = 0, composed_forward = 0, fused_backward = 0, composed_backward = 0;
};
ConvStatsCounts conv_stats_counts();

// relu(x * scale + bias + residual) (residual undefined: none), computed in f32 for f16 x and
// rounded once to x's dtype; x's layout. The end of a residual block.
Tensor scale_bias_relu(const Tensor& x, const Tensor& scale, const Tensor& bias, const Tensor& residual = Tensor());

}  // namespace minidl
