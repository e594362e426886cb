// The meta device standing for a GPU (Device::meta(CUDA)): the temporaries of the CUDA backend's
// kernels, from kernels/cuda/workspace.h, allocated on the caching allocator's model. Builds
// without the CUDA backend throw a clear error at the first op that needs the backend's answer.
#pragma once
#include <functional>
#include <vector>

#include "core/backend.h"

namespace minidl::meta::cuda_model {

enum class ConvDir { Forward, BackwardData, BackwardFilter };

size_t cublas_workspace_bytes();
void copy(const Tensor& src, const Tensor& dst);
// draw_workspace: the cuBLAS workspace drawn (once per device) while the operand copies are held.
void matmul(const Tensor& a, const Tensor& b, const Tensor& out, const std::function<void()>& draw_workspace);
// x: the input (or its gradient), w: the weight (or its gradient), y: the output (or its gradient).
// add: the data gradient added into the one waiting (conv2d_backward_input_add), which cuDNN's
// graph API plans apart (beta = 1).
void conv(ConvDir dir, const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dOptions& o, bool add = false);
// CudaBackend::conv2d_backward_input_add: false (nothing held) in set_conv_nhwc's transposing mode
// around NCHW operands, else the data gradient's workspace, as conv() holds it, and true.
bool conv_backward_input_add(const Tensor& gx, const Tensor& w, const Tensor& gy, const Conv2dOptions& o);
// CudaBackend::conv2d_stats_forward / _backward (cuDNN's fused graphs): false (nothing held) where
// the CUDA backend composes, else each graph's workspace and the backward's scratch, and true.
bool conv_stats_forward(const Tensor& x, const Tensor& in_scale, const Tensor& in_bias, const Tensor& w,
                        const Conv2dOptions& o, const Tensor& y, const Tensor& sum, const Tensor& sumsq);
bool conv_stats_backward(const Tensor& gy, const Tensor& x, const Tensor& in_scale, const Tensor& in_bias,
                         const Tensor& w, const Conv2dOptions& o, const Tensor& gx, const Tensor& gscale,
                         const Tensor& gbias, const Tensor& gw);
// Plain and fused batch norm (residual undefined: none); save_mean / save_invstd as the caller
// passes them (undefined: the kernel makes its own when it needs them).
void batch_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& y, bool training,
                        const Tensor& save_mean, const Tensor& save_invstd);
void batch_norm_backward(const Tensor& gy, const Tensor& x, const Tensor& y, const Tensor& gx, const Tensor& gresidual,
                         bool training, bool wants_gweight, bool wants_gbias);
Tensor f32_like(const Tensor& t);
void nll_forward(const Tensor& log_probs, const Tensor& target, const Tensor& losses);
void cross_entropy_forward(const Tensor& logits);
void reduce(const Tensor& x, const std::vector<int64_t>& dims);
void unscale_grads(const std::vector<Tensor>& grads);
bool fused_sgd_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                    const std::vector<Tensor>& momentum_bufs, const std::vector<uint8_t>& fresh,
                    const SgdHyper& h);
bool fused_adam_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                     const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                     const std::vector<Tensor>& max_exp_avg_sq, const std::vector<int64_t>& steps,
                     const AdamHyper& h);

}  // namespace minidl::meta::cuda_model
