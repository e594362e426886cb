// The default Backend::unscale_grads, composed from the kernels every backend already has, so a
// backend without a fused version still gives GradScaler the right answer without a host
// synchronisation (the CPU and CUDA backends override it with one pass over all gradients).
#include "core/backend.h"

namespace minidl {

void Backend::unscale_grads(const std::vector<Tensor>& grads, double inv_scale, const Tensor& found_inf) {
  MINIDL_CHECK(found_inf.defined() && found_inf.numel() == 1 && found_inf.dtype() == DType::f32,
               "unscale_grads: found_inf must be a one-element f32 tensor, got ",
               found_inf.defined() ? found_inf.meta() : std::string("an undefined tensor"));
  const Tensor flag = found_inf.detach().reshape({1});
  for (const Tensor& g0 : grads) {
    if (!g0.defined() || g0.numel() == 0) continue;
    const Tensor g = g0.detach();
    MINIDL_CHECK(is_floating(g.dtype()), "unscale_grads: gradient ", g.meta(), " is not floating");
    // max |g| is inf or NaN exactly when some element is; times 0 that is NaN, else 0; NaN != NaN
    // turns it into the flag.
    Tensor a = empty(g.shape(), g.options());
    unary(UnaryOp::Abs, g, a, 0.0);
    std::vector<int64_t> dims;
    Shape ones;
    for (int64_t d = 0; d < g.dim(); ++d) {
      dims.push_back(d);
      ones.push_back(1);
    }
    Tensor m = empty(ones, g.options());
    reduce(ReduceOp::Max, a, dims, m);
    m = m.reshape({1});
    Tensor zero = empty({1}, g.options());
    fill(zero, 0.0);
    Tensor z = empty({1}, g.options());
    binary(BinaryOp::Mul, m, zero, z, 1.0);
    Tensor bad = empty({1}, {DType::boolean, g.device(), false});
    binary(BinaryOp::Ne, z, z, bad, 1.0);
    Tensor badf = empty({1}, flag.options());
    copy(bad, badf);
    binary(BinaryOp::Maximum, flag, badf, flag, 1.0);
    Tensor s = empty({1}, g.options());
    fill(s, inv_scale);
    binary(BinaryOp::Mul, g, s.expand(g.shape()), g, 1.0);
  }
}

void Backend::unscale_grads_device(const std::vector<Tensor>&, const Tensor&, const Tensor&) {
  MINIDL_FAIL("unscale_grads_device (", name(), "): the gradient scaler's device state (for CUDA graphs) needs a "
              "CUDA device; on ", name(), " the scaler keeps its scale on the host");
}

void Backend::update_scale_device(const Tensor&, const Tensor&, const Tensor&, double, double, int64_t) {
  MINIDL_FAIL("update_scale_device (", name(), "): the gradient scaler's device state (for CUDA graphs) needs a "
              "CUDA device; on ", name(), " the scaler keeps its scale on the host");
}

}  // namespace minidl
