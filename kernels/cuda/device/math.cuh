// Precise (non-intrinsic) libm functions of CUDA picked by type, shared by the elementwise, softmax
// and loss kernels so each formula reads as its CPU counterpart does. The global-namespace names
// (::expf) keep minidl's tensor ops of the same names from being found first.
#pragma once

namespace minidl::cuda {

__device__ __forceinline__ float d_exp(float x) { return ::expf(x); }
__device__ __forceinline__ double d_exp(double x) { return ::exp(x); }
__device__ __forceinline__ float d_log(float x) { return ::logf(x); }
__device__ __forceinline__ double d_log(double x) { return ::log(x); }
__device__ __forceinline__ float d_log1p(float x) { return ::log1pf(x); }
__device__ __forceinline__ double d_log1p(double x) { return ::log1p(x); }
__device__ __forceinline__ float d_sqrt(float x) { return ::sqrtf(x); }
__device__ __forceinline__ double d_sqrt(double x) { return ::sqrt(x); }
__device__ __forceinline__ float d_abs(float x) { return ::fabsf(x); }
__device__ __forceinline__ double d_abs(double x) { return ::fabs(x); }
__device__ __forceinline__ float d_tanh(float x) { return ::tanhf(x); }
__device__ __forceinline__ double d_tanh(double x) { return ::tanh(x); }
__device__ __forceinline__ float d_pow(float x, float y) { return ::powf(x, y); }
__device__ __forceinline__ double d_pow(double x, double y) { return ::pow(x, y); }

}  // namespace minidl::cuda
