// bn_finalize (core/conv_bn.h) on the GPU: a convolution that carries batch norm hands the next one
// its batch norm as a per-channel scale and shift, from the sums it emitted. Composed, that is a
// dozen per-channel ops forward and twice as many in autograd's backward, each a launch of a few
// hundred threads: in a ResNet-50 step, over two thousand launches for microseconds of work. Here
// each direction is one launch, a thread per channel, with the composition's arithmetic in the
// statistics' dtype and in its order (core/ops_conv_bn.cpp), so the two agree to rounding.
#include <type_traits>

#include "kernels/cuda/context.cuh"
#include "kernels/cuda/conv_stats_support.h"
#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/device/common.cuh"
#include "kernels/cuda/device/launch.cuh"

namespace minidl::cuda {
namespace {

template <typename T>
T* data_of(const Tensor& t) {
  return t.defined() ? static_cast<T*>(const_cast<void*>(t.data_ptr())) : nullptr;
}

// 1 / sqrt(var + eps), correctly rounded in T (sqrtf for f32, as the composed f32 op).
template <typename T>
__device__ T inv_std(T var, T eps) {
  if constexpr (std::is_same_v<T, float>) return 1.0f / sqrtf(var + eps);
  else return 1.0 / ::sqrt(var + eps);
}

// What the forward and the backward share: the batch's mean and biased variance, unclamped.
template <typename T>
struct Moments {
  T mean, var;
};
template <typename T>
__device__ Moments<T> moments(const T* sum, const T* sumsq, int64_t c, T inv_n) {
  const T mean = sum[c] * inv_n;
  return {mean, sumsq[c] * inv_n - mean * mean};
}

template <typename T>
__global__ void bn_finalize_forward_kernel(const T* sum, const T* sumsq, const T* weight, const T* bias, T* rm, T* rv,
                                           T* scale, T* shift, int64_t channels, T inv_n, T eps, T keep, T momentum,
                                           T unbias) {
  MINIDL_GRID_STRIDE(c, channels) {
    const Moments<T> m = moments(sum, sumsq, c, inv_n);
    const T var = m.var > T(0) ? m.var : T(0);   // E[y^2] - E[y]^2 can round below zero
    const T invstd = inv_std(var, eps);
    const T s = weight != nullptr ? weight[c] * invstd : invstd;
    const T neg = -(m.mean * s);
    scale[c] = s;
    shift[c] = bias != nullptr ? bias[c] + neg : neg;
    if (rm != nullptr) {
      rm[c] = rm[c] * keep + m.mean * momentum;
      rv[c] = rv[c] * keep + var * unbias;
    }
  }
}

// scale = w * invstd and shift = b - mean * scale, with invstd = (var + eps)^-1/2, var = sumsq / n -
// mean^2 (zero gradient where clamped) and mean = sum / n, differentiated by hand.
template <typename T>
__global__ void bn_finalize_backward_kernel(const T* gscale, const T* gshift, const T* sum, const T* sumsq,
                                            const T* weight, T* gsum, T* gsumsq, T* gweight, T* gbias,
                                            int64_t channels, T inv_n, T eps) {
  MINIDL_GRID_STRIDE(c, channels) {
    const Moments<T> m = moments(sum, sumsq, c, inv_n);
    const T var = m.var > T(0) ? m.var : T(0);
    const T invstd = inv_std(var, eps);
    const T w = weight != nullptr ? weight[c] : T(1);
    const T gs = gscale != nullptr ? gscale[c] : T(0);
    const T gb = gshift != nullptr ? gshift[c] : T(0);
    const T g_affine = gs - m.mean * gb;   // what reaches w * invstd
    if (gbias != nullptr) gbias[c] = gb;
    if (gweight != nullptr) gweight[c] = g_affine * invstd;
    const T g_invstd = w * g_affine;
    const T g_var = m.var > T(0) ? T(-0.5) * g_invstd * invstd * invstd * invstd : T(0);
    const T g_mean = -(w * invstd) * gb - T(2) * m.mean * g_var;
    if (gsum != nullptr) gsum[c] = g_mean * inv_n;
    if (gsumsq != nullptr) gsumsq[c] = g_var * inv_n;
  }
}

}  // namespace

bool CudaBackend::bn_finalize_forward(const Tensor& sum, const Tensor& sumsq, const Tensor& weight, const Tensor& bias,
                                      const Tensor& running_mean, const Tensor& running_var, int64_t count,
                                      double momentum, double eps, const Tensor& scale, const Tensor& shift) {
  check_cuda("bn_finalize", {&sum, &sumsq, &weight, &bias, &running_mean, &running_var, &scale, &shift});
  if (!bn_finalize_fused(sum, count, {&sumsq, &weight, &bias, &running_mean, &running_var, &scale, &shift}) ||
      running_mean.defined() != running_var.defined())
    return false;
  const int64_t channels = sum.size(0);
  if (channels == 0) return true;
  const double n = static_cast<double>(count);
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    MINIDL_LAUNCH_NOWAIT("bn_finalize", bn_finalize_forward_kernel<T>, grid_for(channels), kThreads, 0,
                         context_of(sum).stream(), data_of<T>(sum), data_of<T>(sumsq), data_of<T>(weight),
                         data_of<T>(bias), data_of<T>(running_mean), data_of<T>(running_var), data_of<T>(scale),
                         data_of<T>(shift), channels, static_cast<T>(1.0 / n), static_cast<T>(eps),
                         static_cast<T>(1.0 - momentum), static_cast<T>(momentum),
                         static_cast<T>(momentum * n / (n - 1.0)));
  };
  if (sum.dtype() == DType::f32) launch(float{});
  else launch(double{});
  return true;
}

bool CudaBackend::bn_finalize_backward(const Tensor& gscale, const Tensor& gshift, const Tensor& sum,
                                       const Tensor& sumsq, const Tensor& weight, int64_t count, double eps,
                                       const Tensor& gsum, const Tensor& gsumsq, const Tensor& gweight,
                                       const Tensor& gbias) {
  check_cuda("bn_finalize backward", {&gscale, &gshift, &sum, &sumsq, &weight, &gsum, &gsumsq, &gweight, &gbias});
  if (!bn_finalize_fused(sum, count, {&gscale, &gshift, &sumsq, &weight, &gsum, &gsumsq, &gweight, &gbias}))
    return false;
  const int64_t channels = sum.size(0);
  if (channels == 0) return true;
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    MINIDL_LAUNCH_NOWAIT("bn_finalize backward", bn_finalize_backward_kernel<T>, grid_for(channels), kThreads, 0,
                         context_of(sum).stream(), data_of<T>(gscale), data_of<T>(gshift), data_of<T>(sum),
                         data_of<T>(sumsq), data_of<T>(weight), data_of<T>(gsum), data_of<T>(gsumsq),
                         data_of<T>(gweight), data_of<T>(gbias), channels,
                         static_cast<T>(1.0 / static_cast<double>(count)), static_cast<T>(eps));
  };
  if (sum.dtype() == DType::f32) launch(float{});
  else launch(double{});
  return true;
}

}  // namespace minidl::cuda
