// Batched GEMM through cuBLAS (cublasGemmStridedBatchedEx): f32 (TF32 tensor cores when allowed),
// f64, and f16 inputs with f32 accumulation. Row-major products are computed as the column-major
// product of the transposes (C^T = B^T A^T), so row- or column-major operands need no copy.
#include <algorithm>
#include <limits>

#include "kernels/cuda/context.cuh"
#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/launch_timer.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/workspace.h"

namespace minidl::cuda {
namespace {

// A row-major [rows, cols] operand with element strides (rs, cs), as cuBLAS sees it: the
// column-major matrix of its transpose (op N) or of itself (op T), with its leading dimension.
struct Operand {
  cublasOperation_t op;
  int64_t ld;
  bool ok;
};

Operand describe(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  if (cs == 1 && (rs >= cols || rows == 1)) return {CUBLAS_OP_N, std::max<int64_t>({rs, cols, 1}), true};
  if (rs == 1 && (cs >= rows || cols == 1)) return {CUBLAS_OP_T, std::max<int64_t>({cs, rows, 1}), true};
  return {CUBLAS_OP_N, 0, false};
}

int checked_int(int64_t v, const char* what) {
  MINIDL_CHECK(v <= std::numeric_limits<int>::max(), "matmul (cuda): ", what, " = ", v,
               " exceeds cuBLAS's 32-bit limit; split the product");
  return static_cast<int>(v);
}

}  // namespace

std::pair<bool, bool> matmul_operand_copies(const Tensor& a, const Tensor& b) {
  const int64_t M = a.size(1), K = a.size(2), N = b.size(2);
  return {!describe(M, K, a.strides()[1], a.strides()[2]).ok, !describe(K, N, b.strides()[1], b.strides()[2]).ok};
}

void CudaBackend::matmul(const Tensor& a_in, const Tensor& b_in, const Tensor& out) {
  check_cuda("matmul", {&a_in, &b_in, &out});
  check_contiguous("matmul", {&out});
  MINIDL_CHECK(a_in.dim() == 3 && b_in.dim() == 3 && out.dim() == 3 && a_in.size(0) == out.size(0) &&
                   b_in.size(0) == out.size(0) && a_in.size(1) == out.size(1) && b_in.size(2) == out.size(2) &&
                   a_in.size(2) == b_in.size(1),
               "matmul (cuda): expected a [B,M,K], b [B,K,N], out [B,M,N], got ", a_in.meta(), ", ", b_in.meta(),
               ", ", out.meta());
  MINIDL_CHECK(a_in.dtype() == out.dtype() && b_in.dtype() == out.dtype(), "matmul (cuda): dtypes differ: ",
               a_in.meta(), ", ", b_in.meta(), ", ", out.meta());
  const int64_t B = out.size(0), M = out.size(1), N = out.size(2), K = a_in.size(2);
  if (B == 0 || M == 0 || N == 0) return;
  if (K == 0) {
    fill(out, 0.0);
    return;
  }
  const std::pair<Tensor, Tensor> operands = common::gemm_operands(a_in, b_in, matmul_operand_copies(a_in, b_in));
  const Tensor &a = operands.first, &b = operands.second;
  const Operand oa = describe(M, K, a.strides()[1], a.strides()[2]);
  const Operand ob = describe(K, N, b.strides()[1], b.strides()[2]);
  DeviceContext& ctx = context_of(out);
  cudaDataType_t dt;
  cublasComputeType_t ct;
  switch (out.dtype()) {
    case DType::f32:
      dt = CUDA_R_32F;
      ct = allow_tf32_matmul() ? CUBLAS_COMPUTE_32F_FAST_TF32 : CUBLAS_COMPUTE_32F;
      break;
    case DType::f64:
      dt = CUDA_R_64F;
      ct = CUBLAS_COMPUTE_64F;
      break;
    case DType::f16:
      dt = CUDA_R_16F;
      ct = CUBLAS_COMPUTE_32F;   // f16 in and out, f32 accumulation
      break;
    case DType::bf16:
      dt = CUDA_R_16BF;
      ct = CUBLAS_COMPUTE_32F;   // bf16 in and out, f32 accumulation
      break;
    default:
      MINIDL_FAIL("matmul (cuda): dtype ", dtype_name(out.dtype()), " is not supported (f32, f64, f16, bf16)");
  }
  const float alpha32 = 1.0f, beta32 = 0.0f;
  const double alpha64 = 1.0, beta64 = 0.0;
  const void* alpha = out.dtype() == DType::f64 ? static_cast<const void*>(&alpha64) : &alpha32;
  const void* beta = out.dtype() == DType::f64 ? static_cast<const void*>(&beta64) : &beta32;
  cublasHandle_t h = ctx.cublas();
  MINIDL_CUBLAS_CHECK(cublasSetPointerMode(h, CUBLAS_POINTER_MODE_HOST));
  // Column-major: C^T [N, M] = B^T [N, K] * A^T [K, M].
  const ScopedLaunchTimer timer("cuBLAS gemm", "", ctx.stream());   // keyed as the step-time model keys it
  MINIDL_CUBLAS_CHECK(cublasGemmStridedBatchedEx(
      h, ob.op, oa.op, checked_int(N, "N"), checked_int(M, "M"), checked_int(K, "K"), alpha, b.data_ptr(), dt,
      checked_int(ob.ld, "ldb"), b.strides()[0], a.data_ptr(), dt, checked_int(oa.ld, "lda"), a.strides()[0], beta,
      out.data_ptr(), dt, checked_int(N, "ldc"), M * N, checked_int(B, "batch"), ct, CUBLAS_GEMM_DEFAULT));
}

}  // namespace minidl::cuda
