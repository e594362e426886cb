// Host-side entry points of the CUDA backend that the rest of minidl (and tests, benchmarks and
// users) may call from plain C++: device discovery (any runtime error, e.g. an old driver, means no
// device) and the global switches. Only CUDA builds link these (guard with MINIDL_WITH_CUDA).
#pragma once
#include <cstddef>
#include <string>

#include "core/backend.h"
#include "kernels/caching_allocator.h"

namespace minidl::cuda {

int device_count();            // 0 on any error
std::string runtime_status();  // "2 devices" or the runtime's error string

// The CUDA backend object (its first use creates the device context).
Backend& cuda_backend();

// cuDNN algorithm choice, as torch.backends.cudnn.benchmark: false (default) asks cuDNN's
// heuristics (cudnnGet*_v7); true times the candidates once per shape (cudnnFind*Ex) and caches
// the fastest that fits the memory budget. Autotuning may pick algorithms with big workspaces.
void set_cudnn_benchmark(bool on);
bool cudnn_benchmark();
// TF32 tensor cores for f32 work, as torch.backends.{cuda.matmul,cudnn}.allow_tf32
// (defaults as PyTorch: off for GEMM, on for convolutions).
void set_allow_tf32_matmul(bool on);
bool allow_tf32_matmul();
void set_allow_tf32_cudnn(bool on);
bool allow_tf32_cudnn();
// Channels-last (NHWC) convolutions: the backend transposes into and out of NHWC around cuDNN.
void set_conv_nhwc(bool on);
bool conv_nhwc();

// Waits for all work queued on the device's stream.
void synchronize(int device = 0);
// The caching allocator's full statistics (fragmentation, segments, cudaMalloc calls).
CachingStats caching_stats(int device = 0);
// Autotune cache (benchmark mode) size, and clearing it.
size_t conv_algo_cache_size();
void clear_conv_algo_cache();
// "NVIDIA H100 80GB HBM3, cc 9.0, 132 SMs, driver 13000, runtime 13000"
std::string device_description(int device = 0);

}  // namespace minidl::cuda
