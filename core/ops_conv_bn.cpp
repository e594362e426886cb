// The ops of core/conv_bn.h: batch norm carried by the convolutions. conv2d_stats is one node with
// its own backward, the shape of cuDNN's fused graphs (docs/conv_bn.md): the statistics'
// gradients folded into the output's, the data gradient through the input's ReLU and scale, the
// scale's and bias's gradients from the same pass, and the weight gradient from the activation
// recomputed from x. bn_finalize is one node of one launch each way where the backend has the
// kernels (the CUDA backend's), elsewhere a composition of per-channel ops that autograd
// differentiates; scale_bias_relu runs batch norm's fused apply + ReLU kernels with an identity
// normalisation.
// Everything here runs on every backend.
#include "core/conv_bn.h"

#include <atomic>
#include <vector>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/backend.h"
#include "core/flop_count.h"
#include "core/ops.h"

namespace minidl {
namespace {

// conv_stats_counts(): relaxed counters, read only as totals.
std::atomic<int64_t> g_fused_forward{0}, g_composed_forward{0}, g_fused_backward{0}, g_composed_backward{0};

// Per-channel tensors are f32 under f16 or bf16 activations, the activations' own dtype otherwise.
DType stats_dtype(const Tensor& x) { return is_float16(x.dtype()) ? DType::f32 : x.dtype(); }

// [C] -> [1, C, 1, 1], to broadcast against an NCHW-shaped tensor.
Tensor per_channel(const Tensor& t) { return t.reshape({1, t.size(0), 1, 1}); }

void check_channel_vector(const char* op, const char* what, const Tensor& t, const Tensor& x) {
  MINIDL_CHECK(t.dim() == 1 && t.size(0) == x.size(1), op, ": ", what, " has shape ", shape_str(t.shape()),
               " but the input ", x.meta(), " has ", x.size(1), " channels (dim 1); it must be [", x.size(1), "]");
  MINIDL_CHECK(t.dtype() == stats_dtype(x), op, ": ", what, " has dtype ", dtype_name(t.dtype()), " but the input ",
               x.meta(), " needs ", dtype_name(stats_dtype(x)), "; convert it with .to(DType::",
               dtype_name(stats_dtype(x)), ")");
  MINIDL_CHECK(t.device() == x.device(), op, ": ", what, " is on ", t.device().str(), " but the input is on ",
               x.device().str(), "; move it with .to(Device)");
}

// relu(x * scale + bias) in the statistics' dtype, rounded once to x's dtype, in x's layout; x
// itself without scale and bias. Not recorded: callers differentiate it themselves.
Tensor input_activation(const Tensor& x, const Tensor& scale, const Tensor& bias, bool cl) {
  if (!scale.defined()) return x;
  const Tensor pre = x.to(scale.dtype()) * per_channel(scale) + per_channel(bias);
  return in_format(relu(pre).to(x.dtype()), cl);
}

// The gradient reaching y once the statistics' gradients are folded in:
// gy + gsum + 2 * y * gsumsq, per channel, in the statistics' dtype, rounded to y's.
Tensor total_output_grad(const Tensor& gy, const Tensor& gsum, const Tensor& gsumsq, const Tensor& y, bool cl) {
  const DType sd = stats_dtype(y);
  Tensor g = gy.defined() ? gy.to(sd) : zeros(y.shape(), {.dtype = sd, .device = y.device()});
  if (gsum.defined()) g = g + per_channel(gsum);
  if (gsumsq.defined()) g = g + y.to(sd) * per_channel(gsumsq * 2.0);
  return in_format(g.to(y.dtype()), cl);
}

struct SavedConvStats {
  Tensor x, scale, bias, w, y;
  Conv2dOptions opts;
  bool cl = false, w_cl = false, need_x = false, need_scale = false, need_bias = false, need_w = false;
};

// The composed backward (a backend without the fused calls): out = {gx, gscale, gbias, gw}.
void composed_backward(const SavedConvStats& s, const Tensor& gy, std::vector<Tensor>& out) {
  Backend& be = backend(gy.device());
  if (s.need_w) be.conv2d_backward_weight(gy, input_activation(s.x, s.scale, s.bias, s.cl), s.opts, out[3]);
  if (!(s.need_x || s.need_scale || s.need_bias)) return;
  // The convolution's data gradient goes into gx's buffer where there is one: without an affine it
  // is gx itself; with one, gx is computed afresh below and the buffer goes once it has been read.
  Tensor ga = out[0].defined() ? out[0] : empty_in_format(s.x.shape(), gy.options(), s.cl);
  be.conv2d_backward_input(gy, s.w, s.opts, ga);
  if (!s.scale.defined()) return;
  out[0] = Tensor();
  // Through the ReLU (its mask from the pre-activation, as cuDNN's drelu reads it) and the affine.
  // Each input-sized temporary goes as soon as it has been read: at most three live at once.
  const DType sd = s.scale.dtype();
  const Tensor xf = s.x.to(sd);
  Tensor gpre;
  {
    const Tensor zero = zeros({}, {.dtype = sd, .device = xf.device()});
    const Tensor mask = gt(xf * per_channel(s.scale) + per_channel(s.bias), zero);
    gpre = ga.to(sd) * mask.to(sd);
  }
  ga = Tensor();
  const std::vector<int64_t> dims{0, 2, 3};
  if (s.need_scale) out[1] = sum(gpre * xf, dims);
  if (s.need_bias) out[2] = sum(gpre, dims);
  if (s.need_x) out[0] = in_format((gpre * per_channel(s.scale)).to(s.x.dtype()), s.cl);
}

// The node's backward: gradients for {x, in_scale, in_bias, w} from those of {y, sum, sumsq}.
std::vector<Tensor> conv2d_stats_backward(const SavedConvStats& s, const std::vector<Tensor>& g) {
  std::vector<Tensor> out(4);
  if (!g[0].defined() && !g[1].defined() && !g[2].defined()) return out;
  // One pass where the backend has it; allocated first and given back before a composition (whose
  // own temporaries are larger), so the composed path's peak does not grow.
  Tensor gy = empty_in_format(s.y.shape(), s.y.options(), s.cl);
  if (!backend(gy.device()).conv2d_stats_output_grad(g[0], g[1], g[2], s.y, gy)) {
    gy = Tensor();
    gy = total_output_grad(g[0], g[1], g[2], s.y, s.cl);
  }
  const TensorOptions po{s.scale.defined() ? s.scale.dtype() : stats_dtype(s.x), gy.device(), false};
  const int64_t c_in = s.x.size(1);
  if (s.need_x) out[0] = empty_in_format(s.x.shape(), gy.options(), s.cl);
  if (s.need_scale) out[1] = empty({c_in}, po);
  if (s.need_bias) out[2] = empty({c_in}, po);
  if (s.need_w) out[3] = empty_in_format(s.w.shape(), gy.options(), s.cl);
  if (backend(gy.device()).conv2d_stats_backward(gy, s.x, s.scale, s.bias, s.w, s.opts, out[0], out[1], out[2],
                                                  out[3])) {
    g_fused_backward.fetch_add(1, std::memory_order_relaxed);
  } else {
    g_composed_backward.fetch_add(1, std::memory_order_relaxed);
    composed_backward(s, gy, out);
  }
  if (out[3].defined() && s.cl && !s.w_cl) out[3] = out[3].contiguous();   // the parameter's own format
  return out;
}

// conv2d's argument checks that the fused call needs before it runs; the output's shape.
Shape checked_output_shape(const Tensor& x, const Tensor& w, const Conv2dOptions& o) {
  MINIDL_CHECK(x.dim() == 4, "conv2d_stats: expected a 4-D input [N, C, H, W] but got ", x.meta());
  MINIDL_CHECK(w.dim() == 4 && w.size(1) == x.size(1), "conv2d_stats: weight ", w.meta(), " must be [out, ",
               x.size(1), ", kH, kW] for the input ", x.meta());
  MINIDL_CHECK(w.dtype() == x.dtype() && w.device() == x.device(), "conv2d_stats: weight ", w.meta(),
               " and input ", x.meta(), " must share dtype and device; convert one with .to()");
  MINIDL_CHECK(is_floating(x.dtype()), "conv2d_stats: input ", x.meta(),
               " must be f32, f64, f16 or bf16; convert it with .to(DType::f32)");
  MINIDL_CHECK(o.groups == 1, "conv2d_stats: groups=", o.groups, " is not supported (only groups=1)");
  return {x.size(0), w.size(0),
          conv_output_size(x.size(2), w.size(2), o.stride[0], o.padding[0], o.dilation[0], false, "conv2d_stats"),
          conv_output_size(x.size(3), w.size(3), o.stride[1], o.padding[1], o.dilation[1], false, "conv2d_stats")};
}

// bn_finalize as one node whose forward and backward are one launch each, where the backend has the
// kernels (Backend::bn_finalize_forward); false, having done nothing, where it composes.
bool finalize_in_one_launch(const ConvStats& s, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                            const Tensor& running_var, double momentum, double eps, BnAffine& out) {
  const TensorOptions o{s.sum.dtype(), s.sum.device(), false};
  const Tensor scale = empty({s.sum.size(0)}, o), shift = empty({s.sum.size(0)}, o);
  // A checkpoint rerun already updated the running statistics.
  const bool track = running_mean.defined() && !recomputing();
  const Tensor rm = track ? running_mean.detach() : Tensor(), rv = track ? running_var.detach() : Tensor();
  const Tensor w = weight.defined() ? weight.detach() : Tensor(), b = bias.defined() ? bias.detach() : Tensor();
  const Tensor sum = s.sum.detach(), sumsq = s.sumsq.detach();
  if (!backend(sum.device()).bn_finalize_forward(sum, sumsq, w, b, rm, rv, s.count, momentum, eps, scale, shift))
    return false;
  out = {scale, shift};
  if (!needs_grad({&s.sum, &s.sumsq, &weight, &bias})) return true;
  const bool need_sum = s.sum.requires_grad(), need_sumsq = s.sumsq.requires_grad();
  const bool need_w = weight.defined() && weight.requires_grad(), need_b = bias.defined() && bias.requires_grad();
  const int64_t count = s.count;
  record("bn_finalize", {s.sum, s.sumsq, weight, bias}, {scale, shift},
         [sum, sumsq, w, count, eps, o, need_sum, need_sumsq, need_w, need_b](const std::vector<Tensor>& g) {
           std::vector<Tensor> grads(4);
           if (!g[0].defined() && !g[1].defined()) return grads;
           const Shape c{sum.size(0)};
           if (need_sum) grads[0] = empty(c, o);
           if (need_sumsq) grads[1] = empty(c, o);
           if (need_w) grads[2] = empty(c, o);
           if (need_b) grads[3] = empty(c, o);
           const Tensor gscale = g[0].defined() ? g[0].contiguous() : Tensor();
           const Tensor gshift = g[1].defined() ? g[1].contiguous() : Tensor();
           const bool ran = backend(sum.device()).bn_finalize_backward(gscale, gshift, sum, sumsq, w, count, eps,
                                                                       grads[0], grads[1], grads[2], grads[3]);
           MINIDL_CHECK(ran, "bn_finalize backward: the backend ran the forward in one launch but refused the "
                        "backward for gradients ", g[0].defined() ? g[0].meta() : "(none)", " and ",
                        g[1].defined() ? g[1].meta() : "(none)");
           return grads;
         });
  return true;
}

}  // namespace

ConvStats conv2d_stats(const Tensor& x_in, const Tensor& in_scale, const Tensor& in_bias, const Tensor& w_in,
                       const Conv2dOptions& opts) {
  MINIDL_CHECK(x_in.defined() && w_in.defined(), "conv2d_stats: input and weight must be defined tensors");
  const Tensor x = autocast_to_low(x_in), w = autocast_to_low(w_in);
  const Shape y_shape = checked_output_shape(x, w, opts);
  count_flops(2.0 * static_cast<double>(y_shape[0] * y_shape[1] * y_shape[2] * y_shape[3]) *
              static_cast<double>(w.size(1) * w.size(2) * w.size(3)));
  MINIDL_CHECK(in_scale.defined() == in_bias.defined(), "conv2d_stats: in_scale is ",
               in_scale.defined() ? "defined" : "undefined", " but in_bias is ",
               in_bias.defined() ? "defined" : "undefined", "; pass both (the previous batch norm's affine) or neither");
  if (in_scale.defined()) {
    check_channel_vector("conv2d_stats", "in_scale", in_scale, x);
    check_channel_vector("conv2d_stats", "in_bias", in_bias, x);
  }
  const bool cl = prefers_channels_last(x) || prefers_channels_last(w);
  const bool w_cl = prefers_channels_last(w) || (cl && is_channels_last(w));
  const Tensor xc = in_format(x.detach(), cl), wc = in_format(w.detach(), cl);
  const Tensor sc = in_scale.defined() ? in_scale.detach() : Tensor();
  const Tensor bc = in_bias.defined() ? in_bias.detach() : Tensor();
  ConvStats s;
  s.y = empty_in_format(y_shape, x.options(), cl);
  const TensorOptions so{stats_dtype(x), x.device(), false};
  s.sum = empty({w.size(0)}, so);
  s.sumsq = empty({w.size(0)}, so);
  Backend& be = backend(x.device());
  const bool fused = be.conv2d_stats_forward(xc, sc, bc, wc, opts, s.y, s.sum, s.sumsq);
  (fused ? g_fused_forward : g_composed_forward).fetch_add(1, std::memory_order_relaxed);
  if (!fused) {
    NoGradGuard no_grad;
    be.conv2d_forward(input_activation(xc, sc, bc, cl), wc, Tensor(), opts, s.y);
    const Tensor yf = s.y.to(so.dtype);
    s.sum = sum(yf, {0, 2, 3});
    s.sumsq = sum(square(yf), {0, 2, 3});
  }
  s.count = s.y.numel() / s.y.size(1);
  if (needs_grad({&x, &in_scale, &in_bias, &w})) {
    SavedConvStats saved{xc, sc, bc, wc, s.y.detach(), opts, cl, w_cl, x.requires_grad(),
                         in_scale.defined() && in_scale.requires_grad(), in_bias.defined() && in_bias.requires_grad(),
                         w.requires_grad()};
    record("conv2d_stats", {x, in_scale, in_bias, w}, {s.y, s.sum, s.sumsq},
           [saved](const std::vector<Tensor>& g) { return conv2d_stats_backward(saved, g); });
  }
  return s;
}

BnAffine bn_finalize(const ConvStats& s, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                     const Tensor& running_var, double momentum, double eps) {
  MINIDL_CHECK(s.sum.defined() && s.sumsq.defined() && s.count > 1, "bn_finalize: need the statistics of more than "
               "one value per channel (conv2d_stats), got a count of ", s.count,
               "; use a batch larger than 1 or evaluation mode (bn_running_affine)");
  MINIDL_CHECK(momentum >= 0.0 && momentum <= 1.0, "bn_finalize: momentum ", momentum, " must be in [0, 1]");
  MINIDL_CHECK(running_mean.defined() == running_var.defined(), "bn_finalize: pass both running statistics or "
               "neither");
  if (BnAffine a; finalize_in_one_launch(s, weight, bias, running_mean, running_var, momentum, eps, a)) return a;
  const double n = static_cast<double>(s.count);
  const Tensor mean = s.sum * (1.0 / n);
  // Biased, as normalisation uses. E[y^2] - E[y]^2 can round below zero for a channel whose mean
  // dwarfs its spread: clamped, as cuDNN's finalize does, so no NaN reaches the running variance.
  const Tensor var = relu(s.sumsq * (1.0 / n) - square(mean));
  const Tensor invstd = 1.0 / sqrt(var + eps);
  const Tensor scale = weight.defined() ? weight * invstd : invstd;
  const Tensor shift = -(mean * scale);
  BnAffine a{scale, bias.defined() ? bias + shift : shift};
  if (running_mean.defined() && !recomputing()) {  // a checkpoint rerun already updated them
    NoGradGuard no_grad;
    Tensor rm = running_mean.detach(), rv = running_var.detach();  // the buffers' storage
    rm.mul_(1.0 - momentum).add_(mean.detach().to(rm.dtype()), momentum);
    rv.mul_(1.0 - momentum).add_(var.detach().to(rv.dtype()), momentum * n / (n - 1.0));
  }
  return a;
}

ConvStatsCounts conv_stats_counts() {
  return {g_fused_forward.load(std::memory_order_relaxed), g_composed_forward.load(std::memory_order_relaxed),
          g_fused_backward.load(std::memory_order_relaxed), g_composed_backward.load(std::memory_order_relaxed)};
}

BnAffine bn_running_affine(const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                           const Tensor& running_var, double eps) {
  MINIDL_CHECK(running_mean.defined() && running_var.defined(), "bn_running_affine: evaluation mode normalises "
               "with running_mean and running_var, but they are undefined");
  const Tensor invstd = 1.0 / sqrt(running_var.detach() + eps);
  const Tensor scale = weight.defined() ? weight * invstd : invstd;
  const Tensor shift = -(running_mean.detach() * scale);
  return {scale, bias.defined() ? bias + shift : shift};
}

Tensor scale_bias_relu(const Tensor& x, const Tensor& scale, const Tensor& bias, const Tensor& residual) {
  MINIDL_CHECK(x.defined() && x.dim() == 4, "scale_bias_relu: expected a 4-D input [N, C, H, W] but got ",
               x.defined() ? x.meta() : std::string("an undefined tensor"));
  check_channel_vector("scale_bias_relu", "scale", scale, x);
  check_channel_vector("scale_bias_relu", "bias", bias, x);
  if (residual.defined()) {
    MINIDL_CHECK(residual.shape() == x.shape(), "scale_bias_relu: the residual ", residual.meta(),
                 " must have the input's shape ", shape_str(x.shape()));
  }
  // One pass, forward and backward, on every backend: batch norm's fused apply (+ add) + ReLU in
  // evaluation mode with mean 0 and variance 0 under eps = 1 (1 / sqrt(0 + 1) is exactly 1) is
  // relu(x * scale + bias + residual), computed in f32 for f16 x and rounded once; its backward is
  // this op's (the masked gradient times the scale for x, the masked gradient's per-channel sums
  // against x and alone for the scale and the bias, the masked gradient itself for the residual).
  if (!residual.defined() || (residual.dtype() == x.dtype() && residual.device() == x.device())) {
    const Tensor zero = zeros({x.size(1)}, {.dtype = scale.dtype(), .device = x.device()});
    return residual.defined() ? batch_norm_add_relu(x, residual, scale, bias, zero, zero, false, 0.0, 1.0)
                              : batch_norm_relu(x, scale, bias, zero, zero, false, 0.0, 1.0);
  }
  const DType sd = scale.dtype();
  const Tensor pre = x.to(sd) * per_channel(scale) + per_channel(bias) + residual.to(sd);
  return in_format(relu(pre).to(x.dtype()), prefers_channels_last(x));
}

}  // namespace minidl
