// One macro family for CUDA, cuBLAS and cuDNN return codes: a failure throws minidl::Error naming
// the failing call and the library's own error string; the *_LOG variants are for destructors,
// which must never throw (they print and carry on).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdio>
#include <string>
#include <type_traits>

#include "core/error.h"

namespace minidl::cuda::check_detail {

// Each library's success value, and its words for a failed status: "name (description)" where it
// has both, the short description for a destructor's log line.
inline bool ok(cudaError_t e) { return e == cudaSuccess; }
inline bool ok(cublasStatus_t s) { return s == CUBLAS_STATUS_SUCCESS; }
inline bool ok(cudnnStatus_t s) { return s == CUDNN_STATUS_SUCCESS; }
inline std::string explain(cudaError_t e) {
  return ::minidl::detail::concat(cudaGetErrorName(e), " (", cudaGetErrorString(e), ")");
}
inline std::string explain(cublasStatus_t s) {
  return ::minidl::detail::concat(cublasGetStatusName(s), " (", cublasGetStatusString(s), ")");
}
inline std::string explain(cudnnStatus_t s) { return cudnnGetErrorString(s); }
inline const char* describe(cudaError_t e) { return cudaGetErrorString(e); }
inline const char* describe(cublasStatus_t s) { return cublasGetStatusString(s); }
inline const char* describe(cudnnStatus_t s) { return cudnnGetErrorString(s); }

// A failed CUDA call also clears the runtime's non-sticky last error, so the next call starts clean.
template <typename Status>
void clear_last(Status /*s*/) {
  if constexpr (std::is_same_v<Status, cudaError_t>) cudaGetLastError();
}

// Throws "<library> call `<expr>` failed: <explanation>" unless s is the library's success.
template <typename Status>
void check_status(Status s, const char* file, int line, const char* library, const char* expr) {
  if (ok(s)) return;
  clear_last(s);
  ::minidl::detail::throw_error(file, line,
                                ::minidl::detail::concat(library, " call `", expr, "` failed: ", explain(s)));
}

// The same failure printed to stderr instead of thrown.
template <typename Status>
void log_failure(Status s, const char* file, int line, const char* library, const char* expr) {
  if (ok(s)) return;
  std::fprintf(stderr, "minidl: %s:%d: %s call `%s` failed in a destructor: %s\n", file, line, library, expr,
               describe(s));
  clear_last(s);
}

// After a kernel launch: a bad configuration shows up here, a fault in the kernel at the next sync.
inline void check_launch(cudaError_t e, const char* file, int line, const char* kernel_name) {
  if (ok(e)) return;
  ::minidl::detail::throw_error(
      file, line, ::minidl::detail::concat("CUDA kernel ", kernel_name, " failed to launch: ", explain(e)));
}

}  // namespace minidl::cuda::check_detail

#define MINIDL_CUDA_CHECK(expr) \
  ::minidl::cuda::check_detail::check_status<cudaError_t>((expr), __FILE__, __LINE__, "CUDA", #expr)
#define MINIDL_CUDA_LAUNCH_CHECK(kernel_name) \
  ::minidl::cuda::check_detail::check_launch(cudaGetLastError(), __FILE__, __LINE__, kernel_name)
#define MINIDL_CUBLAS_CHECK(expr) \
  ::minidl::cuda::check_detail::check_status<cublasStatus_t>((expr), __FILE__, __LINE__, "cuBLAS", #expr)
#define MINIDL_CUDNN_CHECK(expr) \
  ::minidl::cuda::check_detail::check_status<cudnnStatus_t>((expr), __FILE__, __LINE__, "cuDNN", #expr)

#define MINIDL_CUDA_LOG(expr) \
  ::minidl::cuda::check_detail::log_failure<cudaError_t>((expr), __FILE__, __LINE__, "CUDA", #expr)
#define MINIDL_CUBLAS_LOG(expr) \
  ::minidl::cuda::check_detail::log_failure<cublasStatus_t>((expr), __FILE__, __LINE__, "cuBLAS", #expr)
#define MINIDL_CUDNN_LOG(expr) \
  ::minidl::cuda::check_detail::log_failure<cudnnStatus_t>((expr), __FILE__, __LINE__, "cuDNN", #expr)
