// Page-locked host memory for the data loader's batches: a copy from pinned memory is a real
// asynchronous DMA on the stream, so the next batch's transfer overlaps the current step's compute.
// cudaHostAlloc is slow (it maps pages), so callers allocate once and reuse (data/loader.cpp).
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/cuda_backend.cuh"

namespace minidl::cuda {

void* CudaBackend::pinned_alloc(size_t bytes) {
  if (bytes == 0) return nullptr;
  void* p = nullptr;
  MINIDL_CUDA_CHECK(cudaHostAlloc(&p, bytes, cudaHostAllocPortable));
  return p;
}

void CudaBackend::pinned_free(void* p) {
  if (p != nullptr) MINIDL_CUDA_LOG(cudaFreeHost(p));   // also called from destructors: never throws
}

}  // namespace minidl::cuda
