// The batch_norm front-end: argument checks, dispatch to the device kernels, the running-stat
// update (training) and the backward node. Every ResNet layer goes through here, so the checks
// name the channel counts involved, and the backward saves only what the wanted gradients need.
// Also its fused forms with ReLU and the residual add (one node, ReLU's backward folded in).
#include <cmath>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops.h"

namespace minidl {
namespace {

// x may be f16 (autocast, pure f16) with f32 parameters and statistics on every backend.
void check_input_dtype(const Tensor& x, const char* op) {
  const DType dt = x.dtype();
  const bool ok = is_floating(dt);
  MINIDL_CHECK(ok, op, ": input ", shape_str(x.shape()), " has dtype ", dtype_name(dt), " on ",
               x.device().str(), ", but only f32, f64, f16 and bf16 are supported; convert it with "
               ".to(DType::f32)");
}

// Dtype of the per-channel tensors: x's own, except f32 under f16 activations.
DType param_dtype(const Tensor& x) { return is_float16(x.dtype()) ? DType::f32 : x.dtype(); }

void check_channel_tensor(const Tensor& t, const char* what, const Tensor& x, const char* op) {
  if (!t.defined()) return;
  const int64_t C = x.size(1);
  MINIDL_CHECK(t.dim() == 1 && t.size(0) == C, op, ": ", what, " has shape ", shape_str(t.shape()),
               " but the input ", shape_str(x.shape()), " has ", C, " channels (dim 1); ", what,
               " must be [", C, "] (was the layer built with num_features=", C, "?)");
  const DType want = param_dtype(x);
  MINIDL_CHECK(t.dtype() == want, op, ": ", what, " has dtype ", dtype_name(t.dtype()), " but the input ",
               shape_str(x.shape()), " (", dtype_name(x.dtype()), ") needs ", dtype_name(want), "; convert it with .to(DType::",
               dtype_name(want), ")");
  MINIDL_CHECK(t.device() == x.device(), op, ": ", what, " is on ", t.device().str(), " but the input is on ",
               x.device().str(), "; move it with .to(Device)");
}

// All dims but the channel one: what the per-channel gradients sum over.
std::vector<int64_t> non_channel_dims(int64_t nd) {
  std::vector<int64_t> dims{0};
  for (int64_t d = 2; d < nd; ++d) dims.push_back(d);
  return dims;
}

// [C] -> [1, C, 1, ...] so it broadcasts against x.
Tensor channel_view(const Tensor& t, int64_t nd) {
  Shape s(static_cast<size_t>(nd), 1);
  s[1] = t.size(0);
  return t.reshape(s);
}

// The argument checks batch_norm and the fused forms share; `op` names the caller in messages.
void check_args(const char* op, const Tensor& x, const Tensor& weight, const Tensor& bias,
                const Tensor& running_mean, const Tensor& running_var, bool training, double momentum, double eps) {
  MINIDL_CHECK(x.defined(), op, ": the input is an undefined tensor");
  MINIDL_CHECK(x.dim() >= 2, op, ": expected an input [N, C, ...] with at least 2 dims but got ",
               shape_str(x.shape()), (x.dim() == 1 ? "; for one sample of C features use x.unsqueeze(0)" : ""));
  check_input_dtype(x, op);
  check_channel_tensor(weight, "weight", x, op);
  check_channel_tensor(bias, "bias", x, op);
  check_channel_tensor(running_mean, "running_mean", x, op);
  check_channel_tensor(running_var, "running_var", x, op);
  MINIDL_CHECK(running_mean.defined() == running_var.defined(), op, ": running_mean is ",
               (running_mean.defined() ? "defined" : "undefined"), " but running_var is ",
               (running_var.defined() ? "defined" : "undefined"), "; pass both (tracked statistics) or neither");
  MINIDL_CHECK(momentum >= 0.0 && momentum <= 1.0, op, ": momentum ", momentum,
               " must be in [0, 1] (PyTorch's default is 0.1)");
  MINIDL_CHECK(eps >= 0.0 && std::isfinite(eps), op, ": eps ", eps,
               " must be finite and non-negative (PyTorch's default is 1e-5)");
  if (training) {
    const int64_t C = x.size(1);
    const int64_t per_channel = C > 0 ? x.numel() / C : 0;
    MINIDL_CHECK(per_channel > 1, op, ": training needs more than 1 value per channel to compute a variance, "
                 "but the input ", shape_str(x.shape()), " has ", per_channel,
                 "; use a batch larger than 1 or evaluation mode (training=false)");
  } else {
    MINIDL_CHECK(running_mean.defined(), op, ": evaluation mode (training=false) normalises with running_mean "
                 "and running_var, but they are undefined; pass them, or training=true to use batch statistics");
  }
}

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum, double eps) {
  check_args("batch_norm", x, weight, bias, running_mean, running_var, training, momentum, eps);
  const int64_t nd = x.dim();
  const int64_t C = x.size(1);
  const bool need_x = x.requires_grad();
  const bool need_w = weight.defined() && weight.requires_grad();
  const bool need_b = bias.defined() && bias.requires_grad();
  const bool recording = needs_grad({&x, &weight, &bias});

  // Channels-last in, channels-last out (the downsample branch's batch norm of a channels-last ResNet).
  const bool cl = prefers_channels_last(x);
  Tensor xc = in_format(x.detach(), cl);
  Tensor y = empty_in_format(x.shape(), x.options(), cl);
  Backend& be = backend(x.device());
  const TensorOptions popts{param_dtype(x), x.device(), false};

  if (training) {
    Tensor save_mean = empty({C}, popts);
    Tensor save_invstd = empty({C}, popts);
    // The kernel updates the running statistics in place; they are buffers, never recorded. A
    // checkpoint rerun (recomputing()) already updated them in the real forward: pass none then.
    const bool track = running_mean.defined() && !recomputing();
    be.batch_norm_forward_train(xc, weight.defined() ? weight.detach() : Tensor(),
                                bias.defined() ? bias.detach() : Tensor(),
                                track ? running_mean.detach() : Tensor(),
                                track ? running_var.detach() : Tensor(), momentum, eps, y,
                                save_mean, save_invstd);
    if (recording) {
      const Tensor ws = weight.defined() ? weight.detach() : Tensor();
      record("batch_norm", {x, weight, bias}, {y},
             [xc, ws, save_mean, save_invstd, need_x, need_w, need_b, C, cl](const std::vector<Tensor>& g) {
               if (!g[0].defined()) return std::vector<Tensor>(3);
               const Tensor gy = in_format(g[0].to(xc.dtype()), cl);
               const TensorOptions po = save_mean.options();
               // The kernel contract always produces gx (cuDNN does); it is dropped when x needs none.
               Tensor gx = empty_in_format(xc.shape(), xc.options(), cl);
               Tensor gw = need_w ? empty({C}, po) : Tensor();
               Tensor gb = need_b ? empty({C}, po) : Tensor();
               backend(xc.device()).batch_norm_backward(gy, xc, ws, save_mean, save_invstd, gx, gw, gb);
               return std::vector<Tensor>{need_x ? gx : Tensor(), gw, gb};
             });
    }
    return y;
  }

  be.batch_norm_forward_eval(xc, weight.defined() ? weight.detach() : Tensor(),
                             bias.defined() ? bias.detach() : Tensor(), running_mean.detach(), running_var.detach(),
                             eps, y);
  if (recording) {
    // The running statistics are buffers a later training step overwrites in place: snapshot the
    // per-channel mean and 1/sqrt(var + eps) now.
    Tensor mean_c, invstd_c;
    {
      NoGradGuard no_grad;
      mean_c = running_mean.detach().clone();
      invstd_c = 1.0 / sqrt(running_var.detach() + eps);
    }
    const Tensor ws = weight.defined() ? weight.detach() : Tensor();
    const Tensor xs = need_w ? xc : Tensor();  // x only feeds the weight gradient
    record("batch_norm", {x, weight, bias}, {y},
           [xs, ws, mean_c, invstd_c, need_x, need_w, need_b, nd](const std::vector<Tensor>& g) {
             if (!g[0].defined()) return std::vector<Tensor>(3);
             const DType pd = invstd_c.dtype();
             const Tensor gy = g[0].to(pd);
             const Tensor inv = channel_view(invstd_c, nd);
             const std::vector<int64_t> dims = non_channel_dims(nd);
             Tensor gx, gw, gb;
             if (need_x) {
               const Tensor scale = ws.defined() ? channel_view(ws, nd) * inv : inv;
               gx = gy * scale;
               if (g[0].dtype() != pd) gx = gx.to(g[0].dtype());
             }
             if (need_w) {
               const Tensor xhat = (xs.to(pd) - channel_view(mean_c, nd)) * inv;
               gw = sum(gy * xhat, dims);
             }
             if (need_b) gb = sum(gy, dims);
             return std::vector<Tensor>{gx, gw, gb};
           });
  }
  return y;
}

// ---- Fused batch norm + (residual add) + ReLU ----

namespace {

// The fused kernels run in x's layout: channels-last when x is (and is not also plain contiguous,
// which a tensor with C == 1 or H * W == 1 is), contiguous NCHW otherwise.
Tensor batch_norm_act(const char* op, const Tensor& x, const Tensor& residual, bool with_residual,
                      const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                      const Tensor& running_var, bool training, double momentum, double eps) {
  check_args(op, x, weight, bias, running_mean, running_var, training, momentum, eps);
  if (with_residual) {
    MINIDL_CHECK(residual.defined(), op, ": the residual is an undefined tensor; without one call batch_norm_relu");
    MINIDL_CHECK(residual.shape() == x.shape(), op, ": the residual ", shape_str(residual.shape()),
                 " must have the input's shape ", shape_str(x.shape()),
                 " (in a ResNet block a downsample branch makes the identity match the block's output)");
    MINIDL_CHECK(residual.dtype() == x.dtype(), op, ": the residual ", residual.meta(), " and the input ", x.meta(),
                 " must have one dtype; convert the residual with .to(DType::", dtype_name(x.dtype()), ")");
    MINIDL_CHECK(residual.device() == x.device(), op, ": the residual is on ", residual.device().str(),
                 " but the input is on ", x.device().str(), "; move it with .to(Device)");
  }
  const int64_t C = x.size(1);
  const bool cl = prefers_channels_last(x);
  const bool need_x = x.requires_grad();
  const bool need_r = with_residual && residual.requires_grad();
  const bool need_w = weight.defined() && weight.requires_grad();
  const bool need_b = bias.defined() && bias.requires_grad();

  const Tensor xc = in_format(x.detach(), cl);
  const Tensor rc = with_residual ? in_format(residual.detach(), cl) : Tensor();
  const Tensor ws = weight.defined() ? weight.detach() : Tensor();
  const Tensor bs = bias.defined() ? bias.detach() : Tensor();
  Tensor y = empty_in_format(x.shape(), x.options(), cl);
  const TensorOptions popts{param_dtype(x), x.device(), false};
  // Batch statistics in training, a snapshot of the running ones otherwise (a later training step
  // overwrites those in place before this graph's backward may run).
  Tensor save_mean = empty({C}, popts);
  Tensor save_invstd = empty({C}, popts);
  // Running statistics are read in evaluation, updated in training, except in a checkpoint rerun
  // (recomputing()), whose real forward already updated them.
  const bool pass_running = training ? running_mean.defined() && !recomputing() : true;
  backend(x.device()).batch_norm_act_forward(xc, rc, ws, bs, pass_running ? running_mean.detach() : Tensor(),
                                             pass_running ? running_var.detach() : Tensor(), training, momentum,
                                             eps, y, save_mean, save_invstd);
  if (needs_grad({&x, &residual, &weight, &bias})) {
    record(op, {x, residual, weight, bias}, {y},
           [xc, yd = y.detach(), ws, bs, save_mean, save_invstd, training, cl, with_residual, need_x, need_r, need_w,
            need_b, C](const std::vector<Tensor>& g) {
             if (!g[0].defined()) return std::vector<Tensor>(4);
             const Tensor gy = in_format(g[0].to(xc.dtype()), cl);
             const TensorOptions po = save_mean.options();
             Tensor gx = need_x ? empty_in_format(xc.shape(), xc.options(), cl) : Tensor();
             // The kernel contract always writes the residual's gradient when there is one: it is
             // the masked gradient the input's backward reads back.
             Tensor gr = with_residual ? empty_in_format(xc.shape(), xc.options(), cl) : Tensor();
             Tensor gw = need_w ? empty({C}, po) : Tensor();
             Tensor gb = need_b ? empty({C}, po) : Tensor();
             backend(xc.device()).batch_norm_act_backward(gy, xc, yd, ws, bs, save_mean, save_invstd, training, gx,
                                                          gr, gw, gb);
             return std::vector<Tensor>{gx, need_r ? gr : Tensor(), gw, gb};
           });
  }
  return y;
}

}  // namespace

Tensor batch_norm_relu(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                       const Tensor& running_var, bool training, double momentum, double eps) {
  return batch_norm_act("batch_norm_relu", x, Tensor(), false, weight, bias, running_mean, running_var, training,
                        momentum, eps);
}

Tensor batch_norm_add_relu(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                           const Tensor& running_mean, const Tensor& running_var, bool training, double momentum,
                           double eps) {
  return batch_norm_act("batch_norm_add_relu", x, residual, true, weight, bias, running_mean, running_var, training,
                        momentum, eps);
}

// The defaults of the fused virtuals (core/backend.h): a backend without the kernels says so.
void Backend::batch_norm_act_forward(const Tensor& x, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                     const Tensor&, bool, double, double, const Tensor&, const Tensor&,
                                     const Tensor&) {
  MINIDL_FAIL("batch_norm_relu / batch_norm_add_relu: the fused batch-norm kernels are not supported on the ",
              name(), " backend (input ", x.meta(), "); compose batch_norm, add and relu instead");
}

void Backend::batch_norm_act_backward(const Tensor& gy, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                      const Tensor&, const Tensor&, bool, const Tensor&, const Tensor&, const Tensor&,
                                      const Tensor&) {
  MINIDL_FAIL("batch_norm_relu / batch_norm_add_relu backward: the fused batch-norm kernels are not supported on "
              "the ", name(), " backend (gradient ", gy.meta(), "); compose batch_norm, add and relu instead");
}

}  // namespace minidl
