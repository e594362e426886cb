// CPU random fills from the shared Philox stream: element i depends only on (seed, offset, i), so
// the numbers are the same for any thread count and on the CUDA backend.
#include "core/philox.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/strided.h"

namespace minidl::cpu {

void CpuBackend::random(RandomKind kind, const Tensor& out, uint64_t seed, uint64_t offset, double a, double b) {
  MINIDL_CHECK(out.is_contiguous(), "random: the output must be contiguous");
  const int64_t n = out.numel();
  const int64_t num_ctr = static_cast<int64_t>(philox::counters_for(static_cast<uint64_t>(n)));
  dispatch_all(out.dtype(), "random", [&](auto tag) {
    using T = decltype(tag);
    T* o = out.data<T>();
    // One Philox draw gives the four consecutive elements 4c .. 4c+3 (same values as *_at(i)).
#pragma omp parallel for schedule(static) if (n > 65536)
    for (int64_t c = 0; c < num_ctr; ++c) {
      const philox::U4 u = philox::draw(seed, offset + static_cast<uint64_t>(c));
      double v[4];
      if (kind == RandomKind::Normal) {
        philox::normals4(u, v);
        for (double& x : v) x = a + b * x;
      } else {
        for (int k = 0; k < 4; ++k) {
          const double r = philox::uniform01(philox::word(u, k));
          v[k] = kind == RandomKind::Uniform ? a + (b - a) * r : (r < a ? 1.0 : 0.0);
        }
      }
      const int64_t end = std::min<int64_t>(4, n - 4 * c);
      for (int64_t k = 0; k < end; ++k) o[4 * c + k] = convert<T>(v[k]);
    }
  });
}

}  // namespace minidl::cpu
