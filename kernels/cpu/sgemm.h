// minidl's own single-precision GEMM for CPUs with AVX-512. Eigen's product kernel
// (mr 48 x nr 4: 12 accumulators, 7 loads per 12 FMAs) reached about 72% of the FMA peak inside
// the ResNet convolutions on the Zen 5 development machine, and the convolutions' GEMMs are half
// of a ResNet step. This one is the classic five-loop, packed design (Goto, BLIS) with an
// 8 x 32 register tile and vectorised packing of transposed operands, which the convolution's
// weight gradient needs: 77-91% of one core's peak on the conv shapes where Eigen ran at 51-65%
// (single thread, same machine, /tmp micro-benchmark of the development session).
//
// It is single-threaded: callers split a product over their own threads by blocks of the result
// (conv_gemm.h, matmul.cpp), as they did with Eigen. Builds without AVX-512 (MINIDL_NATIVE=OFF
// or another CPU) keep Eigen: kSgemmAvailable says which one runs. The result differs from
// Eigen's in the last bits (another order of the sums); tests compare with tolerances.
#pragma once
#include <cstdint>
#include <type_traits>

namespace minidl::cpu {

#if defined(__AVX512F__)
inline constexpr bool kSgemmAvailable = true;
#else
inline constexpr bool kSgemmAvailable = false;
#endif

// C[m x n] = A[m x k] * B[k x n], or C += A * B when accumulate. Element (i, p) of A is at
// a[i * a_rs + p * a_cs], element (p, j) of B at b[p * b_rs + j * b_cs], element (i, j) of C at
// c[i * ldc + j] (C is row-major). Any strides work; unit a_cs or a_rs, and unit b_cs or b_rs, take
// the vectorised packing. k == 0 writes zeros (or leaves C as it is when accumulating).
// Throws when called in a build without AVX-512 (check kSgemmAvailable first).
void sgemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b, int64_t b_rs,
           int64_t b_cs, float* c, int64_t ldc, bool accumulate);

// dst = lhs * rhs (or +=) for Eigen expressions with direct access (maps, blocks, transposes): f32
// with a row-major dst goes to sgemm where it is available, anything else to Eigen's product,
// single-threaded either way when called inside a parallel region.
template <typename Dst, typename Lhs, typename Rhs>
void product(Dst&& dst, const Lhs& lhs, const Rhs& rhs, bool accumulate) {
  using T = typename std::decay_t<Dst>::Scalar;
  if constexpr (kSgemmAvailable && std::is_same_v<T, float>) {
    if (dst.colStride() == 1 || dst.cols() == 1) {
      return sgemm(dst.rows(), dst.cols(), lhs.cols(), lhs.data(), lhs.rowStride(), lhs.colStride(), rhs.data(),
                   rhs.rowStride(), rhs.colStride(), dst.data(), dst.rowStride(), accumulate);
    }
  }
  if (accumulate) {
    dst.noalias() += lhs * rhs;
  } else {
    dst.noalias() = lhs * rhs;
  }
}

}  // namespace minidl::cpu
