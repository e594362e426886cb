// The differentiable op front-ends. Each validates its arguments (errors name the op, the shapes,
// dtypes and devices, and the fix), allocates outputs, calls the device's kernel through
// core/backend.h and records the backward node (core/autograd.h).
#pragma once
#include <array>
#include <vector>

#include "core/op_options.h"
#include "core/tensor.h"

namespace minidl {

// ---- Elementwise (broadcasting, same dtype and device for both operands) ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor maximum(const Tensor& a, const Tensor& b);   // ties split the gradient evenly (as PyTorch)
Tensor minimum(const Tensor& a, const Tensor& b);
Tensor pow(const Tensor& a, double exponent);
Tensor neg(const Tensor& a);
Tensor exp(const Tensor& a);
Tensor log(const Tensor& a);
Tensor log1p(const Tensor& a);
Tensor sqrt(const Tensor& a);
Tensor abs(const Tensor& a);
Tensor relu(const Tensor& a);
Tensor sigmoid(const Tensor& a);
Tensor tanh(const Tensor& a);
Tensor square(const Tensor& a);
// Comparisons: not differentiable; the result has dtype bool.
Tensor eq(const Tensor& a, const Tensor& b);
Tensor ne(const Tensor& a, const Tensor& b);
Tensor lt(const Tensor& a, const Tensor& b);
Tensor le(const Tensor& a, const Tensor& b);
Tensor gt(const Tensor& a, const Tensor& b);
Tensor ge(const Tensor& a, const Tensor& b);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a);
// A scalar operand takes the tensor's dtype and device.
Tensor operator+(const Tensor& a, double s);
Tensor operator-(const Tensor& a, double s);
Tensor operator*(const Tensor& a, double s);
Tensor operator/(const Tensor& a, double s);
Tensor operator+(double s, const Tensor& a);
Tensor operator-(double s, const Tensor& a);
Tensor operator*(double s, const Tensor& a);
Tensor operator/(double s, const Tensor& a);

// Shape of broadcasting a with b (NumPy rules); throws naming `op` when incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);
// Sums g down to `shape` (the reverse of broadcasting); differentiable.
Tensor sum_to(const Tensor& g, const Shape& shape);

// ---- Reductions (dims: empty means all; negative dims count from the end) ----
Tensor sum(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor mean(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Largest / smallest value over dims; the gradient is split evenly among ties.
Tensor max(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
Tensor min(const Tensor& a, const std::vector<int64_t>& dims = {}, bool keepdim = false);
// Index (i64) of the first largest / smallest value along dim.
Tensor argmax(const Tensor& a, int64_t dim, bool keepdim = false);
Tensor argmin(const Tensor& a, int64_t dim, bool keepdim = false);

// ---- Linear algebra ----
// [M,K]x[K,N], batched [...,M,K]x[...,K,N] with broadcast batch dims, and 1-D operands as in NumPy.
Tensor matmul(const Tensor& a, const Tensor& b);
// x [..., in], weight [out, in], bias [out] or undefined.
Tensor linear(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor());

// ---- Convolution and pooling (NCHW; options in core/op_options.h) ----
// x [N,C,H,W], weight [O,C/groups,kH,kW], bias [O] or undefined.
Tensor conv2d(const Tensor& x, const Tensor& weight, const Tensor& bias = Tensor(), const Conv2dOptions& opts = {});
// Output spatial size of a convolution or pooling window; throws naming `op` when not positive.
int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation,
                         bool ceil_mode, const char* op);

Tensor max_pool2d(const Tensor& x, const Pool2dOptions& opts);
Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& opts);
// Global average pooling: output size 1x1 only ([N,C,1,1]).
Tensor adaptive_avg_pool2d(const Tensor& x, std::array<int64_t, 2> output_size = {1, 1});

// ---- Normalisation and regularisation ----
// x [N,C,...]; weight/bias [C] or undefined; running_mean/var [C] or undefined.
// training: normalises with batch statistics and updates the running ones in place
// (momentum as PyTorch: running = (1-m)*running + m*batch, unbiased variance); eval: running ones.
Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum = 0.1, double eps = 1e-5);
// Fused forms of the ends of ResNet's layers: relu(batch_norm(x)) and relu(batch_norm(x) +
// residual), with batch_norm's arguments, checks and running-statistics updates, in one pass over
// x after the statistics and with ReLU's backward folded into batch norm's. residual has x's
// shape, dtype and device; f16 x takes f32 per-channel tensors, as batch_norm. The output has x's
// layout: contiguous, or channels-last when x is (is_channels_last); other strides are copied
// to contiguous first. Values equal the composed ops' up to the intermediate f16 rounding they skip.
Tensor batch_norm_relu(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                       const Tensor& running_var, bool training, double momentum = 0.1, double eps = 1e-5);
Tensor batch_norm_add_relu(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                           const Tensor& running_mean, const Tensor& running_var, bool training,
                           double momentum = 0.1, double eps = 1e-5);
// to_channels_last returns t itself when it already is channels-last (is_channels_last, in
// core/tensor.h), else a copy with that memory (differentiable; its gradient keeps the
// gradient's own layout). in_format: to_channels_last, or contiguous().
Tensor to_channels_last(const Tensor& t);
Tensor in_format(const Tensor& t, bool channels_last);
// Zeroes each element with probability p and scales the rest by 1/(1-p); identity when !training.
Tensor dropout(const Tensor& x, double p, bool training, Generator* gen = nullptr);

// ---- Activations over a dim and losses ----
Tensor softmax(const Tensor& x, int64_t dim);
Tensor log_softmax(const Tensor& x, int64_t dim);

enum class Reduction { None, Mean, Sum };
// logits [N,C], target [N] (i64 class indices). label_smoothing in [0, 1).
Tensor cross_entropy(const Tensor& logits, const Tensor& target, Reduction reduction = Reduction::Mean,
                     double label_smoothing = 0.0);
// log_probs [N,C], target [N] (i64).
Tensor nll_loss(const Tensor& log_probs, const Tensor& target, Reduction reduction = Reduction::Mean);
// logits and target (floating, same shape), numerically stable.
Tensor binary_cross_entropy_with_logits(const Tensor& logits, const Tensor& target,
                                        Reduction reduction = Reduction::Mean);

}  // namespace minidl
