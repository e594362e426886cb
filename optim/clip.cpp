// clip_grad_norm with minidl ops so it runs wherever the gradients live (CPU or CUDA) and costs one
// host sync for the whole model, like PyTorch's foreach path, rather than one per parameter.
#include "optim/clip.h"

#include <cmath>
#include <limits>
#include <set>

#include "core/autograd.h"
#include "core/error.h"
#include "core/ops.h"

namespace minidl::optim {

double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type,
                      bool error_if_nonfinite, const std::function<double(double)>& reduce_total) {
  MINIDL_CHECK(std::isfinite(max_norm) && max_norm >= 0.0, "clip_grad_norm: max_norm ", max_norm,
               " must be a finite number >= 0 (e.g. 1.0)");
  const bool inf_norm = norm_type == std::numeric_limits<double>::infinity();
  MINIDL_CHECK(inf_norm || (std::isfinite(norm_type) && norm_type > 0.0), "clip_grad_norm: norm_type ", norm_type,
               " is not supported; use a finite p > 0 (2 for the Euclidean norm) or infinity for the max-norm");
  NoGradGuard no_grad;

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
  if (grads.empty()) return reduce_total ? reduce_total(0.0) : 0.0;

  // Per-gradient partial results (sum of |g|^p, or max |g|) are combined in f64 on the first
  // gradient's device; f16 gradients are widened first because their squares overflow f16.
  const Device dev = grads[0].device();
  Tensor acc;
  for (const Tensor& g0 : grads) {
    const Tensor g = g0.dtype() == DType::f16 ? g0.to(DType::f32) : g0;
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
  const double reduced = acc.item();
  const double local = inf_norm ? reduced
                       : norm_type == 2.0 ? std::sqrt(reduced)
                       : norm_type == 1.0 ? reduced
                                          : std::pow(reduced, 1.0 / norm_type);
  const double total = reduce_total ? reduce_total(local) : local;
  MINIDL_CHECK(!error_if_nonfinite || std::isfinite(total), "clip_grad_norm: the total norm of order ", norm_type,
               " of the gradients of ", grads.size(), " parameters is non-finite (", total,
               "); skip this step (e.g. with the gradient scaler) or pass error_if_nonfinite = false");

  const double clip_coef = max_norm / (total + 1e-6);
  // Written as !(coef >= 1) so a NaN coefficient (NaN gradients) propagates into the gradients as
  // in PyTorch, instead of silently leaving them as they were.
  if (!(clip_coef >= 1.0)) {
    for (Tensor& g : grads) {
      if (g.dtype() == DType::f16) {
        g.copy_(g.to(DType::f32).mul_(clip_coef));
      } else {
        g.mul_(clip_coef);
      }
    }
  }
  return total;
}

}  // namespace minidl::optim
