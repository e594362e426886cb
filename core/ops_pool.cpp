// Pooling front-ends (max, average, global average): PyTorch's argument rules and output sizes,
// dispatch to the device kernels, and backward nodes. Max pooling saves only its i64 argmax
// indices, average pooling nothing but the options, so neither keeps the input alive.
#include <array>
#include <string>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops.h"

namespace minidl {

namespace {

std::string pair_str(const std::array<int64_t, 2>& a) {
  return "[" + std::to_string(a[0]) + ", " + std::to_string(a[1]) + "]";
}

// Checks x and the options and returns them resolved (stride 0 -> kernel) with the output shape.
Pool2dOptions resolve_pool(const char* op, const Tensor& x, const Pool2dOptions& opts, Shape& out_shape) {
  MINIDL_CHECK(x.defined(), op, ": input must be a defined tensor");
  MINIDL_CHECK(x.dim() == 4, op, ": expected a 4-D input [N, C, H, W] but got ", shape_str(x.shape()),
               (x.dim() == 3 ? "; add the batch dim with x.unsqueeze(0)" : ""));
  const DType dt = x.dtype();
  const bool ok = is_floating(dt);
  MINIDL_CHECK(ok, op, ": input has dtype ", dtype_name(dt), " on ", x.device().str(),
               ", but only f32, f64, f16 and bf16 are supported; convert it with .to(DType::f32)");
  Pool2dOptions o = opts;
  for (int i = 0; i < 2; ++i) {
    MINIDL_CHECK(o.kernel[i] > 0, op, ": kernel size ", pair_str(opts.kernel), " must be positive");
    MINIDL_CHECK(o.stride[i] >= 0, op, ": stride ", pair_str(opts.stride),
                 " must be positive (or 0, meaning equal to the kernel size)");
    MINIDL_CHECK(o.padding[i] >= 0, op, ": padding ", pair_str(opts.padding), " must be non-negative");
    MINIDL_CHECK(o.padding[i] <= o.kernel[i] / 2, op, ": padding ", pair_str(opts.padding),
                 " must be at most half the kernel size ", pair_str(opts.kernel),
                 " (as in PyTorch); reduce the padding or enlarge the kernel");
    if (o.stride[i] == 0) o.stride[i] = o.kernel[i];
  }
  const int64_t oh = conv_output_size(x.size(2), o.kernel[0], o.stride[0], o.padding[0], 1, o.ceil_mode,
                                      (std::string(op) + " (height)").c_str());
  const int64_t ow = conv_output_size(x.size(3), o.kernel[1], o.stride[1], o.padding[1], 1, o.ceil_mode,
                                      (std::string(op) + " (width)").c_str());
  out_shape = {x.size(0), x.size(1), oh, ow};
  return o;
}

// Pooling keeps its input's memory format (channels-last or contiguous) in the output, the
// indices and both gradients.
Tensor prepare_grad(const std::vector<Tensor>& grads, DType dt, bool cl) {
  if (grads.empty() || !grads[0].defined()) return Tensor();
  Tensor gy = grads[0];
  if (gy.dtype() != dt) gy = gy.to(dt);
  return in_format(gy, cl);
}

// What a pooling forward needs: the resolved options, whether the call runs channels-last, the
// input in that format and the output to write.
struct PoolCall {
  Pool2dOptions o;
  bool cl = false;
  Tensor xc, y;
  Shape out_shape;
};

PoolCall begin_pool(const char* op, const Tensor& x, const Pool2dOptions& opts) {
  PoolCall p;
  p.o = resolve_pool(op, x, opts, p.out_shape);
  p.cl = prefers_channels_last(x);
  p.xc = in_format(x.detach(), p.cl);
  p.y = empty_in_format(p.out_shape, x.options(), p.cl);
  return p;
}

// Records y's node: `backward(gy, o, gx)` writes the input gradient gx (x's shape and format) from
// gy, which prepare_grad has put in x's dtype and format.
template <class Backward>
void record_pool(const char* op, const Tensor& x, const PoolCall& p, Backward backward) {
  if (!grad_enabled() || !x.requires_grad()) return;
  record(op, {x}, {p.y},
         [backward, o = p.o, x_shape = x.shape(), dt = x.dtype(), cl = p.cl](const std::vector<Tensor>& grads) {
           std::vector<Tensor> out(1);
           const Tensor gy = prepare_grad(grads, dt, cl);
           if (!gy.defined()) return out;
           out[0] = empty_in_format(x_shape, gy.options(), cl);
           backward(gy, o, out[0]);
           return out;
         });
}

}  // namespace

Tensor max_pool2d(const Tensor& x, const Pool2dOptions& opts) {
  const PoolCall p = begin_pool("max_pool2d", x, opts);
  Tensor indices = empty_in_format(p.out_shape, {.dtype = DType::i64, .device = x.device()}, p.cl);
  backend(x.device()).max_pool2d_forward(p.xc, p.o, p.y, indices);
  record_pool("max_pool2d", x, p, [indices](const Tensor& gy, const Pool2dOptions& o, Tensor& gx) {
    backend(gy.device()).max_pool2d_backward(gy, indices, o, gx);
  });
  return p.y;
}

Tensor avg_pool2d(const Tensor& x, const Pool2dOptions& opts) {
  const PoolCall p = begin_pool("avg_pool2d", x, opts);
  backend(x.device()).avg_pool2d_forward(p.xc, p.o, p.y);
  record_pool("avg_pool2d", x, p, [](const Tensor& gy, const Pool2dOptions& o, Tensor& gx) {
    backend(gy.device()).avg_pool2d_backward(gy, o, gx);
  });
  return p.y;
}

Tensor adaptive_avg_pool2d(const Tensor& x, std::array<int64_t, 2> output_size) {
  MINIDL_CHECK(x.defined(), "adaptive_avg_pool2d: input must be a defined tensor");
  MINIDL_CHECK(x.dim() == 4, "adaptive_avg_pool2d: expected a 4-D input [N, C, H, W] but got ",
               shape_str(x.shape()), (x.dim() == 3 ? "; add the batch dim with x.unsqueeze(0)" : ""));
  MINIDL_CHECK(output_size[0] == 1 && output_size[1] == 1, "adaptive_avg_pool2d: output size ",
               pair_str(output_size), " is not supported yet (only [1, 1], global average pooling); use avg_pool2d",
               " with an explicit kernel for other sizes");
  MINIDL_CHECK(x.size(2) > 0 && x.size(3) > 0, "adaptive_avg_pool2d: input ", shape_str(x.shape()),
               " has an empty spatial dimension");
  const DType dt = x.dtype();
  const bool ok = is_floating(dt);
  MINIDL_CHECK(ok, "adaptive_avg_pool2d: input has dtype ", dtype_name(dt), " on ", x.device().str(),
               ", but only f32, f64, f16 and bf16 are supported; convert it with .to(DType::f32)");
  // mean is differentiable, so it also provides the backward, except in channels-last: there
  // mean's backward (an expand divided by H*W) would come out contiguous, so the gradient is
  // written straight into x's format in one pass (the [N, C, 1, 1] output is both formats).
  if (!prefers_channels_last(x)) return mean(x, {2, 3}, /*keepdim=*/true);
  Tensor y;
  {
    NoGradGuard no_grad;
    y = mean(x.detach(), {2, 3}, /*keepdim=*/true);
  }
  if (grad_enabled() && x.requires_grad()) {
    record("adaptive_avg_pool2d", {x}, {y}, [x_shape = x.shape()](const std::vector<Tensor>& grads) {
      std::vector<Tensor> out(1);
      if (grads.empty() || !grads[0].defined()) return out;
      const Tensor& g = grads[0];
      const Tensor scale = full({1}, 1.0 / static_cast<double>(x_shape[2] * x_shape[3]), g.options());
      out[0] = empty_channels_last(x_shape, g.options());
      backend(g.device()).binary(BinaryOp::Mul, g.expand(x_shape), scale.expand(x_shape), out[0], 1.0);
      return out;
    });
  }
  return y;
}

}  // namespace minidl
