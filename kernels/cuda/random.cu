// CUDA random fills from the Philox stream of core/philox.h: thread c computes counter c and
// writes elements 4c..4c+3, exactly as the CPU does, so a seed gives the same tensor on both
// backends (uniform and Bernoulli bit for bit; normal up to the last bit of the libm functions).
#include "core/philox.h"
#include "kernels/cuda/context.cuh"
#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/device/common.cuh"
#include "kernels/cuda/device/launch.cuh"

namespace minidl::cuda {
namespace {

// a + scale * x is spelled with __dadd_rn/__dmul_rn: nvcc would otherwise fuse it into one FMA
// (one rounding) where the CPU's portable build rounds twice, and f64 draws over a range that is
// not a power of two would differ in the last bit.
template <typename T>
__global__ void random_kernel(RandomKind kind, T* out, int64_t n, uint64_t seed, uint64_t offset, double a,
                              double b) {
  const int64_t num_ctr = (n + 3) / 4;
  MINIDL_GRID_STRIDE(c, num_ctr) {
    const philox::U4 u = philox::draw(seed, offset + static_cast<uint64_t>(c));
    double v[4];
    if (kind == RandomKind::Normal) {
      philox::normals4(u, v);
#pragma unroll
      for (int k = 0; k < 4; ++k) v[k] = __dadd_rn(a, __dmul_rn(b, v[k]));
    } else {
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const double r = philox::uniform01(philox::word(u, k));
        v[k] = kind == RandomKind::Uniform ? __dadd_rn(a, __dmul_rn(b - a, r)) : (r < a ? 1.0 : 0.0);
      }
    }
    const int64_t end = n - 4 * c < 4 ? n - 4 * c : 4;
    for (int64_t k = 0; k < end; ++k) out[4 * c + k] = cvt<T>(v[k]);
  }
}

}  // namespace

void CudaBackend::random(RandomKind kind, const Tensor& out, uint64_t seed, uint64_t offset, double a, double b) {
  check_cuda("random", {&out});
  check_contiguous("random", {&out});
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceContext& ctx = context_of(out);
  dispatch_all(out.dtype(), "random", [&](auto tag) {
    using T = decltype(tag);
    MINIDL_LAUNCH_NOWAIT("random", (random_kernel<T>), grid_for((n + 3) / 4), kThreads, 0, ctx.stream(), kind,
                         static_cast<T*>(out.data_ptr()), n, seed, offset, a, b);
  });
}

}  // namespace minidl::cuda
