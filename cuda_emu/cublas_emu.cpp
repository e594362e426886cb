// cuBLAS stand-ins for the emulated device: exactly the calls the backend makes (handles, stream,
// workspace, pointer mode, cublasGemmStridedBatchedEx, status strings), with the real headers'
// signatures. Each call checks its arguments against cuBLAS's documented contract and returns the
// library's status for a bad one; GEMM then computes with naive loops accumulating in f64.
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <stdexcept>
#include <vector>

#include "cuda_emu/call_log.h"
#include "cuda_emu/emu_libs_internal.h"

struct cublasContext {
  cudaStream_t stream = nullptr;
  minidl::cuda::emu::CublasWorkspace workspace;
  cublasPointerMode_t pointer_mode = CUBLAS_POINTER_MODE_HOST;
};

namespace minidl::cuda::emu {
namespace detail {
namespace {

Registry<cublasContext>& handles() { return registry_of<cublasContext>(); }

// NOT_INITIALIZED is what cuBLAS documents for a handle it does not know.
cublasStatus_t check_handle(const char* fn, cublasHandle_t h) {
  if (h == nullptr) return fail(CUBLAS_STATUS_NOT_INITIALIZED, cat(fn, ": handle is NULL (call cublasCreate first)"));
  const ObjState s = handles().state(h);
  if (s != ObjState::Live)
    return fail(CUBLAS_STATUS_NOT_INITIALIZED, cat(fn, ": handle ", static_cast<const void*>(h), " is ", state_word(s)));
  return CUBLAS_STATUS_SUCCESS;
}

bool elem_of(cudaDataType t, Elem& e) {
  switch (t) {
    case CUDA_R_16F: e = Elem::F16; return true;
    case CUDA_R_16BF: e = Elem::BF16; return true;
    case CUDA_R_32F: e = Elem::F32; return true;
    case CUDA_R_64F: e = Elem::F64; return true;
    case CUDA_R_8I: e = Elem::I8; return true;
    case CUDA_R_32I: e = Elem::I32; return true;
    default: return false;
  }
}

// cublasGemmEx's table of legal (compute type, A/B type, C type), real types only; the scale
// type (alpha, beta) follows the compute type. `round` is what the compute type does to inputs.
struct ComputeRule {
  Elem scale;
  InputRounding round;
};
bool compute_rule(cublasComputeType_t ct, ComputeRule& r) {
  switch (ct) {
    case CUBLAS_COMPUTE_16F:
    case CUBLAS_COMPUTE_16F_PEDANTIC: r = {Elem::F16, InputRounding::None}; return true;
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC:
    case CUBLAS_COMPUTE_32F_EMULATED_16BFX9: r = {Elem::F32, InputRounding::None}; return true;
    case CUBLAS_COMPUTE_32F_FAST_16F: r = {Elem::F32, InputRounding::F16}; return true;
    case CUBLAS_COMPUTE_32F_FAST_16BF: r = {Elem::F32, InputRounding::Bf16}; return true;
    case CUBLAS_COMPUTE_32F_FAST_TF32: r = {Elem::F32, InputRounding::Tf32}; return true;
    case CUBLAS_COMPUTE_64F:
    case CUBLAS_COMPUTE_64F_PEDANTIC:
    case CUBLAS_COMPUTE_64F_EMULATED_FIXEDPOINT: r = {Elem::F64, InputRounding::None}; return true;
    case CUBLAS_COMPUTE_32I:
    case CUBLAS_COMPUTE_32I_PEDANTIC: r = {Elem::I32, InputRounding::None}; return true;
  }
  return false;
}
bool legal_types(cublasComputeType_t ct, Elem ab, Elem c) {
  switch (ct) {
    case CUBLAS_COMPUTE_16F:
    case CUBLAS_COMPUTE_16F_PEDANTIC: return ab == Elem::F16 && c == Elem::F16;
    case CUBLAS_COMPUTE_32I:
    case CUBLAS_COMPUTE_32I_PEDANTIC: return ab == Elem::I8 && c == Elem::I32;
    case CUBLAS_COMPUTE_32F:
    case CUBLAS_COMPUTE_32F_PEDANTIC:
      return (ab == Elem::BF16 && (c == Elem::BF16 || c == Elem::F32)) ||
             (ab == Elem::F16 && (c == Elem::F16 || c == Elem::F32)) || (ab == Elem::I8 && c == Elem::F32) ||
             (ab == Elem::F32 && c == Elem::F32);
    case CUBLAS_COMPUTE_32F_FAST_16F:
    case CUBLAS_COMPUTE_32F_FAST_16BF:
    case CUBLAS_COMPUTE_32F_FAST_TF32:
    case CUBLAS_COMPUTE_32F_EMULATED_16BFX9: return ab == Elem::F32 && c == Elem::F32;
    case CUBLAS_COMPUTE_64F:
    case CUBLAS_COMPUTE_64F_PEDANTIC:
    case CUBLAS_COMPUTE_64F_EMULATED_FIXEDPOINT: return ab == Elem::F64 && c == Elem::F64;
  }
  return false;
}

bool known_algo(cublasGemmAlgo_t a) {
  const int v = static_cast<int>(a);
  return v == CUBLAS_GEMM_DEFAULT || (v >= CUBLAS_GEMM_ALGO0 && v <= CUBLAS_GEMM_ALGO23) ||
         (v >= CUBLAS_GEMM_DEFAULT_TENSOR_OP && v <= CUBLAS_GEMM_ALGO15_TENSOR_OP) || v == CUBLAS_GEMM_AUTOTUNE;
}

const char* op_name(cublasOperation_t op) {
  switch (op) {
    case CUBLAS_OP_N: return "CUBLAS_OP_N";
    case CUBLAS_OP_T: return "CUBLAS_OP_T";
    case CUBLAS_OP_C: return "CUBLAS_OP_C";
    default: return "an invalid cublasOperation_t";
  }
}

// Do two of the batch's C matrices (column-major m x n, leading dimension ldc, batch stride sc)
// share an element? Matrices t apart start t*|sc| elements apart; an element offset d is inside
// one matrix's footprint when d = q*ldc + r with |q| < n and |r| < m.
bool batch_outputs_overlap(int64_t m, int64_t n, int64_t ldc, int64_t sc, int64_t batch) {
  if (batch < 2) return false;
  const int64_t step = sc < 0 ? -sc : sc, span = ldc * (n - 1) + m;
  for (int64_t t = 1; t < batch && t * step < span; ++t) {
    const int64_t d = t * step, q = d / ldc, r = d % ldc;
    if ((r <= m - 1 && q <= n - 1) || (ldc - r <= m - 1 && q + 1 <= n - 1)) return true;
  }
  return false;
}

struct Matrix {
  const char* name;
  const void* p;
  Elem e;
  int64_t rows, cols, ld, stride;   // as stored (column-major)
  int64_t span_bytes() const { return ((cols - 1) * ld + rows) * static_cast<int64_t>(elem_size(e)); }
  const unsigned char* batch(int64_t b) const {
    return static_cast<const unsigned char*>(p) + b * stride * static_cast<int64_t>(elem_size(e));
  }
};

// Batch bi's op(M), rows x cols, into out[c * rows + r], rounded as the compute type does, walked
// in the order the stored matrix is contiguous in: op(M)(r, c) is M(r, c), or M(c, r) transposed.
void load_op(const Matrix& mx, bool transposed, int64_t rows, int64_t cols, InputRounding round, int64_t bi,
             std::vector<double>& out) {
  const unsigned char* p = mx.batch(bi);
  if (!transposed) {
    for (int64_t c = 0; c < cols; ++c)
      for (int64_t r = 0; r < rows; ++r) out[c * rows + r] = read_elem(p, mx.e, r + c * mx.ld, round);
  } else {
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < cols; ++c) out[c * rows + r] = read_elem(p, mx.e, c + r * mx.ld, round);
  }
}

// C = alpha op(A)op(B) + beta C for one batch, op(A) and op(B) as load_op lays them out (not read
// when !reads_ab: their product is 0). Each element sums its k products from 0 in order of l, each
// added by one fused multiply-add; a column's m sums advance together (a vectorised loop), and
// kProductCols columns at a time (acc holds their sums) share each column of op(A) while it is in
// the cache, which changes no element's order.
constexpr int64_t kProductCols = 4;
void store_product(const std::vector<double>& a, const std::vector<double>& b, std::vector<double>& acc, int64_t m,
                   int64_t n, int64_t k, bool reads_ab, double alpha, double beta, void* c, Elem ec, int64_t ldc) {
  for (int64_t j0 = 0; j0 < n; j0 += kProductCols) {
    const int64_t cols = std::min<int64_t>(kProductCols, n - j0);
    std::fill(acc.begin(), acc.end(), 0.0);
    if (reads_ab) {
      for (int64_t l = 0; l < k; ++l) {
        const double* col = a.data() + l * m;
        for (int64_t jj = 0; jj < cols; ++jj) {
          const double bv = b[(j0 + jj) * k + l];
          double* out = acc.data() + jj * m;
          for (int64_t i = 0; i < m; ++i) out[i] = std::fma(col[i], bv, out[i]);
        }
      }
    }
    for (int64_t jj = 0; jj < cols; ++jj) {
      const int64_t j = j0 + jj;
      for (int64_t i = 0; i < m; ++i) {
        double v = alpha * acc[jj * m + i];
        if (beta != 0.0) v += beta * read_elem(c, ec, i + j * ldc, InputRounding::None);   // beta == 0: C not read
        write_elem(c, ec, i + j * ldc, v);
      }
    }
  }
}

// Every byte range the call touches must be live device memory: per batch, as cuBLAS reads it.
cublasStatus_t check_ranges(const char* fn, const Matrix& m, int64_t batch) {
  if (reinterpret_cast<uintptr_t>(m.p) % elem_size(m.e) != 0) {
    report_fault(cat(fn, ": ", m.name, " = ", m.p, " is not aligned to its ", elem_size(m.e), "-byte ",
                     elem_name(m.e), " elements (misaligned address)"));
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  for (int64_t b = 0; b < batch; ++b) {
    if (!range_ok(m.batch(b), static_cast<size_t>(m.span_bytes()))) {
      report_fault(cat(fn, ": ", m.name, " of batch ", b, " = [", static_cast<const void*>(m.batch(b)), ", +",
                       m.span_bytes(), " bytes) (", m.rows, "x", m.cols, " ", elem_name(m.e), ", ld ", m.ld,
                       ", batch stride ", m.stride, ") is not inside one live device allocation (illegal address)"));
      return CUBLAS_STATUS_EXECUTION_FAILED;
    }
  }
  return CUBLAS_STATUS_SUCCESS;
}

const char* compute_name(cublasComputeType_t ct) {
  switch (ct) {
    case CUBLAS_COMPUTE_16F: return "CUBLAS_COMPUTE_16F";
    case CUBLAS_COMPUTE_32F: return "CUBLAS_COMPUTE_32F";
    case CUBLAS_COMPUTE_32F_FAST_TF32: return "CUBLAS_COMPUTE_32F_FAST_TF32";
    case CUBLAS_COMPUTE_32F_FAST_16F: return "CUBLAS_COMPUTE_32F_FAST_16F";
    case CUBLAS_COMPUTE_32F_FAST_16BF: return "CUBLAS_COMPUTE_32F_FAST_16BF";
    case CUBLAS_COMPUTE_64F: return "CUBLAS_COMPUTE_64F";
    default: return "another cublasComputeType_t";
  }
}

// One GEMM in the call log (call_log.h): 2mnk FLOPs per batch, and the bytes of A and B (once
// when their batch stride is 0, as a broadcast operand is read once) and of C (twice with beta).
void log_gemm(const Matrix& a, const Matrix& b, const Matrix& c, int64_t k, int64_t batch, cublasOperation_t ta,
              cublasOperation_t tb, cublasComputeType_t ct, bool accumulate, cudaStream_t stream) {
  const auto bytes = [batch](const Matrix& x) {
    return static_cast<double>(x.rows * x.cols) * static_cast<double>(elem_size(x.e)) *
           static_cast<double>(x.stride == 0 ? 1 : batch);
  };
  LibCall call;
  call.lib = "cuBLAS";
  call.op = "gemm";
  call.dtype = cat(elem_name(a.e), "->", elem_name(c.e));
  call.algo = compute_name(ct);
  call.layout = cat(ta == CUBLAS_OP_N ? "N" : "T", tb == CUBLAS_OP_N ? "N" : "T");
  call.math = ct == CUBLAS_COMPUTE_32F_FAST_TF32                    ? MathClass::Tf32Tensor
              : a.e == Elem::F16 || a.e == Elem::BF16               ? MathClass::F16Tensor
              : a.e == Elem::F64                                    ? MathClass::Fp64
              : ct == CUBLAS_COMPUTE_32F_FAST_16F || ct == CUBLAS_COMPUTE_32F_FAST_16BF ? MathClass::F16Tensor
                                                                    : MathClass::Fp32;
  call.flops = 2.0 * static_cast<double>(c.rows) * static_cast<double>(c.cols) * static_cast<double>(k) *
               static_cast<double>(batch);
  call.min_bytes = bytes(a) + bytes(b) + bytes(c) * (accumulate ? 2.0 : 1.0);
  call.dims = {static_cast<double>(c.rows), static_cast<double>(c.cols), static_cast<double>(k),
               static_cast<double>(batch)};
  call.shapes = cat("m ", c.rows, " n ", c.cols, " k ", k, " batch ", batch);
  call.stream = stream;
  log_call(std::move(call));
}

bool bounds_intersect(const Matrix& a, const Matrix& b, int64_t batch) {
  auto lo_hi = [batch](const Matrix& m) {
    const auto* first = m.batch(0);
    const auto* last = m.batch(batch - 1);
    return std::pair(std::min(first, last), std::max(first, last) + m.span_bytes());
  };
  const auto [alo, ahi] = lo_hi(a);
  const auto [blo, bhi] = lo_hi(b);
  return alo < bhi && blo < ahi;
}

// cublasGemmStridedBatchedEx's arguments that describe the shapes, checked as cuBLAS does (each
// failure INVALID_VALUE, with the argument and the rule in the message).
cublasStatus_t check_gemm_shape(const char* fn, cublasOperation_t transa, cublasOperation_t transb, int m, int n,
                                int k, int batchCount, int lda, int ldb, int ldc, const void* alpha,
                                const void* beta) {
  constexpr cublasStatus_t kInvalid = CUBLAS_STATUS_INVALID_VALUE;
  for (auto [name, op] : {std::pair{"transa", raw_enum(transa)}, std::pair{"transb", raw_enum(transb)}})
    if (op != CUBLAS_OP_N && op != CUBLAS_OP_T && op != CUBLAS_OP_C)
      return fail(kInvalid, cat(fn, ": ", name, " = ", op, " is not CUBLAS_OP_N, _T or _C"));
  for (auto [name, v] : {std::pair{"m", m}, std::pair{"n", n}, std::pair{"k", k}, std::pair{"batchCount", batchCount}})
    if (v < 0) return fail(kInvalid, cat(fn, ": ", name, " = ", v, " is negative"));
  // op(A) is m x k, op(B) k x n, C m x n; stored A is m x k for OP_N and k x m otherwise.
  const int a_rows = transa == CUBLAS_OP_N ? m : k, b_rows = transb == CUBLAS_OP_N ? k : n;
  if (lda < std::max(1, a_rows))
    return fail(kInvalid, cat(fn, ": lda = ", lda, " < max(1, ", a_rows, "), the rows of A as stored (transa ",
                              op_name(transa), ", m ", m, ", k ", k, ")"));
  if (ldb < std::max(1, b_rows))
    return fail(kInvalid, cat(fn, ": ldb = ", ldb, " < max(1, ", b_rows, "), the rows of B as stored (transb ",
                              op_name(transb), ", k ", k, ", n ", n, ")"));
  if (ldc < std::max(1, m)) return fail(kInvalid, cat(fn, ": ldc = ", ldc, " < max(1, m = ", m, ")"));
  if (alpha == nullptr) return fail(kInvalid, cat(fn, ": alpha is NULL"));
  if (beta == nullptr) return fail(kInvalid, cat(fn, ": beta is NULL"));
  return CUBLAS_STATUS_SUCCESS;
}

}  // namespace

int cublas_live_handles() { return handles().live_count(); }

}  // namespace detail

CublasWorkspace cublas_workspace_of(const void* handle) {
  if (detail::handles().state(handle) != detail::ObjState::Live) return {};
  return static_cast<const cublasContext*>(handle)->workspace;
}

}  // namespace minidl::cuda::emu

using namespace minidl::cuda::emu::detail;   // NOLINT: the C entry points below are outside our namespace

extern "C" {

cublasStatus_t cublasCreate_v2(cublasHandle_t* handle) {
  if (handle == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasCreate: handle (the output pointer) is NULL");
  *handle = handles().create();
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasDestroy_v2(cublasHandle_t handle) {
  if (cublasStatus_t st = check_handle("cublasDestroy", handle); st != CUBLAS_STATUS_SUCCESS) return st;
  handles().destroy(handle);
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetStream_v2(cublasHandle_t handle, cudaStream_t streamId) {
  if (cublasStatus_t st = check_handle("cublasSetStream", handle); st != CUBLAS_STATUS_SUCCESS) return st;
  if (!stream_ok(streamId))
    return fail(CUBLAS_STATUS_INVALID_VALUE,
                cat("cublasSetStream: streamId ", static_cast<const void*>(streamId), " is not a live stream"));
  handle->stream = streamId;
  handle->workspace = {};   // documented: setting the stream resets the workspace to the default pool
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasGetStream_v2(cublasHandle_t handle, cudaStream_t* streamId) {
  if (cublasStatus_t st = check_handle("cublasGetStream", handle); st != CUBLAS_STATUS_SUCCESS) return st;
  if (streamId == nullptr) return fail(CUBLAS_STATUS_INVALID_VALUE, "cublasGetStream: streamId is NULL");
  *streamId = handle->stream;
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetWorkspace_v2(cublasHandle_t handle, void* workspace, size_t workspaceSizeInBytes) {
  if (cublasStatus_t st = check_handle("cublasSetWorkspace", handle); st != CUBLAS_STATUS_SUCCESS) return st;
  if (reinterpret_cast<uintptr_t>(workspace) % 256 != 0)
    return fail(CUBLAS_STATUS_INVALID_VALUE,
                cat("cublasSetWorkspace: workspace ", workspace, " is not aligned to 256 bytes"));
  if (!range_ok(workspace, workspaceSizeInBytes))
    return fail(CUBLAS_STATUS_INVALID_VALUE, cat("cublasSetWorkspace: workspace [", workspace, ", +",
                                                 workspaceSizeInBytes,
                                                 " bytes) is not inside one live device allocation"));
  handle->workspace = {workspace, workspaceSizeInBytes, true};
  return CUBLAS_STATUS_SUCCESS;
}

cublasStatus_t cublasSetPointerMode_v2(cublasHandle_t handle, cublasPointerMode_t mode) {
  if (cublasStatus_t st = check_handle("cublasSetPointerMode", handle); st != CUBLAS_STATUS_SUCCESS) return st;
  if (mode != CUBLAS_POINTER_MODE_HOST && mode != CUBLAS_POINTER_MODE_DEVICE)
    return fail(CUBLAS_STATUS_INVALID_VALUE, cat("cublasSetPointerMode: mode ", static_cast<int>(mode),
                                                 " is neither CUBLAS_POINTER_MODE_HOST nor _DEVICE"));
  handle->pointer_mode = mode;
  return CUBLAS_STATUS_SUCCESS;
}

const char* cublasGetStatusName(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "CUBLAS_STATUS_SUCCESS";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "CUBLAS_STATUS_NOT_INITIALIZED";
    case CUBLAS_STATUS_ALLOC_FAILED: return "CUBLAS_STATUS_ALLOC_FAILED";
    case CUBLAS_STATUS_INVALID_VALUE: return "CUBLAS_STATUS_INVALID_VALUE";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "CUBLAS_STATUS_ARCH_MISMATCH";
    case CUBLAS_STATUS_MAPPING_ERROR: return "CUBLAS_STATUS_MAPPING_ERROR";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "CUBLAS_STATUS_EXECUTION_FAILED";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "CUBLAS_STATUS_INTERNAL_ERROR";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "CUBLAS_STATUS_NOT_SUPPORTED";
    case CUBLAS_STATUS_LICENSE_ERROR: return "CUBLAS_STATUS_LICENSE_ERROR";
  }
  return "CUBLAS_STATUS_UNKNOWN";
}

const char* cublasGetStatusString(cublasStatus_t status) {
  switch (status) {
    case CUBLAS_STATUS_SUCCESS: return "success";
    case CUBLAS_STATUS_NOT_INITIALIZED: return "the library was not initialized";
    case CUBLAS_STATUS_ALLOC_FAILED: return "the resource allocation failed";
    case CUBLAS_STATUS_INVALID_VALUE: return "an invalid numeric value was used as an argument";
    case CUBLAS_STATUS_ARCH_MISMATCH: return "an absent device architectural feature is required";
    case CUBLAS_STATUS_MAPPING_ERROR: return "an access to GPU memory space failed";
    case CUBLAS_STATUS_EXECUTION_FAILED: return "the GPU program failed to execute";
    case CUBLAS_STATUS_INTERNAL_ERROR: return "an internal operation failed";
    case CUBLAS_STATUS_NOT_SUPPORTED: return "the functionality requested is not supported";
    case CUBLAS_STATUS_LICENSE_ERROR: return "error detected trying to check the license";
  }
  return "unknown error";
}

cublasStatus_t cublasGemmStridedBatchedEx(cublasHandle_t handle, cublasOperation_t transa, cublasOperation_t transb,
                                          int m, int n, int k, const void* alpha, const void* A, cudaDataType Atype,
                                          int lda, long long int strideA, const void* B, cudaDataType Btype, int ldb,
                                          long long int strideB, const void* beta, void* C, cudaDataType Ctype,
                                          int ldc, long long int strideC, int batchCount,
                                          cublasComputeType_t computeType, cublasGemmAlgo_t algo) {
  constexpr const char* fn = "cublasGemmStridedBatchedEx";
  constexpr cublasStatus_t kInvalid = CUBLAS_STATUS_INVALID_VALUE;
  if (cublasStatus_t st = check_handle(fn, handle); st != CUBLAS_STATUS_SUCCESS) return st;
  if (cublasStatus_t st = check_gemm_shape(fn, transa, transb, m, n, k, batchCount, lda, ldb, ldc, alpha, beta);
      st != CUBLAS_STATUS_SUCCESS)
    return st;
  // op(A) is m x k, op(B) k x n, C m x n; stored A is m x k for OP_N and k x m otherwise.
  const int a_rows = transa == CUBLAS_OP_N ? m : k, b_rows = transb == CUBLAS_OP_N ? k : n;
  ComputeRule rule{};
  if (!compute_rule(computeType, rule))
    return fail(kInvalid, cat(fn, ": computeType = ", static_cast<int>(computeType), " is not a cublasComputeType_t"));
  Elem ea{}, eb{}, ec{};
  if (!elem_of(Atype, ea) || !elem_of(Btype, eb) || !elem_of(Ctype, ec) || ea != eb || !legal_types(computeType, ea, ec))
    return fail(CUBLAS_STATUS_NOT_SUPPORTED,
                cat(fn, ": Atype ", static_cast<int>(Atype), ", Btype ", static_cast<int>(Btype), ", Ctype ",
                    static_cast<int>(Ctype), " with computeType ", static_cast<int>(computeType),
                    " is not a combination in cublasGemmEx's table (e.g. CUDA_R_16F in and out with "
                    "CUBLAS_COMPUTE_32F, CUDA_R_32F with _32F or _32F_FAST_TF32, CUDA_R_64F with _64F; the emulator "
                    "has no complex types)"));
  if (!known_algo(algo))
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, cat(fn, ": algo = ", static_cast<int>(algo), " is not a cublasGemmAlgo_t"));
  if (handle->pointer_mode != CUBLAS_POINTER_MODE_HOST)
    return fail(CUBLAS_STATUS_NOT_SUPPORTED, cat(fn, ": the handle is in CUBLAS_POINTER_MODE_DEVICE; the emulator "
                                                    "takes alpha and beta from host memory only (the backend never "
                                                    "uses device pointer mode)"));
  if (m == 0 || n == 0 || batchCount == 0) return CUBLAS_STATUS_SUCCESS;   // nothing to compute

  const double a_scale = read_elem(alpha, rule.scale, 0, InputRounding::None);
  const double b_scale = read_elem(beta, rule.scale, 0, InputRounding::None);
  const bool reads_ab = k > 0 && a_scale != 0.0;   // BLAS: A and B are not read when alpha == 0
  const Matrix ma{"A", A, ea, a_rows, transa == CUBLAS_OP_N ? k : m, lda, strideA};
  const Matrix mb{"B", B, eb, b_rows, transb == CUBLAS_OP_N ? n : k, ldb, strideB};
  const Matrix mc{"C", C, ec, m, n, ldc, strideC};
  if (batch_outputs_overlap(m, n, ldc, strideC, batchCount))
    return fail(kInvalid, cat(fn, ": the batch's C matrices overlap (m ", m, ", n ", n, ", ldc ", ldc, ", strideC ",
                              strideC, ", batchCount ", batchCount, "): their results would race on a GPU"));
  if (reads_ab)
    for (const Matrix* in : {&ma, &mb})
      if (bounds_intersect(*in, mc, batchCount))
        return fail(kInvalid, cat(fn, ": C overlaps ", in->name, "; cuBLAS does not compute in place"));

  if (!stream_ok(handle->stream)) {
    report_fault(cat(fn, ": the handle's stream ", static_cast<const void*>(handle->stream),
                     " is not a live stream (destroyed since cublasSetStream?)"));
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  const minidl::cuda::emu::CublasWorkspace& ws = handle->workspace;
  if (ws.user && !range_ok(ws.ptr, ws.bytes)) {
    report_fault(cat(fn, ": the workspace set by cublasSetWorkspace, [", ws.ptr, ", +", ws.bytes,
                     " bytes), is no longer inside one live device allocation (freed before the handle?)"));
    return CUBLAS_STATUS_EXECUTION_FAILED;
  }
  if (reads_ab)
    for (const Matrix* in : {&ma, &mb})
      if (cublasStatus_t st = check_ranges(fn, *in, batchCount); st != CUBLAS_STATUS_SUCCESS) return st;
  if (cublasStatus_t st = check_ranges(fn, mc, batchCount); st != CUBLAS_STATUS_SUCCESS) return st;

  // The computation as stream work: now, after the work queued before it (deferred streams), or
  // recorded into the stream's capture, where each replay checks the operands' ranges again.
  const cudaStream_t stream = handle->stream;
  const auto compute = [=] {
    // A split-K GEMM keeps partial sums in the workspace: scribble over what it would use, so a
    // workspace that overlaps live data shows up as corrupted data.
    if (ws.user && ws.bytes > 0) {
      const size_t used = std::min(ws.bytes, static_cast<size_t>(m) * static_cast<size_t>(n) * 4);
      std::fill_n(static_cast<unsigned char*>(ws.ptr), used, static_cast<unsigned char>(0xA5));
    }
    // op(A), op(B) and the sums (store_product) stay with the thread between calls: fresh ones cost
    // a page fault per page.
    thread_local std::vector<double> a, b, acc;
    a.resize(static_cast<size_t>(m) * k);
    b.resize(static_cast<size_t>(k) * n);
    acc.resize(static_cast<size_t>(m) * kProductCols);
    for (int64_t bi = 0; bi < batchCount; ++bi) {
      if (reads_ab) {   // op(A)(i, l) at a[l * m + i], op(B)(l, j) at b[j * k + l]
        load_op(ma, transa != CUBLAS_OP_N, m, k, rule.round, bi, a);
        load_op(mb, transb != CUBLAS_OP_N, k, n, rule.round, bi, b);
      }
      store_product(a, b, acc, m, n, k, reads_ab, a_scale, b_scale, const_cast<unsigned char*>(mc.batch(bi)), ec, ldc);
    }
    if (minidl::cuda::emu::call_logging()) log_gemm(ma, mb, mc, k, batchCount, transa, transb, computeType, b_scale != 0.0, stream);
  };
  const auto replay = [=] {
    for (const Matrix* in : {&ma, &mb})
      if (reads_ab && check_ranges(fn, *in, batchCount) != CUBLAS_STATUS_SUCCESS)
        throw std::runtime_error(minidl::cuda::emu::last_error_detail());
    if (check_ranges(fn, mc, batchCount) != CUBLAS_STATUS_SUCCESS) throw std::runtime_error(minidl::cuda::emu::last_error_detail());
    compute();
  };
  if (record_if_capturing(stream, replay, fn)) return CUBLAS_STATUS_SUCCESS;
  flush_stream(stream);
  compute();
  return CUBLAS_STATUS_SUCCESS;
}

}  // extern "C"
