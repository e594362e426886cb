// Softmax, log-softmax and the classification losses every experiment trains with. cross_entropy
// and the binary loss call fused backend kernels (one pass, no [N, C] temporaries, stable for large
// logits) with hand-written backward nodes; nll_loss stays the plain gather over log-probabilities.
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
  MINIDL_CHECK(is_floating(dt), op, ": ", what, " ", shape_str(t.shape()),
               " has dtype ", dtype_name(dt), ", but only f32, f64, f16 and bf16 are supported; convert it with "
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
  // PyTorch's smoothed loss: (1 - eps) * nll + eps * mean over classes of -log p, per row.
  const Tensor x = logits.detach().contiguous();
  const Tensor tg = target.detach().contiguous();
  const int64_t N = x.size(0);
  Tensor losses = empty({N}, x.options());
  // Per-row logsumexp in f64 whatever the logits' dtype: the backward's exp(x - lse) needs it exact.
  const Tensor lse = empty({N}, {DType::f64, x.device(), false});
  backend(x.device()).cross_entropy_forward(x, tg, label_smoothing, losses, lse);
  if (needs_grad({&logits})) {
    const double eps = label_smoothing;
    record("cross_entropy", {logits, target}, {losses}, [x, tg, lse, eps](const std::vector<Tensor>& g) {
      if (!g[0].defined()) return std::vector<Tensor>(2);
      // A mean's or sum's gradient arrives expanded (stride 0): the kernel reads it as it is.
      const Tensor gl = g[0].to(x.dtype());
      Tensor gx = empty(x.shape(), x.options());
      backend(x.device()).cross_entropy_backward(gl, x, tg, lse, eps, gx);
      return std::vector<Tensor>{gx, Tensor()};
    });
  }
  return reduce_loss(losses, reduction);
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
  const Tensor x = logits.detach().contiguous();
  const Tensor y = target.detach().contiguous();
  Tensor loss = empty(x.shape(), x.options());
  backend(x.device()).bce_with_logits_forward(x, y, loss);
  if (needs_grad({&logits, &target})) {
    // The stable formula's own derivative would go through |x| and max(x, 0); this node gives
    // d/dx = sigmoid(x) - y and d/dy = -x directly.
    const bool need_x = logits.requires_grad();
    const bool need_y = target.requires_grad();
    record(op, {logits, target}, {loss}, [x, y, need_x, need_y](const std::vector<Tensor>& g) {
      if (!g[0].defined()) return std::vector<Tensor>(2);
      Tensor gl = g[0].to(x.dtype());
      bool broadcast = true;   // one value expanded (a mean's gradient): no full-size copy
      for (int64_t s : gl.strides()) broadcast = broadcast && s == 0;
      if (!broadcast) gl = gl.contiguous();
      Tensor gx = need_x ? empty(x.shape(), x.options()) : Tensor();
      Tensor gy = need_y ? empty(x.shape(), x.options()) : Tensor();
      backend(x.device()).bce_with_logits_backward(gl, x, y, gx, gy);
      return std::vector<Tensor>{gx, gy};
    });
  }
  return reduce_loss(loss, reduction);
}

}  // namespace minidl
