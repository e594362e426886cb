// f16 and bf16 on the CPU: the reference for every 16-bit float path, so mixed precision is
// testable without a GPU. Elementwise ops and reductions read f16 or bf16, compute in f32 (sums in
// double) and store their dtype; the heavy families (convolution, pooling, batch norm, softmax, and
// GEMM in f16) widen their 16-bit operands to f32 temporaries, run the f32 kernel unchanged and
// narrow the result: slow but exact to one rounding. "half" below means either 16-bit float.
#pragma once
#include <cstdint>
#include <type_traits>
#if defined(__F16C__)
#include <immintrin.h>
#endif

#include "core/dtype.h"
#include "core/tensor.h"
#include "kernels/common/dispatch.h"

namespace minidl::cpu {

// The arithmetic type of a storage type: f16 and bf16 compute in f32, everything else in itself (so
// the f32 and f64 loops are the same code as before the 16-bit floats existed).
template <typename T>
using compute_t = std::conditional_t<is_float16_v<T>, float, T>;

// Dtype dispatch (kernels/common/dispatch.h): dispatch_x(dtype, op, f) calls f(T{}) with T the
// C++ type of the dtype, Half for f16 and BFloat16 for bf16. The same names take the same dtypes
// on the CUDA backend, less bf16 there.
inline constexpr common::Dispatch<Half, common::DTypeFamily::All, BFloat16> dispatch_all{"cpu"};
inline constexpr common::Dispatch<Half, common::DTypeFamily::Floating, BFloat16> dispatch_floating{"cpu"};
inline constexpr common::Dispatch<Half, common::DTypeFamily::Arith, BFloat16> dispatch_arith{"cpu"};
// f32 and f64 only, for the kernels that widen 16-bit operands to f32 before they dispatch (matmul).
inline constexpr common::Dispatch<void, common::DTypeFamily::Floating> dispatch_wide{"cpu"};

// Contiguous f16 <-> f32 conversion, the inner loop of every f16 staging copy: the F16C
// instructions when the build has them (IEEE round-to-nearest-even, subnormals and inf exactly as
// Half; a NaN stays a quiet NaN), Half's scalar code otherwise.
inline void half_to_float(const Half* src, float* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  }
#endif
  for (; i < n; ++i) dst[i] = static_cast<float>(src[i]);
}

inline void float_to_half(const float* src, Half* dst, int64_t n) {
  int64_t i = 0;
#if defined(__F16C__)
  for (; i + 8 <= n; i += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
#endif
  for (; i < n; ++i) dst[i] = Half(src[i]);
}

// The same for bf16: a shift one way, BFloat16's integer rounding the other; plain loops the
// compiler vectorises, so subnormals round exactly as the scalar code (the AVX-512 BF16 convert
// instruction would flush them to zero).
inline void half_to_float(const BFloat16* src, float* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] = BFloat16::to_float(src[i].bits);
}

inline void float_to_half(const float* src, BFloat16* dst, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i].bits = BFloat16::from_float(src[i]);
}

// An f16 or bf16 tensor: the dtypes that stage through f32 in the heavy families.
inline bool is_half(const Tensor& t) { return t.defined() && is_float16(t.dtype()); }

// A contiguous f32 copy of an f16 or bf16 tensor (through the allocator, so memory statistics see
// it); any other tensor, or an undefined one, is returned as it is.
Tensor widen_half(const Tensor& t);
// An f32 tensor of t's shape to compute into when t is f16 or bf16; t itself otherwise.
Tensor f32_output_for(const Tensor& t);
// Writes an f32 result back into its 16-bit destination (nothing when they are the same tensor).
void narrow_into(const Tensor& result, const Tensor& dst);
// The 16-bit path of a kernel that computes in f32: run(f) computes into f = f32_output_for(out),
// which is then rounded into out once. f is allocated before run widens any operand, as the meta
// device's model of this path counts it (kernels/cpu/conv_workspace.cpp).
template <typename Run>
void in_f32(const Tensor& out, Run&& run) {
  const Tensor f = f32_output_for(out);
  run(f);
  narrow_into(f, out);
}

}  // namespace minidl::cpu
