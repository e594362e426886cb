// CPU random fills from the shared Philox stream: element i depends only on (seed, offset, i), so
// the numbers are the same for any thread count and on the CUDA backend.
#include "core/philox.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/strided.h"

namespace minidl::cpu {

void CpuBackend::random(RandomKind kind, const Tensor& out, uint64_t seed, uint64_t offset, double a, double b) {
  MINIDL_CHECK(out.is_contiguous(), "random: the output must be contiguous");
  const int64_t n = out.numel();
  dispatch_all(out.dtype(), "random", [&](auto tag) {
    using T = decltype(tag);
    T* o = out.data<T>();
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t i = 0; i < n; ++i) {
      const uint64_t u = static_cast<uint64_t>(i);
      double v = 0;
      switch (kind) {
        case RandomKind::Uniform: v = a + (b - a) * philox::uniform_at(seed, offset, u); break;
        case RandomKind::Normal: v = a + b * philox::normal_at(seed, offset, u); break;
        case RandomKind::Bernoulli: v = philox::uniform_at(seed, offset, u) < a ? 1.0 : 0.0; break;
      }
      o[i] = convert<T>(v);
    }
  });
}

}  // namespace minidl::cpu
