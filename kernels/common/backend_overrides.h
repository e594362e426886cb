// The kernels each backend overrides, listed once: CpuBackend, CudaBackend and MetaBackend declare
// their overrides of core/backend.h's Backend from these lists, so adding an op adds one line here
// (its contract and comment stay in core/backend.h) instead of one in every backend's header.
#pragma once
#include <cstdint>
#include <vector>

#include "core/backend.h"

// X(return type, name, (parameters)). Every backend (the CPU's reference, the GPU's and the
// shape-only model) implements these.
#define MINIDL_BACKEND_KERNELS(X)                                                                              \
  X(void, copy, (const Tensor& src, const Tensor& dst))                                                       \
  X(void, fill, (const Tensor& dst, double value))                                                            \
  X(void, unary, (UnaryOp op, const Tensor& x, const Tensor& out, double scalar))                             \
  X(void, binary, (BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out, double alpha))           \
  X(void, reduce, (ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, const Tensor& out))        \
  X(void, matmul, (const Tensor& a, const Tensor& b, const Tensor& out))                                      \
  X(void, random, (RandomKind kind, const Tensor& out, uint64_t seed, uint64_t offset, double a, double b))   \
  X(void, conv2d_forward,                                                                                     \
    (const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dOptions& o, const Tensor& y))          \
  X(void, conv2d_backward_input, (const Tensor& gy, const Tensor& w, const Conv2dOptions& o, const Tensor& gx)) \
  X(void, conv2d_backward_weight,                                                                             \
    (const Tensor& gy, const Tensor& x, const Conv2dOptions& o, const Tensor& gw))                            \
  X(void, max_pool2d_forward, (const Tensor& x, const Pool2dOptions& o, const Tensor& y, const Tensor& indices)) \
  X(void, max_pool2d_backward,                                                                                \
    (const Tensor& gy, const Tensor& indices, const Pool2dOptions& o, const Tensor& gx))                      \
  X(void, avg_pool2d_forward, (const Tensor& x, const Pool2dOptions& o, const Tensor& y))                     \
  X(void, avg_pool2d_backward, (const Tensor& gy, const Pool2dOptions& o, const Tensor& gx))                  \
  X(void, batch_norm_forward_train,                                                                           \
    (const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,                   \
     const Tensor& running_var, double momentum, double eps, const Tensor& y, const Tensor& save_mean,        \
     const Tensor& save_invstd))                                                                              \
  X(void, batch_norm_forward_eval,                                                                            \
    (const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& mean, const Tensor& var,        \
     double eps, const Tensor& y))                                                                            \
  X(void, batch_norm_backward,                                                                                \
    (const Tensor& gy, const Tensor& x, const Tensor& weight, const Tensor& save_mean,                        \
     const Tensor& save_invstd, const Tensor& gx, const Tensor& gweight, const Tensor& gbias))                \
  X(void, batch_norm_act_forward,                                                                             \
    (const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,                       \
     const Tensor& running_mean, const Tensor& running_var, bool training, double momentum, double eps,       \
     const Tensor& y, const Tensor& save_mean, const Tensor& save_invstd))                                    \
  X(void, batch_norm_act_backward,                                                                            \
    (const Tensor& gy, const Tensor& x, const Tensor& y, const Tensor& weight, const Tensor& bias,            \
     const Tensor& save_mean, const Tensor& save_invstd, bool training, const Tensor& gx,                     \
     const Tensor& gresidual, const Tensor& gweight, const Tensor& gbias))                                    \
  X(void, softmax_forward, (const Tensor& x, int64_t dim, bool log, const Tensor& y))                         \
  X(void, softmax_backward, (const Tensor& gy, const Tensor& y, int64_t dim, bool log, const Tensor& gx))     \
  X(void, nll_forward, (const Tensor& log_probs, const Tensor& target, const Tensor& losses))                 \
  X(void, nll_backward, (const Tensor& g, const Tensor& target, const Tensor& glogp))                         \
  X(void, cross_entropy_forward,                                                                              \
    (const Tensor& logits, const Tensor& target, double label_smoothing, const Tensor& losses,                \
     const Tensor& lse))                                                                                      \
  X(void, cross_entropy_backward,                                                                             \
    (const Tensor& g, const Tensor& logits, const Tensor& target, const Tensor& lse, double label_smoothing,  \
     const Tensor& glogits))                                                                                  \
  X(void, bce_with_logits_forward, (const Tensor& x, const Tensor& y, const Tensor& loss))                    \
  X(void, bce_with_logits_backward,                                                                           \
    (const Tensor& g, const Tensor& x, const Tensor& y, const Tensor& gx, const Tensor& gy))                  \
  X(void, unscale_grads, (const std::vector<Tensor>& grads, double inv_scale, const Tensor& found_inf))       \
  X(bool, fused_adam_step,                                                                                    \
    (const std::vector<Tensor>& params, const std::vector<Tensor>& grads, const std::vector<Tensor>& exp_avg, \
     const std::vector<Tensor>& exp_avg_sq, const std::vector<Tensor>& max_exp_avg_sq,                        \
     const std::vector<int64_t>& steps, const AdamHyper& h))

// What a GPU (and the meta device's model of one) adds: gradients added into as they are computed,
// the convolutions that carry batch norm and their finalize (core/conv_bn.h) and a fused SGD step.
// The CPU keeps Backend's defaults (false: the caller's general path).
#define MINIDL_DEVICE_BACKEND_KERNELS(X)                                                                       \
  X(bool, conv2d_backward_input_add,                                                                          \
    (const Tensor& gy, const Tensor& w, const Conv2dOptions& o, const Tensor& gx))                            \
  X(bool, conv2d_stats_forward,                                                                               \
    (const Tensor& x, const Tensor& in_scale, const Tensor& in_bias, const Tensor& w, const Conv2dOptions& o, \
     const Tensor& y, const Tensor& sum, const Tensor& sumsq))                                                \
  X(bool, conv2d_stats_backward,                                                                              \
    (const Tensor& gy, const Tensor& x, const Tensor& in_scale, const Tensor& in_bias, const Tensor& w,       \
     const Conv2dOptions& o, const Tensor& gx, const Tensor& gscale, const Tensor& gbias, const Tensor& gw))   \
  X(bool, conv2d_stats_output_grad,                                                                           \
    (const Tensor& gy, const Tensor& gsum, const Tensor& gsumsq, const Tensor& y, const Tensor& g))           \
  X(bool, bn_finalize_forward,                                                                                \
    (const Tensor& sum, const Tensor& sumsq, const Tensor& weight, const Tensor& bias,                        \
     const Tensor& running_mean, const Tensor& running_var, int64_t count, double momentum, double eps,       \
     const Tensor& scale, const Tensor& shift))                                                               \
  X(bool, bn_finalize_backward,                                                                               \
    (const Tensor& gscale, const Tensor& gshift, const Tensor& sum, const Tensor& sumsq, const Tensor& weight, \
     int64_t count, double eps, const Tensor& gsum, const Tensor& gsumsq, const Tensor& gweight,               \
     const Tensor& gbias))                                                                                    \
  X(bool, fused_sgd_step,                                                                                     \
    (const std::vector<Tensor>& params, const std::vector<Tensor>& grads,                                     \
     const std::vector<Tensor>& momentum_bufs, const std::vector<uint8_t>& fresh, const SgdHyper& h))

// Declares one entry of a list as an override, inside a backend's class body:
//   MINIDL_BACKEND_KERNELS(MINIDL_DECLARE_OVERRIDE)
#define MINIDL_DECLARE_OVERRIDE(ret, name, params) ret name params override;
