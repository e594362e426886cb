// Page-locked host memory and asynchronous batch copies for the data loader (Backend::pinned_alloc,
// copy_async): a copy from pinned memory is a real DMA on a dedicated copy stream, so the next
// batch's transfer overlaps the current step's compute. cudaHostAlloc is slow: allocate once.
#include <cstdio>
#include <exception>
#include <map>
#include <memory>
#include <mutex>
#include <utility>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/context.cuh"
#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/runtime.h"

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

namespace {

// One non-blocking copy stream per device, created on first use and never destroyed (like the
// device contexts, it may be used by objects destroyed after main returns).
cudaStream_t copy_stream(int device) {
  static std::mutex mu;
  static std::map<int, cudaStream_t> streams;
  std::lock_guard<std::mutex> lock(mu);
  auto it = streams.find(device);
  if (it != streams.end()) return it->second;
  cudaStream_t s = nullptr;
  MINIDL_CUDA_CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  streams[device] = s;
  return s;
}

}  // namespace

std::unique_ptr<AsyncCopy> AsyncCopy::start(const std::vector<std::pair<const void*, Tensor>>& copies) {
  MINIDL_CHECK(!copies.empty(), "AsyncCopy::start: nothing to copy");
  const Tensor& first = copies.front().second;
  for (const auto& [src, dst] : copies) {
    MINIDL_CHECK(src != nullptr, "AsyncCopy::start: null source for ", dst.meta());
    MINIDL_CHECK(dst.device().is_cuda() && dst.device() == first.device() && dst.is_contiguous(),
                 "AsyncCopy::start: destinations must be contiguous tensors on one CUDA device, got ", dst.meta(),
                 " and ", first.meta());
  }
  DeviceContext& ctx = context_of(first);
  std::unique_ptr<AsyncCopy> c(new AsyncCopy());
  c->device_ = ctx.index();
  const cudaStream_t cs = copy_stream(ctx.index());
  // The copy stream starts after the compute stream's work so far (the destinations' memory).
  cudaEvent_t ready = nullptr;
  MINIDL_CUDA_CHECK(cudaEventCreateWithFlags(&ready, cudaEventDisableTiming));
  const cudaError_t e1 = cudaEventRecord(ready, ctx.stream());
  const cudaError_t e2 = e1 == cudaSuccess ? cudaStreamWaitEvent(cs, ready, 0) : e1;
  MINIDL_CUDA_LOG(cudaEventDestroy(ready));   // released once recorded work completes
  MINIDL_CUDA_CHECK(e2);
  cudaEvent_t done = nullptr;
  MINIDL_CUDA_CHECK(cudaEventCreateWithFlags(&done, cudaEventDisableTiming));
  c->done_ = done;   // owned from here: the destructor destroys it
  for (const auto& [src, dst] : copies) {
    const size_t bytes = static_cast<size_t>(dst.numel()) * dtype_size(dst.dtype());
    if (bytes == 0) continue;
    MINIDL_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src, bytes, cudaMemcpyHostToDevice, cs));
  }
  MINIDL_CUDA_CHECK(cudaEventRecord(done, cs));
  return c;
}

void AsyncCopy::make_compute_wait() {
  if (compute_waits_) return;
  DeviceContext& ctx = context(device_);
  ctx.activate();
  MINIDL_CUDA_CHECK(cudaStreamWaitEvent(ctx.stream(), static_cast<cudaEvent_t>(done_), 0));
  compute_waits_ = true;
}

// Called from the loader's assembler thread too, whose current device may be another one.
void AsyncCopy::host_wait() {
  MINIDL_CUDA_CHECK(cudaSetDevice(device_));
  MINIDL_CUDA_CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(done_)));
}

AsyncCopy::~AsyncCopy() {
  if (done_ == nullptr) return;
  MINIDL_CUDA_LOG(cudaSetDevice(device_));
  if (!compute_waits_) {
    // The destinations may go back to the caching allocator, which reuses memory in compute-stream
    // order: that stream must not run ahead of the copies into it.
    try {
      MINIDL_CUDA_LOG(cudaStreamWaitEvent(context(device_).stream(), static_cast<cudaEvent_t>(done_), 0));
    } catch (const std::exception& e) {   // context() cannot fail for a device already in use
      std::fprintf(stderr, "minidl: AsyncCopy: %s\n", e.what());
    }
  }
  MINIDL_CUDA_LOG(cudaEventDestroy(static_cast<cudaEvent_t>(done_)));
}

namespace {

// Backend::CopyHandle over an AsyncCopy: data/ sees the copy stream only through this seam.
class AsyncCopyHandle final : public Backend::CopyHandle {
 public:
  explicit AsyncCopyHandle(std::unique_ptr<AsyncCopy> c) : copy_(std::move(c)) {}
  void make_compute_wait() override { copy_->make_compute_wait(); }
  void host_wait() override { copy_->host_wait(); }

 private:
  std::unique_ptr<AsyncCopy> copy_;   // its destructor orders the compute stream after the copy
};

}  // namespace

std::unique_ptr<Backend::CopyHandle> CudaBackend::copy_async(
    const std::vector<std::pair<const void*, Tensor>>& copies) {
  return std::make_unique<AsyncCopyHandle>(AsyncCopy::start(copies));
}

}  // namespace minidl::cuda
