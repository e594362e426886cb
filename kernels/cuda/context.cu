// Device contexts, the cudaMalloc-backed segment source of the caching allocator, and the pinned
// staging buffers. Handles are created lazily so that a program that only moves tensors never
// pays cuDNN's start-up cost.
#include <cuda.h>   // the driver API's types: expandable segments map memory with cuMemCreate and cuMemMap

#include <cstring>
#include <mutex>
#include <type_traits>
#include <unordered_map>
#include <utility>
#include <vector>

#include "kernels/cuda/context.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/workspace.h"
// emu::poison_device, unpoison_device: the emulator's backend_hooks.h, force-included in its build

namespace minidl::cuda {
namespace {

// The driver's virtual memory calls behind expandable segments, found through the runtime
// (cudaGetDriverEntryPointByVersion) rather than linked: a program linked against libcuda would not
// start on a machine without a driver, where minidl runs on the CPU. All null when the driver has
// none of them.
struct DriverVmm {
  CUresult (*granularity)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags) = nullptr;
  CUresult (*reserve)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long) = nullptr;
  CUresult (*address_free)(CUdeviceptr, size_t) = nullptr;
  CUresult (*create)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long) = nullptr;
  CUresult (*release)(CUmemGenericAllocationHandle) = nullptr;
  CUresult (*map)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long) = nullptr;
  CUresult (*unmap)(CUdeviceptr, size_t) = nullptr;
  CUresult (*set_access)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t) = nullptr;

  void load() {
    const auto find = [](const char* name, auto& fn) {
      void* p = nullptr;
      cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
      if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found) != cudaSuccess ||
          found != cudaDriverEntryPointSuccess) {
        cudaGetLastError();
        p = nullptr;
      }
      fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
    };
    find("cuMemGetAllocationGranularity", granularity);
    find("cuMemAddressReserve", reserve);
    find("cuMemAddressFree", address_free);
    find("cuMemCreate", create);
    find("cuMemRelease", release);
    find("cuMemMap", map);
    find("cuMemUnmap", unmap);
    find("cuMemSetAccess", set_access);
  }
  bool complete() const {
    return granularity && reserve && address_free && create && release && map && unmap && set_access;
  }
};

[[noreturn]] void driver_failed(const char* call, CUresult r) {
  MINIDL_FAIL("CUDA driver call ", call, " failed with CUresult ", static_cast<int>(r),
              " (expandable segments map device memory through the driver's virtual memory API; "
              "drop --expandable-segments to use cudaMalloc'd segments)");
}

// Segments straight from cudaMalloc, or, for expandable segments, pages of device memory mapped into
// one reserved address range. An out-of-memory answer is reported as nullptr (false) so the
// allocator can release its cache and retry; any other error is a real failure and throws.
class CudaSegmentSource final : public SegmentSource {
 public:
  CudaSegmentSource(int index, cudaStream_t stream) : index_(index), stream_(stream) {
    prop_.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop_.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    prop_.location.id = index;
  }
  ~CudaSegmentSource() override {
    for (const auto& [p, h] : handles_) {   // pages of live blocks at exit (the allocator leaks those)
      vmm_.unmap(reinterpret_cast<CUdeviceptr>(p), page_);
      vmm_.release(h);
    }
  }

  size_t page_size() const override {
    std::call_once(page_once_, [this] {
      MINIDL_CUDA_CHECK(cudaSetDevice(index_));
      vmm_.load();
      size_t g = 0;
      if (vmm_.complete() && vmm_.granularity(&g, &prop_, CU_MEM_ALLOC_GRANULARITY_MINIMUM) == CUDA_SUCCESS) page_ = g;
    });
    return page_;
  }
  AddressRange reserve_address() override {
    MINIDL_CUDA_CHECK(cudaSetDevice(index_));
    size_t free_bytes = 0, total = 0;
    MINIDL_CUDA_CHECK(cudaMemGetInfo(&free_bytes, &total));
    const size_t page = page_size();
    AddressRange r;
    r.bytes = (kExpandableRange * total + page - 1) / page * page;
    CUdeviceptr p = 0;
    if (vmm_.reserve(&p, r.bytes, page, 0, 0) != CUDA_SUCCESS) return {};
    r.base = reinterpret_cast<void*>(p);
    return r;
  }
  void release_address(AddressRange r) override {
    if (const CUresult e = vmm_.address_free(reinterpret_cast<CUdeviceptr>(r.base), r.bytes); e != CUDA_SUCCESS)
      driver_failed("cuMemAddressFree", e);
  }
  bool map_page(void* p) override {
    MINIDL_CUDA_CHECK(cudaSetDevice(index_));
    CUmemGenericAllocationHandle h = 0;
    const CUresult made = vmm_.create(&h, page_, &prop_, 0);
    if (made == CUDA_ERROR_OUT_OF_MEMORY) return false;
    if (made != CUDA_SUCCESS) driver_failed("cuMemCreate", made);
    const auto d = reinterpret_cast<CUdeviceptr>(p);
    CUmemAccessDesc access{};
    access.location = prop_.location;
    access.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    if (const CUresult e = vmm_.map(d, page_, 0, h, 0); e != CUDA_SUCCESS) {
      vmm_.release(h);
      driver_failed("cuMemMap", e);
    }
    if (const CUresult e = vmm_.set_access(d, page_, &access, 1); e != CUDA_SUCCESS) {
      vmm_.unmap(d, page_);
      vmm_.release(h);
      driver_failed("cuMemSetAccess", e);
    }
    handles_[p] = h;
#ifdef MINIDL_CUDA_EMU
    emu::poison_device(p, page_, stream_);
#endif
    return true;
  }
  void unmap_page(void* p) override {
    auto it = handles_.find(p);
    MINIDL_CHECK(it != handles_.end(), "expandable segments: unmap of a page at ", p, " that is not mapped");
    if (const CUresult e = vmm_.unmap(reinterpret_cast<CUdeviceptr>(p), page_); e != CUDA_SUCCESS)
      driver_failed("cuMemUnmap", e);
    if (const CUresult e = vmm_.release(it->second); e != CUDA_SUCCESS) driver_failed("cuMemRelease", e);
    handles_.erase(it);
  }
  void* raw_alloc(size_t bytes) override {
    MINIDL_CUDA_CHECK(cudaSetDevice(index_));
    void* p = nullptr;
    // A CUDA graph's private pool grows during the capture, where cudaMalloc is a potentially
    // unsafe call: the thread is relaxed for it, as PyTorch's allocator does (cudaMalloc is not
    // stream work, so the capture does not record it).
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
    MINIDL_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    const cudaError_t e = cudaMalloc(&p, bytes);
    MINIDL_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    if (e == cudaErrorMemoryAllocation) {
      cudaGetLastError();
      return nullptr;
    }
    MINIDL_CUDA_CHECK(e);
#ifdef MINIDL_CUDA_EMU
    emu::poison_device(p, bytes, stream_);   // nothing of a new segment is a tensor's until block_live
#endif
    return p;
  }
  void raw_free(void* ptr, size_t) override {
    MINIDL_CUDA_CHECK(cudaSetDevice(index_));
    MINIDL_CUDA_CHECK(cudaFree(ptr));
  }
  void synchronize() override { MINIDL_CUDA_CHECK(cudaStreamSynchronize(stream_)); }
#ifdef MINIDL_CUDA_EMU
  // The emulated device's ASan build poisons what no tensor owns (cuda_emu/runtime_state.h).
  // A graph's blocks are marked by the captured step (each replay marks them again, in its order);
  // an eager block freed or handed out during a capture is marked in the stream's eager order, not
  // by every replay (a replay must not poison memory an eager tensor holds by then).
  void block_live(void* p, size_t requested, size_t block_size, bool private_pool) override {
    emu::unpoison_device(p, requested, stream_, private_pool);   // in stream order, as blocks are handed out
    emu::poison_device(static_cast<char*>(p) + requested, block_size - requested, stream_, private_pool);
  }
  void block_free(void* p, size_t block_size, bool private_pool) override {
    emu::poison_device(p, block_size, stream_, private_pool);
  }
#endif

 private:
  int index_;
  cudaStream_t stream_;
  CUmemAllocationProp prop_{};   // pinned device memory of this GPU
  // Found at the first page_size() (set_expandable_segments asks it), never for cudaMalloc'd segments.
  mutable std::once_flag page_once_;
  mutable DriverVmm vmm_;
  mutable size_t page_ = 0;
  // The mapped pages' handles (the allocator's mutex guards them).
  std::unordered_map<void*, CUmemGenericAllocationHandle> handles_;
};

// Destroys a handle being set up when a check throws before it is published (std::exchange'd
// out of the guarded variable); the library handles are plain pointers without RAII of their own.
template <class Handle, class Destroy>
struct Unpublished {
  Handle& h;
  Destroy destroy;
  ~Unpublished() {
    if (h != nullptr) destroy(h);
  }
};
template <class Handle, class Destroy>
Unpublished(Handle&, Destroy) -> Unpublished<Handle, Destroy>;

}  // namespace

// ---- PinnedStaging ----

PinnedStaging::~PinnedStaging() {
  for (int i = 0; i < 2; ++i) {
    if (done_[i] != nullptr) MINIDL_CUDA_LOG(cudaEventDestroy(done_[i]));
    if (buf_[i] != nullptr) MINIDL_CUDA_LOG(cudaFreeHost(buf_[i]));
  }
}

void PinnedStaging::ensure() {
  // Each piece is checked on its own, so a failure half-way (pinned memory is scarce) is retried
  // by the next call instead of leaving a buffer without its event.
  for (int i = 0; i < 2; ++i) {
    if (buf_[i] == nullptr) {
      void* p = nullptr;
      MINIDL_CUDA_CHECK(cudaHostAlloc(&p, kChunk, cudaHostAllocDefault));
      buf_[i] = p;
    }
    if (done_[i] == nullptr) {
      cudaEvent_t e = nullptr;
      MINIDL_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
      done_[i] = e;   // never recorded: cudaEventSynchronize returns at once, the buffer is free
    }
  }
}

void PinnedStaging::begin_capture() {
  std::lock_guard<std::mutex> lock(mu_);
  capturing_ = true;
}

std::vector<void*> PinnedStaging::end_capture() {
  std::lock_guard<std::mutex> lock(mu_);
  capturing_ = false;
  return std::exchange(captured_, {});
}

void PinnedStaging::to_device(void* dst, const void* src, size_t n, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  if (capturing_) {
    if (n == 0) return;
    void* p = nullptr;
    cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;   // cudaHostAlloc is not stream work
    MINIDL_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    const cudaError_t e = cudaHostAlloc(&p, n, cudaHostAllocDefault);
    MINIDL_CUDA_CHECK(cudaThreadExchangeStreamCaptureMode(&mode));
    MINIDL_CUDA_CHECK(e);
    captured_.push_back(p);
    std::memcpy(p, src, n);
    MINIDL_CUDA_CHECK(cudaMemcpyAsync(dst, p, n, cudaMemcpyHostToDevice, stream));
    return;
  }
  ensure();
  size_t done = 0;
  int i = 0;
  while (done < n) {
    const size_t len = std::min(kChunk, n - done);
    MINIDL_CUDA_CHECK(cudaEventSynchronize(done_[i]));   // the previous copy out of this buffer finished
    std::memcpy(buf_[i], static_cast<const char*>(src) + done, len);
    MINIDL_CUDA_CHECK(cudaMemcpyAsync(static_cast<char*>(dst) + done, buf_[i], len, cudaMemcpyHostToDevice, stream));
    MINIDL_CUDA_CHECK(cudaEventRecord(done_[i], stream));
    done += len;
    i ^= 1;
  }
  // No wait: the source bytes are already staged, the copy completes in stream order.
}

void PinnedStaging::to_host(void* dst, const void* src, size_t n, cudaStream_t stream) {
  std::lock_guard<std::mutex> lock(mu_);
  ensure();
  std::vector<std::pair<size_t, size_t>> chunks;
  for (size_t off = 0; off < n; off += kChunk) chunks.push_back({off, std::min(kChunk, n - off)});
  auto enqueue = [&](size_t k) {
    const int b = static_cast<int>(k & 1);
    MINIDL_CUDA_CHECK(cudaEventSynchronize(done_[b]));   // an earlier to_device may still read it
    MINIDL_CUDA_CHECK(cudaMemcpyAsync(buf_[b], static_cast<const char*>(src) + chunks[k].first, chunks[k].second,
                                      cudaMemcpyDeviceToHost, stream));
    MINIDL_CUDA_CHECK(cudaEventRecord(done_[b], stream));
  };
  if (!chunks.empty()) enqueue(0);
  for (size_t k = 0; k < chunks.size(); ++k) {
    if (k + 1 < chunks.size()) enqueue(k + 1);   // the next transfer overlaps this chunk's memcpy
    const int b = static_cast<int>(k & 1);
    MINIDL_CUDA_CHECK(cudaEventSynchronize(done_[b]));
    std::memcpy(static_cast<char*>(dst) + chunks[k].first, buf_[b], chunks[k].second);
  }
}

// ---- DeviceContext ----

DeviceContext::DeviceContext(int index) : index_(index) {
  MINIDL_CUDA_CHECK(cudaSetDevice(index));
  MINIDL_CUDA_CHECK(cudaGetDeviceProperties(&props_, index));
  MINIDL_CUDA_CHECK(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  try {
    allocator_ = std::make_unique<CachingAllocator>(std::make_unique<CudaSegmentSource>(index, stream_),
                                                    Device::cuda(index));
  } catch (...) {   // a throwing constructor runs no destructor: release the stream here
    MINIDL_CUDA_LOG(cudaStreamDestroy(stream_));
    throw;
  }
}

DeviceContext::~DeviceContext() {
  if (cudnn_ != nullptr) MINIDL_CUDNN_LOG(cudnnDestroy(cudnn_));
  if (cublas_ != nullptr) MINIDL_CUBLAS_LOG(cublasDestroy(cublas_));
  if (cublas_ws_ != nullptr) allocator_->deallocate(cublas_ws_, kCublasWorkspace);
  allocator_.reset();
  if (stream_ != nullptr) MINIDL_CUDA_LOG(cudaStreamDestroy(stream_));
}

void DeviceContext::activate() const {
  int cur = -1;
  MINIDL_CUDA_CHECK(cudaGetDevice(&cur));
  if (cur != index_) MINIDL_CUDA_CHECK(cudaSetDevice(index_));
}

void DeviceContext::synchronize() const { MINIDL_CUDA_CHECK(cudaStreamSynchronize(stream_)); }

bool DeviceContext::capturing() const {
  cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
  MINIDL_CUDA_CHECK(cudaStreamIsCapturing(stream_, &st));
  return st != cudaStreamCaptureStatusNone;
}

cublasHandle_t DeviceContext::cublas() {
  std::lock_guard<std::mutex> lock(mu_);
  if (cublas_ == nullptr) {
    activate();
    // cuBLAS's workspace comes from the caching allocator (as in PyTorch), so it is counted. It is
    // drawn before the handle is published: under a tight budget it may throw OutOfMemoryError (the
    // max-batch finder's normal case), and a handle published without it would make every later
    // GEMM use cuBLAS's own, uncounted workspace.
    if (cublas_ws_ == nullptr) cublas_ws_ = allocator_->allocate(kCublasWorkspace);
    cublasHandle_t h = nullptr;
    MINIDL_CUBLAS_CHECK(cublasCreate(&h));
    // Until published, a failure destroys the handle, so the next call starts over.
    const Unpublished guard{h, [](cublasHandle_t x) { MINIDL_CUBLAS_LOG(cublasDestroy(x)); }};
    // cublasSetStream resets the workspace to the default pool: the stream first, then ours.
    MINIDL_CUBLAS_CHECK(cublasSetStream(h, stream_));
    MINIDL_CUBLAS_CHECK(cublasSetWorkspace(h, cublas_ws_, kCublasWorkspace));
    cublas_ = std::exchange(h, nullptr);
  }
  return cublas_;
}

bool DeviceContext::release_cublas() {
  std::lock_guard<std::mutex> lock(mu_);
  if (cublas_ws_ == nullptr || allocator_->stats().allocated_bytes != static_cast<int64_t>(kCublasWorkspace))
    return false;
  activate();
  MINIDL_CUDA_CHECK(cudaStreamSynchronize(stream_));   // no GEMM may still use the workspace
  if (cublas_ != nullptr) MINIDL_CUBLAS_CHECK(cublasDestroy(std::exchange(cublas_, nullptr)));
  allocator_->deallocate(std::exchange(cublas_ws_, nullptr), kCublasWorkspace);
  return true;
}

cudnnHandle_t DeviceContext::cudnn() {
  std::lock_guard<std::mutex> lock(mu_);
  if (cudnn_ == nullptr) {
    activate();
    // Published only once bound to our stream: a handle left on the legacy default stream would run
    // convolutions out of order with everything else.
    cudnnHandle_t h = nullptr;
    MINIDL_CUDNN_CHECK(cudnnCreate(&h));
    const Unpublished guard{h, [](cudnnHandle_t x) { MINIDL_CUDNN_LOG(cudnnDestroy(x)); }};
    MINIDL_CUDNN_CHECK(cudnnSetStream(h, stream_));
    cudnn_ = std::exchange(h, nullptr);
  }
  return cudnn_;
}

size_t cublas_workspace_bytes() { return DeviceContext::kCublasWorkspace; }

DeviceContext& context(int index) {
  static std::mutex mu;
  static std::vector<DeviceContext*>* all = new std::vector<DeviceContext*>();
  std::lock_guard<std::mutex> lock(mu);
  const int n = device_count();
  MINIDL_CHECK(index >= 0 && index < n, "cuda:", index, " requested but ", runtime_status(),
               " visible; use cuda:0 .. cuda:", n - 1, " or the cpu device");
  if (static_cast<int>(all->size()) < n) all->resize(static_cast<size_t>(n), nullptr);
  if ((*all)[index] == nullptr) (*all)[index] = new DeviceContext(index);
  DeviceContext& ctx = *(*all)[index];
  ctx.activate();
  return ctx;
}

DeviceContext& context_of(const Tensor& t) {
  MINIDL_CHECK(t.device().is_cuda(), "CUDA backend: tensor ", t.meta(), " is not on a CUDA device");
  return context(t.device().index);
}

// ---- Public switches and queries (runtime.h) ----

void synchronize(int device) { context(device).synchronize(); }
CachingStats caching_stats(int device) { return context(device).allocator().detailed_stats(); }

std::string device_description(int device) {
  const cudaDeviceProp& p = context(device).props();
  int driver = 0, runtime = 0;
  MINIDL_CUDA_CHECK(cudaDriverGetVersion(&driver));
  MINIDL_CUDA_CHECK(cudaRuntimeGetVersion(&runtime));
  return std::string(p.name) + ", cc " + std::to_string(p.major) + "." + std::to_string(p.minor) + ", " +
         std::to_string(p.multiProcessorCount) + " SMs, " + std::to_string(p.totalGlobalMem >> 20) +
         " MiB, driver API " + std::to_string(driver) + ", runtime " + std::to_string(runtime) + ", cuDNN " +
         std::to_string(cudnnGetVersion());
}

}  // namespace minidl::cuda
