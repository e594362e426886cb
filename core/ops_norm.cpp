// The batch_norm front-end: argument checks, dispatch to the device kernels, the running-stat
// update (training) and the backward node. Every ResNet layer goes through here, so the checks
// name the channel counts involved, and the backward saves only what the wanted gradients need.
#include <cmath>
#include <vector>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops.h"

namespace minidl {
namespace {

// x may be f16 (autocast, pure f16) with f32 parameters and statistics on every backend.
void check_input_dtype(const Tensor& x) {
  const DType dt = x.dtype();
  const bool ok = dt == DType::f32 || dt == DType::f64 || dt == DType::f16;
  MINIDL_CHECK(ok, "batch_norm: input ", shape_str(x.shape()), " has dtype ", dtype_name(dt), " on ",
               x.device().str(), ", but only f32, f64 and f16 are supported; convert it with "
               ".to(DType::f32)");
}

// Dtype of the per-channel tensors: x's own, except f32 under f16 activations.
DType param_dtype(const Tensor& x) { return x.dtype() == DType::f16 ? DType::f32 : x.dtype(); }

void check_channel_tensor(const Tensor& t, const char* what, const Tensor& x) {
  if (!t.defined()) return;
  const int64_t C = x.size(1);
  MINIDL_CHECK(t.dim() == 1 && t.size(0) == C, "batch_norm: ", what, " has shape ", shape_str(t.shape()),
               " but the input ", shape_str(x.shape()), " has ", C, " channels (dim 1); ", what,
               " must be [", C, "] (was the layer built with num_features=", C, "?)");
  const DType want = param_dtype(x);
  MINIDL_CHECK(t.dtype() == want, "batch_norm: ", what, " has dtype ", dtype_name(t.dtype()), " but the input ",
               shape_str(x.shape()), " (", dtype_name(x.dtype()), ") needs ", dtype_name(want), "; convert it with .to(DType::",
               dtype_name(want), ")");
  MINIDL_CHECK(t.device() == x.device(), "batch_norm: ", what, " is on ", t.device().str(), " but the input is on ",
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

}  // namespace

Tensor batch_norm(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                  const Tensor& running_var, bool training, double momentum, double eps) {
  MINIDL_CHECK(x.defined(), "batch_norm: the input is an undefined tensor");
  MINIDL_CHECK(x.dim() >= 2, "batch_norm: expected an input [N, C, ...] with at least 2 dims but got ",
               shape_str(x.shape()), (x.dim() == 1 ? "; for one sample of C features use x.unsqueeze(0)" : ""));
  check_input_dtype(x);
  check_channel_tensor(weight, "weight", x);
  check_channel_tensor(bias, "bias", x);
  check_channel_tensor(running_mean, "running_mean", x);
  check_channel_tensor(running_var, "running_var", x);
  MINIDL_CHECK(running_mean.defined() == running_var.defined(), "batch_norm: running_mean is ",
               (running_mean.defined() ? "defined" : "undefined"), " but running_var is ",
               (running_var.defined() ? "defined" : "undefined"), "; pass both (tracked statistics) or neither");
  MINIDL_CHECK(momentum >= 0.0 && momentum <= 1.0, "batch_norm: momentum ", momentum,
               " must be in [0, 1] (PyTorch's default is 0.1)");
  MINIDL_CHECK(eps >= 0.0 && std::isfinite(eps), "batch_norm: eps ", eps,
               " must be finite and non-negative (PyTorch's default is 1e-5)");
  const int64_t nd = x.dim();
  const int64_t C = x.size(1);
  const bool need_x = x.requires_grad();
  const bool need_w = weight.defined() && weight.requires_grad();
  const bool need_b = bias.defined() && bias.requires_grad();
  const bool recording = needs_grad({&x, &weight, &bias});

  Tensor xc = x.detach().contiguous();
  Tensor y = empty(x.shape(), x.options());
  Backend& be = backend(x.device());
  const TensorOptions popts{param_dtype(x), x.device(), false};

  if (training) {
    const int64_t per_channel = C > 0 ? x.numel() / C : 0;
    MINIDL_CHECK(per_channel > 1, "batch_norm: training needs more than 1 value per channel to compute a variance, "
                 "but the input ", shape_str(x.shape()), " has ", per_channel,
                 "; use a batch larger than 1 or evaluation mode (training=false)");
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
             [xc, ws, save_mean, save_invstd, need_x, need_w, need_b, C](const std::vector<Tensor>& g) {
               if (!g[0].defined()) return std::vector<Tensor>(3);
               const Tensor gy = g[0].to(xc.dtype()).contiguous();
               const TensorOptions po = save_mean.options();
               // The kernel contract always produces gx (cuDNN does); it is dropped when x needs none.
               Tensor gx = empty(xc.shape(), xc.options());
               Tensor gw = need_w ? empty({C}, po) : Tensor();
               Tensor gb = need_b ? empty({C}, po) : Tensor();
               backend(xc.device()).batch_norm_backward(gy, xc, ws, save_mean, save_invstd, gx, gw, gb);
               return std::vector<Tensor>{need_x ? gx : Tensor(), gw, gb};
             });
    }
    return y;
  }

  MINIDL_CHECK(running_mean.defined(), "batch_norm: evaluation mode (training=false) normalises with running_mean "
               "and running_var, but they are undefined; pass them, or training=true to use batch statistics");
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

}  // namespace minidl
