// One macro family for CUDA, cuBLAS and cuDNN return codes: a failure throws minidl::Error naming
// the failing call and the library's own error string; the *_LOG variants are for destructors,
// which must never throw (they print and carry on).
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <cstdio>

#include "core/error.h"

#define MINIDL_CUDA_CHECK(expr)                                                                          \
  do {                                                                                                   \
    const cudaError_t minidl_e_ = (expr);                                                                \
    if (minidl_e_ != cudaSuccess) {                                                                      \
      cudaGetLastError(); /* clear a non-sticky error so the next call starts clean */                  \
      ::minidl::detail::throw_error(__FILE__, __LINE__,                                                  \
                                    ::minidl::detail::concat("CUDA call `", #expr, "` failed: ",         \
                                                             cudaGetErrorName(minidl_e_), " (",          \
                                                             cudaGetErrorString(minidl_e_), ")"));       \
    }                                                                                                    \
  } while (0)

// After a kernel launch: a bad configuration shows up here, a fault in the kernel at the next sync.
#define MINIDL_CUDA_LAUNCH_CHECK(kernel_name)                                                            \
  do {                                                                                                   \
    const cudaError_t minidl_e_ = cudaGetLastError();                                                    \
    if (minidl_e_ != cudaSuccess) {                                                                      \
      ::minidl::detail::throw_error(__FILE__, __LINE__,                                                  \
                                    ::minidl::detail::concat("CUDA kernel ", kernel_name,                \
                                                             " failed to launch: ",                      \
                                                             cudaGetErrorName(minidl_e_), " (",          \
                                                             cudaGetErrorString(minidl_e_), ")"));       \
    }                                                                                                    \
  } while (0)

#define MINIDL_CUBLAS_CHECK(expr)                                                                        \
  do {                                                                                                   \
    const cublasStatus_t minidl_s_ = (expr);                                                             \
    if (minidl_s_ != CUBLAS_STATUS_SUCCESS) {                                                            \
      ::minidl::detail::throw_error(__FILE__, __LINE__,                                                  \
                                    ::minidl::detail::concat("cuBLAS call `", #expr, "` failed: ",       \
                                                             cublasGetStatusName(minidl_s_), " (",       \
                                                             cublasGetStatusString(minidl_s_), ")"));    \
    }                                                                                                    \
  } while (0)

#define MINIDL_CUDNN_CHECK(expr)                                                                         \
  do {                                                                                                   \
    const cudnnStatus_t minidl_s_ = (expr);                                                              \
    if (minidl_s_ != CUDNN_STATUS_SUCCESS) {                                                             \
      ::minidl::detail::throw_error(__FILE__, __LINE__,                                                  \
                                    ::minidl::detail::concat("cuDNN call `", #expr, "` failed: ",        \
                                                             cudnnGetErrorString(minidl_s_)));           \
    }                                                                                                    \
  } while (0)

#define MINIDL_CUDA_LOG(expr)                                                                            \
  do {                                                                                                   \
    const cudaError_t minidl_e_ = (expr);                                                                \
    if (minidl_e_ != cudaSuccess) {                                                                      \
      std::fprintf(stderr, "minidl: %s:%d: CUDA call `%s` failed in a destructor: %s\n", __FILE__,       \
                   __LINE__, #expr, cudaGetErrorString(minidl_e_));                                      \
      cudaGetLastError();                                                                                \
    }                                                                                                    \
  } while (0)

#define MINIDL_CUBLAS_LOG(expr)                                                                          \
  do {                                                                                                   \
    const cublasStatus_t minidl_s_ = (expr);                                                             \
    if (minidl_s_ != CUBLAS_STATUS_SUCCESS) {                                                            \
      std::fprintf(stderr, "minidl: %s:%d: cuBLAS call `%s` failed in a destructor: %s\n", __FILE__,     \
                   __LINE__, #expr, cublasGetStatusString(minidl_s_));                                   \
    }                                                                                                    \
  } while (0)

#define MINIDL_CUDNN_LOG(expr)                                                                           \
  do {                                                                                                   \
    const cudnnStatus_t minidl_s_ = (expr);                                                              \
    if (minidl_s_ != CUDNN_STATUS_SUCCESS) {                                                             \
      std::fprintf(stderr, "minidl: %s:%d: cuDNN call `%s` failed in a destructor: %s\n", __FILE__,      \
                   __LINE__, #expr, cudnnGetErrorString(minidl_s_));                                     \
    }                                                                                                    \
  } while (0)
