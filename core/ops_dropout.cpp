// The dropout front-end. Its mask comes from a counter-based (seed, offset) range of a Generator,
// so the same seed gives the same mask on any thread count or device, and checkpoint recompute can
// replay it by restoring the generator's offset.
#include "core/autograd.h"
#include "core/backend.h"
#include "core/generator.h"
#include "core/ops.h"

namespace minidl {

// p == 1 gives zeros (and zero gradients) as in PyTorch, without drawing random numbers.
Tensor dropout(const Tensor& x, double p, bool training, Generator* gen) {
  MINIDL_CHECK(x.defined(), "dropout: the input is an undefined tensor");
  MINIDL_CHECK(p >= 0.0 && p <= 1.0, "dropout: probability p = ", p,
               " must be in [0, 1] (it is the probability of zeroing an element, not of keeping it)");
  if (!training || p == 0.0) return x;
  const DType dt = x.dtype();
  const bool ok = is_floating(dt);
  MINIDL_CHECK(ok, "dropout: input ", shape_str(x.shape()), " has dtype ", dtype_name(dt), " on ", x.device().str(),
               ", but only f32, f64, f16 and bf16 are supported; convert it with .to(DType::f32)");

  // The mask holds 0 or 1/(1-p), so forward and backward are one multiply each.
  Tensor mask = empty(x.shape(), x.options());
  Backend& be = backend(x.device());
  if (p == 1.0) {
    be.fill(mask, 0.0);
  } else {
    Generator& g = gen != nullptr ? *gen : default_generator();
    const uint64_t seed = g.seed();
    const uint64_t offset = g.reserve(static_cast<uint64_t>(x.numel()));
    be.random(RandomKind::Bernoulli, mask, seed, offset, 1.0 - p, 0.0);
    mask.mul_(1.0 / (1.0 - p));
  }
  Tensor out;
  {
    NoGradGuard no_grad;
    out = mul(x.detach(), mask);
  }
  if (needs_grad({&x})) {
    record("dropout", {x}, {out}, [mask](const std::vector<Tensor>& g) {
      if (!g[0].defined()) return std::vector<Tensor>(1);
      return std::vector<Tensor>{mul(g[0], mask)};
    });
  }
  return out;
}

}  // namespace minidl
