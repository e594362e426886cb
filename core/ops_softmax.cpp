// Softmax, log-softmax and the classification losses every experiment trains with. cross_entropy
// is log_softmax + nll (+ label smoothing) so the gradient path stays stable; the binary loss has
// its own backward because differentiating its stable formula would go through |x| and max(x, 0).
#include <algorithm>
#include <vector>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops.h"

namespace minidl {
namespace {

void check_float(const Tensor& t, const char* op, const char* what) {
  const DType dt = t.dtype();
  MINIDL_CHECK(dt == DType::f32 || dt == DType::f64 || dt == DType::f16, op, ": ", what, " ", shape_str(t.shape()),
               " has dtype ", dtype_name(dt), ", but only f32, f64 and f16 are supported; convert it with "
               ".to(DType::f32)");
}

Tensor softmax_impl(const Tensor& x_in, int64_t dim, bool log) {
  const char* op = log ? "log_softmax" : "softmax";
  MINIDL_CHECK(x_in.defined(), op, ": the input is an undefined tensor");
  const Tensor x = autocast_to_f32(x_in);  // autocast: softmax in f32
  check_float(x, op, "input");
  const int64_t nd = std::max<int64_t>(x.dim(), 1);  // a 0-d tensor has one dim to softmax over, as PyTorch
  MINIDL_CHECK(dim >= -nd && dim < nd, op, ": dim ", dim, " is out of range for the input ", shape_str(x.shape()),
               " (valid: ", -nd, " to ", nd - 1, ")");
  const int64_t d = dim < 0 ? dim + nd : dim;
  const Tensor xc = x.detach().contiguous();
  Tensor y = empty(x.shape(), x.options());
  backend(x.device()).softmax_forward(xc, d, log, y);
  if (needs_grad({&x})) {
    const Tensor ys = y.detach();
    record(op, {x}, {y}, [ys, d, log](const std::vector<Tensor>& g) {
      if (!g[0].defined()) return std::vector<Tensor>(1);
      const Tensor gy = g[0].to(ys.dtype()).contiguous();
      Tensor gx = empty(ys.shape(), ys.options());
      backend(ys.device()).softmax_backward(gy, ys, d, log, gx);
      return std::vector<Tensor>{gx};
    });
  }
  return y;
}

// Shared checks of the class-index losses: input [N, C] floating, target [N] i64, one device.
void check_class_inputs(const char* op, const Tensor& input, const char* name, const Tensor& target) {
  MINIDL_CHECK(input.defined() && target.defined(), op, ": ", name, " and target must be defined tensors");
  MINIDL_CHECK(input.dim() == 2, op, ": expected ", name, " of shape [N, C] but got ", shape_str(input.shape()),
               (input.dim() == 1 ? "; for one sample use unsqueeze(0) on it and a target of shape [1]" : ""),
               (input.dim() > 2 ? "; for per-pixel classes move C last and flatten to [N*H*W, C]" : ""));
  check_float(input, op, name);
  MINIDL_CHECK(target.dtype() == DType::i64, op, ": target ", shape_str(target.shape()), " has dtype ",
               dtype_name(target.dtype()), " but must hold i64 class indices; convert it with .to(DType::i64)",
               (is_floating(target.dtype()) ? " (for 0/1 float labels of one logit use "
                                              "binary_cross_entropy_with_logits)"
                                            : ""));
  MINIDL_CHECK(target.dim() == 1 && target.size(0) == input.size(0), op, ": target ", shape_str(target.shape()),
               " does not match ", name, " ", shape_str(input.shape()), "; expected a target of shape [",
               input.size(0), "] (one class index per row)");
  MINIDL_CHECK(target.device() == input.device(), op, ": target is on ", target.device().str(), " but ", name,
               " is on ", input.device().str(), "; move it with .to(Device)");
}

// Per-sample -log_probs[n, target[n]], differentiable with respect to log_probs.
Tensor nll_unreduced(const Tensor& log_probs, const Tensor& target) {
  const Tensor lp = log_probs.detach().contiguous();
  const Tensor tg = target.detach().contiguous();
  Tensor losses = empty({log_probs.size(0)}, log_probs.options());
  backend(log_probs.device()).nll_forward(lp, tg, losses);
  if (needs_grad({&log_probs})) {
    const Shape shape = log_probs.shape();
    const TensorOptions opts = log_probs.options();
    record("nll_loss", {log_probs, target}, {losses}, [tg, shape, opts](const std::vector<Tensor>& g) {
      if (!g[0].defined()) return std::vector<Tensor>(2);
      const Tensor gl = g[0].to(opts.dtype).contiguous();
      Tensor glp = empty(shape, opts);
      backend(opts.device).nll_backward(gl, tg, glp);
      return std::vector<Tensor>{glp, Tensor()};
    });
  }
  return losses;
}

// Mean divides by the element count (N for the class losses), as PyTorch without class weights.
Tensor reduce_loss(const Tensor& losses, Reduction reduction) {
  switch (reduction) {
    case Reduction::None: return losses;
    case Reduction::Mean: return mean(losses);
    case Reduction::Sum: return sum(losses);
  }
  MINIDL_FAIL("loss: unknown Reduction value ", static_cast<int>(reduction));
}

}  // namespace

Tensor softmax(const Tensor& x, int64_t dim) { return softmax_impl(x, dim, false); }
Tensor log_softmax(const Tensor& x, int64_t dim) { return softmax_impl(x, dim, true); }

Tensor nll_loss(const Tensor& log_probs_in, const Tensor& target, Reduction reduction) {
  const Tensor log_probs = autocast_to_f32(log_probs_in);  // autocast: losses in f32
  check_class_inputs("nll_loss", log_probs, "log_probs", target);
  return reduce_loss(nll_unreduced(log_probs, target), reduction);
}

Tensor cross_entropy(const Tensor& logits_in, const Tensor& target, Reduction reduction, double label_smoothing) {
  const Tensor logits = autocast_to_f32(logits_in);
  check_class_inputs("cross_entropy", logits, "logits", target);
  MINIDL_CHECK(label_smoothing >= 0.0 && label_smoothing < 1.0, "cross_entropy: label_smoothing ", label_smoothing,
               " must be in [0, 1) (0 disables it; 0.1 is a common value)");
  const Tensor logp = log_softmax(logits, 1);
  Tensor loss = nll_unreduced(logp, target);
  if (label_smoothing > 0.0) {
    // PyTorch: (1 - eps) * nll + eps * mean over classes of -log p (uniform target component).
    loss = loss * (1.0 - label_smoothing) + mean(-logp, {1}) * label_smoothing;
  }
  return reduce_loss(loss, reduction);
}

Tensor binary_cross_entropy_with_logits(const Tensor& logits_in, const Tensor& target_in, Reduction reduction) {
  const char* op = "binary_cross_entropy_with_logits";
  MINIDL_CHECK(logits_in.defined() && target_in.defined(), op, ": logits and target must be defined tensors");
  const Tensor logits = autocast_to_f32(logits_in);
  const Tensor target = autocast_to_f32(target_in);
  check_float(logits, op, "logits");
  MINIDL_CHECK(target.dtype() == logits.dtype(), op, ": target has dtype ", dtype_name(target.dtype()),
               " but logits have ", dtype_name(logits.dtype()), "; convert the labels with .to(DType::",
               dtype_name(logits.dtype()), ")");
  MINIDL_CHECK(target.shape() == logits.shape(), op, ": target ", shape_str(target.shape()),
               " must have the same shape as logits ", shape_str(logits.shape()),
               " (for logits [N, 1] and labels [N] use labels.unsqueeze(1))");
  MINIDL_CHECK(target.device() == logits.device(), op, ": target is on ", target.device().str(),
               " but logits are on ", logits.device().str(), "; move it with .to(Device)");
  const Tensor x = logits.detach();
  const Tensor y = target.detach();
  Tensor loss;
  {
    NoGradGuard no_grad;
    // max(x, 0) - x*y + log(1 + exp(-|x|)): exp never overflows, and log1p keeps the tail exact.
    loss = relu(x) - x * y + log1p(exp(-abs(x)));
  }
  if (needs_grad({&logits, &target})) {
    const bool need_x = logits.requires_grad();
    const bool need_y = target.requires_grad();
    record(op, {logits, target}, {loss}, [x, y, need_x, need_y](const std::vector<Tensor>& g) {
      if (!g[0].defined()) return std::vector<Tensor>(2);
      const Tensor& gl = g[0];
      return std::vector<Tensor>{need_x ? (sigmoid(x) - y) * gl : Tensor(), need_y ? -x * gl : Tensor()};
    });
  }
  return reduce_loss(loss, reduction);
}

}  // namespace minidl
