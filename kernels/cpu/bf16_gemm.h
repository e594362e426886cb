// The bf16 GEMM of the CPU backend: AVX-512 BF16 dot products (vdpbf16ps) where the CPU has them,
// and a scalar loop elsewhere that follows the instruction's arithmetic step for step, so both
// give the same bits and a result does not depend on the machine that computed it.
#pragma once
#include "core/tensor.h"

namespace minidl::cpu {

enum class Bf16GemmPath { Auto, Scalar, Avx512Bf16 };

// Whether this build and this CPU run the AVX-512 BF16 path (a runtime check: the build runs on
// CPUs without the instructions too).
bool bf16_dot_instructions();

// out[i] = a[i] @ b[i] for bf16 a [B, M, K], b [B, K, N] and out [B, M, N], any strides. Each
// output accumulates in f32 over pairs of K (the odd product of a pair first, as vdpbf16ps does),
// bf16 subnormal inputs count as zero and subnormal partial sums flush to zero (the instruction's
// rule, kept by the scalar path too); the sum is rounded to bf16 once, a NaN as the quiet NaN.
// Auto takes the instructions when bf16_dot_instructions(); Avx512Bf16 without them throws.
void bf16_matmul(const Tensor& a, const Tensor& b, const Tensor& out, Bf16GemmPath path = Bf16GemmPath::Auto);

}  // namespace minidl::cpu
