// The per-device state of the CUDA backend: one stream that every kernel, copy and library call
// is queued on (so stream order alone makes cached memory safe to reuse), lazily created cuBLAS
// and cuDNN handles bound to it, the caching allocator and the pinned host staging buffers.
#pragma once
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>

#include <memory>
#include <mutex>
#include <vector>

#include "core/tensor.h"
#include "kernels/caching_allocator.h"
#include "kernels/cuda/check.cuh"

namespace minidl::cuda {

// Two pinned buffers used in turn, each guarded by an event, so a host->device copy returns as
// soon as its bytes are staged and a device->host copy overlaps the next chunk's transfer.
class PinnedStaging {
 public:
  static constexpr size_t kChunk = size_t{8} << 20;
  PinnedStaging() = default;
  ~PinnedStaging();
  PinnedStaging(const PinnedStaging&) = delete;
  PinnedStaging& operator=(const PinnedStaging&) = delete;
  // Contiguous bytes; the device pointer is ordered on `stream`.
  void to_device(void* dst, const void* src, size_t n, cudaStream_t stream);
  void to_host(void* dst, const void* src, size_t n, cudaStream_t stream);

  // While a CUDA graph is captured, to_device cannot wait for a buffer (a synchronization) and a
  // graph replays its copy from the address it captured: each copy gets a pinned buffer of its
  // own, which the graph keeps (end_capture hands them over; free them with cudaFreeHost).
  void begin_capture();
  std::vector<void*> end_capture();

 private:
  void ensure();
  bool capturing_ = false;
  std::vector<void*> captured_;
  void* buf_[2] = {nullptr, nullptr};
  cudaEvent_t done_[2] = {nullptr, nullptr};
  std::mutex mu_;
};

class DeviceContext {
 public:
  explicit DeviceContext(int index);
  ~DeviceContext();
  DeviceContext(const DeviceContext&) = delete;
  DeviceContext& operator=(const DeviceContext&) = delete;

  int index() const { return index_; }
  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas();
  // Destroys the cuBLAS handle and gives its workspace back when the workspace is all the allocator
  // holds (no tensor, no graph's pool can reach it); the next cublas() makes both again.
  bool release_cublas();
  cudnnHandle_t cudnn();
  CachingAllocator& allocator() { return *allocator_; }
  PinnedStaging& staging() { return staging_; }
  // Makes this device current on the calling thread (cheap when it already is).
  void activate() const;
  void synchronize() const;
  const cudaDeviceProp& props() const { return props_; }
  // cuBLAS's workspace, from the allocator (kernels/cuda/workspace.h: cublas_workspace_bytes).
  static constexpr size_t kCublasWorkspace = size_t{8} << 20;
  // Whether the stream is being captured into a CUDA graph (graph.cu).
  bool capturing() const;

 private:
  int index_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  void* cublas_ws_ = nullptr;
  cudnnHandle_t cudnn_ = nullptr;
  std::unique_ptr<CachingAllocator> allocator_;
  PinnedStaging staging_;
  cudaDeviceProp props_{};
  std::mutex mu_;
};

// The context of device `index`, created on first use and never destroyed (tensors held in
// statics may free their memory after main returns). Throws when the device does not exist.
DeviceContext& context(int index);
// The context of a tensor's device, made current.
DeviceContext& context_of(const Tensor& t);

// A block of device memory from the caching allocator for the length of one call (workspaces).
class DeviceBuffer {
 public:
  DeviceBuffer(DeviceContext& ctx, size_t n) : alloc_(&ctx.allocator()), n_(n), p_(n ? alloc_->allocate(n) : nullptr) {}
  ~DeviceBuffer() {
    if (p_ != nullptr) alloc_->deallocate(p_, n_);
  }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  void* get() const { return p_; }
  size_t size() const { return n_; }

 private:
  CachingAllocator* alloc_;
  size_t n_;
  void* p_;
};

}  // namespace minidl::cuda
