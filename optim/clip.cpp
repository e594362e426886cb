// clip_grad_norm with minidl ops so it runs wherever the gradients live (CPU or CUDA) and costs one
// host sync for the whole model, like PyTorch's foreach path, rather than one per parameter; its
// device form keeps the norm and the clip factor on the device, so a captured step can clip.
#include "optim/clip.h"

#include <cmath>
#include <limits>
#include <set>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"

namespace minidl::optim {

namespace {

bool is_inf_norm(double norm_type) { return norm_type == std::numeric_limits<double>::infinity(); }

// The arguments' checks and the gradients to clip, shared by both forms.
std::vector<Tensor> gradients_to_clip(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  MINIDL_CHECK(std::isfinite(max_norm) && max_norm >= 0.0, "clip_grad_norm: max_norm ", max_norm,
               " must be a finite number >= 0 (e.g. 1.0)");
  MINIDL_CHECK(is_inf_norm(norm_type) || (std::isfinite(norm_type) && norm_type > 0.0), "clip_grad_norm: norm_type ",
               norm_type, " is not supported; use a finite p > 0 (2 for the Euclidean norm) or infinity for the max-norm");
  std::vector<Tensor> grads;
  std::set<const TensorImpl*> seen;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    MINIDL_CHECK(p.defined(), "clip_grad_norm: parameter ", i, " is an undefined Tensor; pass only real parameters");
    // A parameter listed twice would count twice in the norm and be clipped twice.
    MINIDL_CHECK(seen.insert(p.impl_ptr().get()).second, "clip_grad_norm: parameter ", i, " (", p.meta(),
                 ") is listed twice; pass each parameter once");
    const Tensor g = p.grad();
    if (!g.defined() || g.numel() == 0) continue;
    MINIDL_CHECK(is_floating(g.dtype()), "clip_grad_norm: the gradient of parameter ", i, " is ", g.meta(),
                 ", not floating point");
    grads.push_back(g);
  }
  return grads;
}

// Per-gradient partial results (sum of |g|^p, or max |g|) combined in f64 on the first gradient's
// device; 16-bit gradients are widened first (f16's squares overflow, bf16's sums lose the small terms).
Tensor partial_norms(const std::vector<Tensor>& grads, double norm_type) {
  const bool inf_norm = is_inf_norm(norm_type);
  const Device dev = grads[0].device();
  Tensor acc;
  for (const Tensor& g0 : grads) {
    const Tensor g = is_float16(g0.dtype()) ? g0.to(DType::f32) : g0;
    Tensor part;
    if (inf_norm) {
      part = max(abs(g));
    } else if (norm_type == 2.0) {
      part = sum(square(g));
    } else if (norm_type == 1.0) {
      part = sum(abs(g));
    } else {
      part = sum(pow(abs(g), norm_type));
    }
    part = part.to(dev).to(DType::f64);
    acc = !acc.defined() ? part : (inf_norm ? maximum(acc, part) : acc + part);
  }
  return acc;
}

// g *= coef: a double on the host, or a 0-dim f64 tensor on the device, rounded either way to the
// dtype it multiplies (as a scalar operand is); 16-bit gradients are scaled in f32.
double as_operand(double coef, DType) { return coef; }
Tensor as_operand(const Tensor& coef, DType dtype) { return coef.to(dtype); }

template <typename Coef>
void scale_gradients(std::vector<Tensor>& grads, const Coef& coef) {
  for (Tensor& g : grads) {
    if (is_float16(g.dtype())) {
      g.copy_(g.to(DType::f32).mul_(as_operand(coef, DType::f32)));
    } else {
      g.mul_(as_operand(coef, g.dtype()));
    }
  }
}

}  // namespace

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type,
                      bool error_if_nonfinite, const std::function<double(double)>& reduce_total) {
  NoGradGuard no_grad;
  std::vector<Tensor> grads = gradients_to_clip(params, max_norm, norm_type);
  if (grads.empty()) return reduce_total ? reduce_total(0.0) : 0.0;
  const double reduced = partial_norms(grads, norm_type).item();
  const double local = is_inf_norm(norm_type) ? reduced
                       : norm_type == 2.0     ? std::sqrt(reduced)
                       : norm_type == 1.0     ? reduced
                                              : std::pow(reduced, 1.0 / norm_type);
  const double total = reduce_total ? reduce_total(local) : local;
  MINIDL_CHECK(!error_if_nonfinite || std::isfinite(total), "clip_grad_norm: the total norm of order ", norm_type,
               " of the gradients of ", grads.size(), " parameters is non-finite (", total,
               "); skip this step (e.g. with the gradient scaler) or pass error_if_nonfinite = false");

  const double clip_coef = max_norm / (total + 1e-6);
  // Written as !(coef >= 1) so a NaN coefficient (NaN gradients) propagates into the gradients as
  // in PyTorch, instead of silently leaving them as they were.
  if (!(clip_coef >= 1.0)) scale_gradients(grads, clip_coef);
  return total;
}

Tensor clip_grad_norm_device(const std::vector<Tensor>& params, double max_norm, double norm_type) {
  NoGradGuard no_grad;
  std::vector<Tensor> grads = gradients_to_clip(params, max_norm, norm_type);
  if (grads.empty()) return Tensor();
  const Tensor reduced = partial_norms(grads, norm_type);
  // The host form's arithmetic as f64 ops (sqrt and division round correctly in both).
  const Tensor total = is_inf_norm(norm_type) || norm_type == 1.0 ? reduced
                       : norm_type == 2.0                           ? sqrt(reduced)
                                                                    : pow(reduced, 1.0 / norm_type);
  const Tensor coef = max_norm / (total + 1e-6);
  // minimum propagates NaN, as the host form's !(coef >= 1) does; a factor of 1 changes nothing.
  scale_gradients(grads, minimum(coef, ones_like(coef)));
  return total;
}

}  // namespace minidl::optim
