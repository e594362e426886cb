// The CPU side of dynamic loss scaling: one pass over every gradient tensor that multiplies by
// 1/scale and notes whether any element was inf or NaN, the work PyTorch's
// _amp_foreach_non_finite_check_and_unscale_ does. f16 gradients (pure-f16 mode) compute in f32.
#include <cmath>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/strided.h"

namespace minidl::cpu {

void CpuBackend::unscale_grads(const std::vector<Tensor>& grads, double inv_scale, const Tensor& found_inf) {
  MINIDL_CHECK(found_inf.defined() && found_inf.numel() == 1 && found_inf.dtype() == DType::f32,
               "unscale_grads (cpu): found_inf must be a one-element f32 tensor, got ",
               found_inf.defined() ? found_inf.meta() : std::string("an undefined tensor"));
  bool bad = false;
  for (const Tensor& g : grads) {
    if (!g.defined() || g.numel() == 0) continue;
    const auto plan = make_plan<1>(g.shape(), {&g.strides()});
    dispatch_floating(g.dtype(), "unscale_grads", [&](auto tag) {
      using T = decltype(tag);
      using C = compute_t<T>;
      const C inv = static_cast<C>(inv_scale);
      // Runs are processed by several threads; each ORs into its own flag, merged below.
      std::vector<char> flags(static_cast<size_t>(std::max(1, omp_get_max_threads())), 0);
      for_each_run<1>(plan, {static_cast<char*>(g.data_ptr())}, {sizeof(T)},
                      [&](const std::array<char*, 1>& p, int64_t n, const std::array<int64_t, 1>& st) {
                        bool nf = false;
                        char* d = p[0];
                        for (int64_t i = 0; i < n; ++i, d += st[0]) {
                          T& v = *reinterpret_cast<T*>(d);
                          const C c = C(v);
                          nf |= !std::isfinite(c);  // checked before scaling, as PyTorch
                          v = T(c * inv);
                        }
                        if (nf) flags[static_cast<size_t>(omp_get_thread_num())] = 1;
                      });
      for (char f : flags) bad = bad || f != 0;
    });
  }
  if (bad) found_inf.data<float>()[0] = 1.0f;
}

}  // namespace minidl::cpu
