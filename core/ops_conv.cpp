// The conv2d front-end: argument checks with actionable messages, output allocation, dispatch to
// the device kernels and the backward node. It saves only what the wanted gradients need, so a
// frozen layer or an input that needs no gradient does not keep activations alive.
#include <array>
#include <string>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/backend.h"
#include "core/flop_count.h"
#include "core/ops.h"

namespace minidl {

namespace {

std::string pair_str(const std::array<int64_t, 2>& a) {
  return "[" + std::to_string(a[0]) + ", " + std::to_string(a[1]) + "]";
}

void check_conv_dtype(const Tensor& x, const char* what) {
  const DType dt = x.dtype();
  const bool ok = is_floating(dt);
  MINIDL_CHECK(ok, "conv2d: ", what, " has dtype ", dtype_name(dt), " on ", x.device().str(),
               ", but only f32, f64, f16 and bf16 are supported; convert it with .to(DType::f32)");
}

// The weight and the bias share the input's dtype and device; `which` is what the fix converts or
// moves ("one" of the two for the weight, "it" for the bias).
void check_like_input(const Tensor& t, const char* what, const Tensor& x, const char* which) {
  MINIDL_CHECK(t.dtype() == x.dtype(), "conv2d: ", what, " has dtype ", dtype_name(t.dtype()), " but input has ",
               dtype_name(x.dtype()), "; convert ", which, " with .to(DType::", dtype_name(x.dtype()), ")");
  MINIDL_CHECK(t.device() == x.device(), "conv2d: ", what, " is on ", t.device().str(), " but input is on ",
               x.device().str(), "; move ", which, " with .to(Device)");
}

}  // namespace

int64_t conv_output_size(int64_t in, int64_t kernel, int64_t stride, int64_t pad, int64_t dilation,
                         bool ceil_mode, const char* op) {
  MINIDL_CHECK(kernel > 0 && stride > 0 && dilation > 0 && pad >= 0, op, ": kernel size ", kernel, ", stride ",
               stride, " and dilation ", dilation, " must be positive and padding ", pad,
               " non-negative");
  const int64_t effective = dilation * (kernel - 1) + 1;
  const int64_t span = in + 2 * pad - effective;
  MINIDL_CHECK(span >= 0, op, ": kernel size ", kernel, (dilation > 1 ? " (dilated to " : ""),
               (dilation > 1 ? std::to_string(effective) + ")" : std::string()), " is larger than the padded input (",
               in, " + 2 * ", pad, " = ", in + 2 * pad, "); use a smaller kernel or more padding, or a larger input");
  // PyTorch's pooling_output_shape: span >= 0 keeps the numerator non-negative, so / is floor.
  int64_t out = (span + (ceil_mode ? stride - 1 : 0)) / stride + 1;
  // With ceil_mode the last window must start inside the input or the left padding.
  if (ceil_mode && (out - 1) * stride >= in + pad) --out;
  MINIDL_CHECK(out > 0, op, ": computed output size ", out, " is not positive (input ", in, ", kernel ", kernel,
               ", stride ", stride, ", padding ", pad, ", dilation ", dilation, ")");
  return out;
}

Tensor conv2d(const Tensor& x_in, const Tensor& weight_in, const Tensor& bias_in, const Conv2dOptions& opts) {
  MINIDL_CHECK(x_in.defined() && weight_in.defined(), "conv2d: input and weight must be defined tensors");
  // Autocast: f32 operands run in f16 (the weight copy comes from the per-step cache).
  const Tensor x = autocast_to_low(x_in), weight = autocast_to_low(weight_in), bias = autocast_to_low(bias_in);
  MINIDL_CHECK(x.dim() == 4, "conv2d: expected a 4-D input [N, C, H, W] but got ", shape_str(x.shape()),
               (x.dim() == 3 ? "; add the batch dim with x.unsqueeze(0)" : ""));
  MINIDL_CHECK(weight.dim() == 4, "conv2d: expected a 4-D weight [out, in/groups, kH, kW] but got ",
               shape_str(weight.shape()));
  MINIDL_CHECK(opts.groups == 1, "conv2d: groups=", opts.groups,
               " is not supported yet (only groups=1); use separate convolutions over channel slices");
  check_conv_dtype(x, "input");
  check_like_input(weight, "weight", x, "one");
  for (int i = 0; i < 4; ++i) {
    MINIDL_CHECK(weight.size(i) > 0, "conv2d: weight ", shape_str(weight.shape()), " has an empty dimension");
  }
  MINIDL_CHECK(x.size(1) == weight.size(1), "conv2d: input ", shape_str(x.shape()), " has ", x.size(1),
               " channels but weight ", shape_str(weight.shape()), " expects ", weight.size(1),
               " (weight is [out, in/groups, kH, kW])");
  const int64_t out_ch = weight.size(0);
  if (bias.defined()) {
    MINIDL_CHECK(bias.dim() == 1 && bias.size(0) == out_ch, "conv2d: bias ", shape_str(bias.shape()),
                 " must be [", out_ch, "] to match weight ", shape_str(weight.shape()));
    check_like_input(bias, "bias", x, "it");
  }
  for (int i = 0; i < 2; ++i) {
    MINIDL_CHECK(opts.stride[i] > 0, "conv2d: stride ", pair_str(opts.stride), " must be positive");
    MINIDL_CHECK(opts.dilation[i] > 0, "conv2d: dilation ", pair_str(opts.dilation), " must be positive");
    MINIDL_CHECK(opts.padding[i] >= 0, "conv2d: padding ", pair_str(opts.padding), " must be non-negative");
  }
  const int64_t oh = conv_output_size(x.size(2), weight.size(2), opts.stride[0], opts.padding[0], opts.dilation[0],
                                      false, "conv2d (height)");
  const int64_t ow = conv_output_size(x.size(3), weight.size(3), opts.stride[1], opts.padding[1], opts.dilation[1],
                                      false, "conv2d (width)");
  count_flops(2.0 * static_cast<double>(x.size(0) * out_ch * oh * ow) *
              static_cast<double>(weight.size(1) * weight.size(2) * weight.size(3)));

  // Memory format, as PyTorch's cuDNN path: channels-last when the input or the weight is, and
  // then input, weight, output and every gradient are channels-last (a weight in the other format
  // is copied for the call: Module::to_channels_last converts weights once, so none is made).
  // Detach first so the copies (when made) are not recorded.
  const bool cl = prefers_channels_last(x) || prefers_channels_last(weight);
  const bool w_cl = prefers_channels_last(weight) || (cl && is_channels_last(weight));
  const Tensor xc = in_format(x.detach(), cl);
  const Tensor wc = in_format(weight.detach(), cl);
  const Tensor bc = bias.defined() ? bias.detach().contiguous() : Tensor();
  Tensor y = empty_in_format({x.size(0), out_ch, oh, ow}, x.options(), cl);
  backend(x.device()).conv2d_forward(xc, wc, bc, opts, y);

  if (grad_enabled() && (x.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad()))) {
    const bool need_x = x.requires_grad();
    const bool need_w = weight.requires_grad();
    const bool need_b = bias.defined() && bias.requires_grad();
    // gx needs the weight, gw the input: save nothing else.
    const Tensor saved_x = need_w ? xc : Tensor();
    const Tensor saved_w = need_x ? wc : Tensor();
    const Shape x_shape = x.shape();
    const Shape w_shape = weight.shape();
    record("conv2d", {x, weight, bias}, {y},
           [saved_x, saved_w, x_shape, w_shape, opts, need_x, need_w, need_b, cl,
            w_cl](const std::vector<Tensor>& grads) {
             std::vector<Tensor> out(3);
             if (grads.empty() || !grads[0].defined()) return out;
             const Tensor& ref = saved_x.defined() ? saved_x : saved_w;
             Tensor gy = grads[0];
             if (ref.defined() && gy.dtype() != ref.dtype()) gy = gy.to(ref.dtype());
             gy = in_format(gy, cl);
             Backend& be = backend(gy.device());
             if (need_x) {
               // Another use of x already delivered its gradient: add into it where the backend
               // can (cuDNN's beta = 1), which saves the engine's add (two reads and a write of an
               // activation-sized buffer, and that buffer): ResNet's block inputs, whose shortcut's
               // gradient arrives first.
               const Tensor waiting = pending_grad(0);
               const bool fits = waiting.defined() && waiting.shape() == x_shape && waiting.dtype() == gy.dtype() &&
                                 waiting.device() == gy.device() &&
                                 (cl ? is_channels_last(waiting) : waiting.is_contiguous());
               if (fits && be.conv2d_backward_input_add(gy, saved_w, opts, waiting)) {
                 out[0] = waiting;
               } else {
                 out[0] = empty_in_format(x_shape, gy.options(), cl);
                 be.conv2d_backward_input(gy, saved_w, opts, out[0]);
               }
             }
             if (need_w) {
               // In the call's format; then in the weight's own, so .grad matches its parameter.
               out[1] = empty_in_format(w_shape, gy.options(), cl);
               be.conv2d_backward_weight(gy, saved_x, opts, out[1]);
               if (cl && !w_cl) out[1] = out[1].contiguous();
             }
             if (need_b) out[2] = sum(gy, {0, 2, 3});
             return out;
           });
  }
  return y;
}

}  // namespace minidl
