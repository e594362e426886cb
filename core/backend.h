// The op contracts: the seam between op front-ends (core/) and kernels (kernels/cpu,
// kernels/cuda). A Backend implements every op family for one device type, on top of the device's
// services (core/device_services.h: allocator, pinned memory, copies, synchronisation); front-ends
// validate, allocate the outputs and call backend(device).<kernel>. Adding an op family adds its
// kernels here, in one file per backend, and a case in tests/kernels/parity_cases.h.
#pragma once
#include <cstdint>
#include <vector>

#include "core/device_services.h"
#include "core/op_options.h"
#include "core/tensor.h"

namespace minidl {

enum class UnaryOp { Neg, Exp, Log, Log1p, Sqrt, Abs, Relu, Sigmoid, Tanh, Square, Pow };
// ReluGrad: out = b > 0 ? a : 0 (a: incoming gradient, b: the ReLU output).
enum class BinaryOp { Add, Sub, Mul, Div, Maximum, Minimum, ReluGrad, Eq, Ne, Lt, Le, Gt, Ge };
enum class ReduceOp { Sum, Mean, Max, Min, ArgMax, ArgMin };
// Uniform(a, b), Normal(mean a, std b), Bernoulli(probability a of a one).
enum class RandomKind { Uniform, Normal, Bernoulli };

const char* unary_name(UnaryOp op);
const char* binary_name(BinaryOp op);

// Kernel contracts. Unless noted, outputs are contiguous, preallocated on the backend's device
// with the right shape and dtype, and inputs are on the same device. Inputs may be strided views.
class Backend : public DeviceServices {
 public:
  // dst (any strides) = src (same shape, possibly expanded), converting dtype.
  virtual void copy(const Tensor& src, const Tensor& dst) = 0;
  virtual void fill(const Tensor& dst, double value) = 0;   // dst any strides
  // out = op(x); `scalar` is the exponent of Pow. x has out's shape.
  virtual void unary(UnaryOp op, const Tensor& x, const Tensor& out, double scalar) = 0;
  // out = a op b. a and b are views expanded to out's shape; out may be a itself (in place, any
  // strides) . For Add and Sub, b is scaled by alpha first. Comparisons write bool.
  virtual void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out, double alpha) = 0;
  // out has x's shape with every reduced dim set to 1. ArgMax/ArgMin: one dim, out i64.
  virtual void reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, const Tensor& out) = 0;
  // a [B,M,K], b [B,K,N] (any strides, batch stride may be 0), out [B,M,N].
  virtual void matmul(const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  // Counter-based (Philox4x32-10): element i of out (row-major) depends only on (seed, offset, i).
  virtual void random(RandomKind kind, const Tensor& out, uint64_t seed, uint64_t offset, double a, double b) = 0;

  // Convolution, NCHW. bias may be undefined. Backward kernels overwrite their outputs.
  virtual void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dOptions& o,
                              const Tensor& y) = 0;
  virtual void conv2d_backward_input(const Tensor& gy, const Tensor& w, const Conv2dOptions& o,
                                     const Tensor& gx) = 0;
  virtual void conv2d_backward_weight(const Tensor& gy, const Tensor& x, const Conv2dOptions& o,
                                      const Tensor& gw) = 0;
  // gx += the input gradient, added as it is computed (cuDNN's beta = 1), where the backend can:
  // true when it did; false, having done nothing, when it cannot (the caller then computes into a
  // fresh gx and the autograd engine adds). For a gradient that is already waiting (pending_grad).
  virtual bool conv2d_backward_input_add(const Tensor& gy, const Tensor& w, const Conv2dOptions& o,
                                         const Tensor& gx) {
    (void)gy, (void)w, (void)o, (void)gx;
    return false;
  }

  // conv2d_stats (core/conv_bn.h) as fused library calls, where the backend has them: true when
  // it did, false, having done nothing, when it cannot (the op then composes it from the kernels
  // above). Forward: y = conv(relu(x * in_scale + in_bias), w) (x itself when in_scale and in_bias
  // are undefined) and y's per-channel sum and sum of squares (f32 for f16, else x's dtype); x, w
  // and y in one layout (contiguous NCHW or channels-last), no bias. Backward, from gy (y's whole
  // gradient, the statistics' already folded in): gx, gscale, gbias (the pre-activation's masked
  // gradient summed against x and alone: undefined without in_scale) and gw, each undefined when
  // not wanted; the weight gradient reads the activation recomputed from x.
  virtual bool conv2d_stats_forward(const Tensor& x, const Tensor& in_scale, const Tensor& in_bias, const Tensor& w,
                                    const Conv2dOptions& o, const Tensor& y, const Tensor& sum, const Tensor& sumsq) {
    (void)x, (void)in_scale, (void)in_bias, (void)w, (void)o, (void)y, (void)sum, (void)sumsq;
    return false;
  }
  virtual bool conv2d_stats_backward(const Tensor& gy, const Tensor& x, const Tensor& in_scale, const Tensor& in_bias,
                                     const Tensor& w, const Conv2dOptions& o, const Tensor& gx, const Tensor& gscale,
                                     const Tensor& gbias, const Tensor& gw) {
    (void)gy, (void)x, (void)in_scale, (void)in_bias, (void)w, (void)o, (void)gx, (void)gscale, (void)gbias, (void)gw;
    return false;
  }
  // conv2d_stats's backward folds its statistics' gradients into its output's in one pass, where
  // the backend has the kernel: g = gy + gsum + 2 * y * gsumsq per channel (gy, gsum or gsumsq
  // undefined: zero), in f32 for f16 y and rounded once to y's dtype; gy, y and g channels-last in
  // y's dtype, gsum and gsumsq [C] in the statistics' dtype. True when it did, false, having done
  // nothing, when it cannot (the op then composes it).
  virtual bool conv2d_stats_output_grad(const Tensor& gy, const Tensor& gsum, const Tensor& gsumsq, const Tensor& y,
                                        const Tensor& g) {
    (void)gy, (void)gsum, (void)gsumsq, (void)y, (void)g;
    return false;
  }
  // bn_finalize (core/conv_bn.h) in one launch each way, where the backend has the kernels: true
  // when it did, false, having done nothing, when it cannot (the op then composes it from
  // per-channel ops and autograd differentiates those). Every tensor is [C] and contiguous in the
  // statistics' dtype; weight, bias and the running statistics may be undefined (1, 0, none).
  // Forward, per channel: mean = sum / count, var = max(sumsq / count - mean^2, 0), invstd =
  // 1 / sqrt(var + eps), scale = weight * invstd, shift = bias - mean * scale; the running
  // statistics updated as batch_norm's training forward does (momentum, unbiased variance).
  // Backward, from gscale and gshift (either undefined: zero): gsum, gsumsq, gweight, gbias, each
  // undefined when not wanted (the clamped variance passes no gradient).
  virtual bool bn_finalize_forward(const Tensor& sum, const Tensor& sumsq, const Tensor& weight, const Tensor& bias,
                                   const Tensor& running_mean, const Tensor& running_var, int64_t count,
                                   double momentum, double eps, const Tensor& scale, const Tensor& shift) {
    (void)sum, (void)sumsq, (void)weight, (void)bias, (void)running_mean, (void)running_var, (void)count,
        (void)momentum, (void)eps, (void)scale, (void)shift;
    return false;
  }
  virtual bool bn_finalize_backward(const Tensor& gscale, const Tensor& gshift, const Tensor& sum, const Tensor& sumsq,
                                    const Tensor& weight, int64_t count, double eps, const Tensor& gsum,
                                    const Tensor& gsumsq, const Tensor& gweight, const Tensor& gbias) {
    (void)gscale, (void)gshift, (void)sum, (void)sumsq, (void)weight, (void)count, (void)eps, (void)gsum,
        (void)gsumsq, (void)gweight, (void)gbias;
    return false;
  }

  // Pooling, NCHW, options already resolved (stride != 0). indices: i64 flat offsets into H*W.
  virtual void max_pool2d_forward(const Tensor& x, const Pool2dOptions& o, const Tensor& y,
                                  const Tensor& indices) = 0;
  // gx = the sum of gy at each output's saved index, added in output order (row-major within a
  // plane), which makes it deterministic. o are the forward's options: a backend that gathers
  // (each input element visits only the windows that cover it) needs them.
  virtual void max_pool2d_backward(const Tensor& gy, const Tensor& indices, const Pool2dOptions& o,
                                   const Tensor& gx) = 0;
  virtual void avg_pool2d_forward(const Tensor& x, const Pool2dOptions& o, const Tensor& y) = 0;
  virtual void avg_pool2d_backward(const Tensor& gy, const Pool2dOptions& o, const Tensor& gx) = 0;

  // Batch norm over x [N,C,*] (contiguous). weight/bias may be undefined (1 and 0).
  // Training forward writes y and the batch mean and 1/sqrt(var_biased + eps) per channel, and,
  // when running_mean/running_var are defined, updates them in place:
  // running = (1 - momentum) * running + momentum * batch (unbiased variance), as cuDNN does.
  virtual void batch_norm_forward_train(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                        const Tensor& running_mean, const Tensor& running_var, double momentum,
                                        double eps, const Tensor& y, const Tensor& save_mean,
                                        const Tensor& save_invstd) = 0;
  // Evaluation forward with the given per-channel mean and variance.
  virtual void batch_norm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                       const Tensor& mean, const Tensor& var, double eps, const Tensor& y) = 0;
  // Training backward; gweight/gbias may be undefined (not wanted).
  virtual void batch_norm_backward(const Tensor& gy, const Tensor& x, const Tensor& weight, const Tensor& save_mean,
                                   const Tensor& save_invstd, const Tensor& gx, const Tensor& gweight,
                                   const Tensor& gbias) = 0;

  // Fused batch norm + (residual add) + ReLU (core/ops_norm.cpp: batch_norm_relu,
  // batch_norm_add_relu): y = relu((x - mean) * invstd * weight + bias [+ residual]) in one pass
  // over x after the statistics. x, residual (undefined: no add) and y share one dtype (f32, f64,
  // f16) and one layout: all contiguous (NCHW, [N, C, *]) or all channels-last (4-d NHWC, see
  // is_channels_last); per-channel tensors as batch_norm's. training: batch statistics, written to
  // save_mean / save_invstd, running statistics updated when defined (as batch_norm_forward_train).
  // Otherwise mean = running_mean, var = running_var, and save_mean / save_invstd receive mean and
  // 1 / sqrt(var + eps) for the backward. The default throws: a backend without the kernels says so.
  virtual void batch_norm_act_forward(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                      const Tensor& bias, const Tensor& running_mean, const Tensor& running_var,
                                      bool training, double momentum, double eps, const Tensor& y,
                                      const Tensor& save_mean, const Tensor& save_invstd);
  // Its backward, ReLU's folded in: gm = y > 0 ? gy : 0, then batch norm's backward of gm (training:
  // through the batch statistics; otherwise gx = gm * invstd * weight). gy, x, y, gx, gresidual in
  // x's layout and dtype. gresidual is defined exactly when the forward had a residual and
  // receives gm; gx, gweight, gbias may be undefined (not wanted). bias is the forward's (a
  // backend may rebuild the ReLU's mask from x instead of reading y). The default throws.
  virtual void batch_norm_act_backward(const Tensor& gy, const Tensor& x, const Tensor& y, const Tensor& weight,
                                       const Tensor& bias, const Tensor& save_mean, const Tensor& save_invstd,
                                       bool training, const Tensor& gx, const Tensor& gresidual,
                                       const Tensor& gweight, const Tensor& gbias);

  // Softmax over the middle dim of x viewed as [outer, C, inner] (contiguous); log: log-softmax.
  virtual void softmax_forward(const Tensor& x, int64_t dim, bool log, const Tensor& y) = 0;
  // gx from gy and the forward output y (same layout as the forward).
  virtual void softmax_backward(const Tensor& gy, const Tensor& y, int64_t dim, bool log, const Tensor& gx) = 0;
  // losses[n] = -log_probs[n, target[n]]; target i64 in [0, C) (validated by the kernel: throws).
  virtual void nll_forward(const Tensor& log_probs, const Tensor& target, const Tensor& losses) = 0;
  // glogp[n, c] = (c == target[n]) ? -g[n] : 0.
  virtual void nll_backward(const Tensor& g, const Tensor& target, const Tensor& glogp) = 0;

  // Fused softmax cross-entropy (one pass per row, no [N, C] temporary). logits [N, C] contiguous
  // f32/f64/f16 (f16 computed in f32), target i64 [N] in [0, C) (validated like nll_forward: a bad
  // target throws, nothing is written). With eps = label_smoothing and lse[n] = log sum_c exp(x[n, c]):
  //   losses[n] = (1 - eps) * (lse[n] - x[n, t[n]]) + eps * (lse[n] - mean_c x[n, c])   (logits' dtype)
  //   lse[n]    (f64 for f64 logits, f32 otherwise: saved for the backward, never rounded to f16).
  virtual void cross_entropy_forward(const Tensor& logits, const Tensor& target, double label_smoothing,
                                     const Tensor& losses, const Tensor& lse) = 0;
  // glogits[n, c] = g[n] * (exp(x[n, c] - lse[n]) - (c == t[n]) * (1 - eps) - eps / C). g: [N] of
  // the logits' dtype, any stride (0: one value broadcast, as a mean's gradient is). The targets are
  // the forward's (already validated); glogits is contiguous [N, C] of the logits' dtype.
  virtual void cross_entropy_backward(const Tensor& g, const Tensor& logits, const Tensor& target,
                                      const Tensor& lse, double label_smoothing, const Tensor& glogits) = 0;
  // Elementwise binary cross-entropy on logits, x, y, loss of one shape and floating dtype,
  // contiguous: loss = max(x, 0) - x * y + log1p(exp(-|x|)) (stable for any |x|).
  virtual void bce_with_logits_forward(const Tensor& x, const Tensor& y, const Tensor& loss) = 0;
  // gx = g * (sigmoid(x) - y), gy = -g * x; gx or gy may be undefined (not wanted). g has x's shape
  // and is contiguous or has every stride 0 (one value broadcast).
  virtual void bce_with_logits_backward(const Tensor& g, const Tensor& x, const Tensor& y, const Tensor& gx,
                                        const Tensor& gy) = 0;

  // Mixed precision (optim::GradScaler): multiplies every gradient (any floating dtype and strides)
  // by inv_scale in place and sets found_inf (one-element f32 on this device) to 1 when any element
  // was inf or NaN before scaling, leaving it as it is otherwise; no host synchronisation. The
  // default is composed from the kernels above (core/ops_amp.cpp); backends override it with one
  // fused pass.
  virtual void unscale_grads(const std::vector<Tensor>& grads, double inv_scale, const Tensor& found_inf);
  // The same with the scale on the device (GradScaler's device state, for CUDA graphs): 1/scale is
  // computed there from `scale` (a one-element f32 tensor) as the host computes it, so no host
  // value is baked into a captured graph. Only device backends have it (the default throws).
  virtual void unscale_grads_device(const std::vector<Tensor>& grads, const Tensor& scale, const Tensor& found_inf);
  // PyTorch's _amp_update_scale_ on the device: with found_inf != 0 the scale is multiplied by
  // backoff and the growth tracker (one-element i32) restarts; otherwise the tracker counts the
  // clean step and, at growth_interval, the scale grows (when the result is finite) and it restarts.
  virtual void update_scale_device(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                                   double growth_factor, double backoff_factor, int64_t growth_interval);

  // Fused multi-tensor optimizer updates (optim::SGD, optim::Adam/AdamW): one pass updates every
  // parameter of a group in place with the formulas documented in optim/sgd.h and optim/adam.h.
  // Vectors are parallel (one entry per parameter); state buffers have their parameter's shape.
  // Return false, touching nothing, when this backend has no fused kernel for these tensors: the
  // caller then runs its per-tensor path. That is the default; the CUDA backend fuses contiguous
  // f32 groups, and the CPU backend fuses Adam on contiguous f32 tensors with the per-tensor
  // arithmetic to the bit (kernels/cpu/optim.cpp). The hyper-parameter structs are in
  // core/op_options.h.
  // momentum_bufs is empty when momentum == 0; fresh[i] != 0: buffer i is new and is set to the
  // gradient (PyTorch's first step) instead of being updated.
  virtual bool fused_sgd_step(const std::vector<Tensor>& /*params*/, const std::vector<Tensor>& /*grads*/,
                              const std::vector<Tensor>& /*momentum_bufs*/, const std::vector<uint8_t>& /*fresh*/,
                              const SgdHyper& /*h*/) {
    return false;
  }
  // steps[i]: parameter i's step count including this step (>= 1); max_exp_avg_sq is empty
  // unless amsgrad.
  virtual bool fused_adam_step(const std::vector<Tensor>& /*params*/, const std::vector<Tensor>& /*grads*/,
                               const std::vector<Tensor>& /*exp_avg*/, const std::vector<Tensor>& /*exp_avg_sq*/,
                               const std::vector<Tensor>& /*max_exp_avg_sq*/, const std::vector<int64_t>& /*steps*/,
                               const AdamHyper& /*h*/) {
    return false;
  }
};

// The backend of a device type. CUDA throws a clear minidl::Error when no CUDA backend is linked.
// core/ declares the registry and the kernels layer defines it (kernels/registry.cpp, in the same
// library): the front-ends dispatch through this seam without including a kernel header, as MLX's
// backend stubs do. Which backends exist is decided at link time (docs/embedding.md).
Backend& backend(DeviceType t);
inline Backend& backend(Device d) { return backend(d.type); }
// Waits for everything queued on d (Backend::synchronize): call it before reading a clock.
inline void synchronize(Device d) { backend(d).synchronize(d.index); }
// Convolution algorithm autotuning, process-wide, as torch.backends.cudnn.benchmark (default off):
// a device backend that chooses among algorithms times them once per shape and keeps the fastest
// that fits the memory budget; the shape-only device standing for a GPU models the same choice.
// The CPU has nothing to tune. cuda::set_cudnn_benchmark (kernels/cuda/runtime.h) is this switch.
void set_conv_autotune(bool on);
bool conv_autotune();
// Whether this build has the CUDA backend, and how many devices it sees (0 on any error).
bool cuda_built();
int cuda_device_count();
bool cuda_available();

}  // namespace minidl
