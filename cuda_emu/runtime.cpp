// The emulated CUDA runtime: the cuda* entry points the backend calls (cuda_runtime_api.h's own
// signatures), on host memory. One device; device memory is aligned host memory filled with 0xFF
// bytes (NaN / -1) so a read of memory nothing wrote shows; its capacity is MINIDL_EMU_MEMORY_MB
// (default 4096) so cudaMalloc can run out as a GPU does. Work goes through streams.cpp: deferred
// to the next synchronization point (the default) or run when queued (MINIDL_EMU_DEFER_STREAMS=0).
// Streams and events are in runtime_streams.cpp. A fault of device work is sticky (runtime_state.h):
// every later call returns it, and none of these throws.
#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <stdexcept>
#include <string>
#include <vector>

#include "cuda_emu/call_log.h"
#include "cuda_emu/emu_libs.h"
#include "cuda_emu/race_check.h"
#include "cuda_emu/runtime_state.h"
#include "cuda_emu/shared_arena.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace minidl::cuda::emu {
namespace {

struct State {
  std::mutex mu;
  std::map<uintptr_t, size_t> device;   // base -> bytes asked for, of live cudaMalloc allocations
  std::map<uintptr_t, size_t> pinned;   // base -> bytes of live cudaHostAlloc allocations
  size_t used = 0;
  size_t capacity = [] {
    const char* s = std::getenv("MINIDL_EMU_MEMORY_MB");
    return (s != nullptr ? std::strtoull(s, nullptr, 10) : 4096ull) << 20;
  }();
};
State& st() {
  static State* s = new State();   // never destroyed: tensors in statics free after main returns
  return *s;
}

thread_local cudaError_t t_last = cudaSuccess;
thread_local std::string t_detail;
thread_local cudaError_t t_detail_code = cudaSuccess;
thread_local int t_device = 0;

cudaError_t fail(cudaError_t e, const std::string& detail) { return runtime_fail(e, detail); }

bool range_live_locked(State& s, const void* p, size_t bytes) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  return range_inside(s.device, a, bytes) || mapped_range_live(a, bytes);
}

bool is_pinned(const void* p, size_t bytes) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  return range_inside(s.pinned, reinterpret_cast<uintptr_t>(p), bytes);
}

bool is_device(const void* p) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  return range_live_locked(s, p, 1);
}

// The checks a copy's direction implies: device sides inside live allocations, host sides not.
cudaError_t check_copy(void* dst, const void* src, size_t n, cudaMemcpyKind kind, const char* fn) {
  if (n == 0) return cudaSuccess;
  if (dst == nullptr || src == nullptr) return fail(cudaErrorInvalidValue, std::string(fn) + ": a NULL pointer");
  const bool dst_dev = kind == cudaMemcpyDeviceToDevice || kind == cudaMemcpyHostToDevice;
  const bool src_dev = kind == cudaMemcpyDeviceToDevice || kind == cudaMemcpyDeviceToHost;
  if (kind == cudaMemcpyDefault) return cudaSuccess;
  if (kind > cudaMemcpyDefault) return fail(cudaErrorInvalidMemcpyDirection, std::string(fn) + ": bad direction");
  if (dst_dev && !device_range_live(dst, n)) {
    return fail(cudaErrorInvalidValue, std::string(fn) + ": destination range of " + std::to_string(n) +
                                           " bytes is not inside one live device allocation");
  }
  if (src_dev && !device_range_live(src, n)) {
    return fail(cudaErrorInvalidValue, std::string(fn) + ": source range of " + std::to_string(n) +
                                           " bytes is not inside one live device allocation");
  }
  if ((!dst_dev && is_device(dst)) || (!src_dev && is_device(src))) {
    return fail(cudaErrorInvalidValue, std::string(fn) + ": a host side of the copy is device memory");
  }
  return cudaSuccess;
}

// A copy as stream work: its device sides are told to the race check.
void device_copy(void* dst, const void* src, size_t n, bool dst_dev, bool src_dev) {
  // Checked again as it runs: a captured copy replayed after its memory was freed is an illegal address.
  if ((src_dev && !device_range_live(src, n)) || (dst_dev && !device_range_live(dst, n))) {
    throw std::runtime_error("a copy of " + std::to_string(n) + " bytes runs on a " +
                             (src_dev && !device_range_live(src, n) ? "source" : "destination") +
                             " range that is no longer inside one live device allocation (illegal address; freed "
                             "since a graph captured the copy?)");
  }
  // The step-time model's call log (call_log.h), as the copy runs.
  log_transfer(src_dev ? (dst_dev ? "memcpy DtoD" : "memcpy DtoH") : (dst_dev ? "memcpy HtoD" : "memcpy HtoH"), n,
               nullptr);
  if (src_dev) race_note(src, n, AccessKind::Load);
  if (dst_dev) race_note(dst, n, AccessKind::Store);
  std::memmove(dst, src, n);
}

std::string copy_label(const char* fn, bool dst_dev, bool src_dev, size_t n) {
  return std::string(fn) + " (" + (src_dev ? "device" : "host") + " to " + (dst_dev ? "device" : "host") + ", " +
         std::to_string(n) + " bytes)";
}

// The cuBLAS / cuDNN stand-ins ask the runtime which ranges and streams are live.
const bool g_hooks = [] {
  set_device_range_checker([](const void* p, size_t n) { return device_range_live(p, n); });
  set_stream_checker([](cudaStream_t s) { return stream_live(s); });
  set_stream_flusher([](cudaStream_t s) { synchronize_stream(s); });
  set_capture_recorder([](cudaStream_t s, const std::function<void()>& work, const char* label) {
    if (!stream_capturing(s)) return false;
    enqueue(s, work, label);   // recorded (or refused: the capture's error is the last error)
    return true;
  });
  return true;
}();

// The device's sticky fault (runtime_state.h).
struct Fault {
  std::atomic<cudaError_t> code{cudaSuccess};
  std::mutex mu;
  std::string detail;
};
Fault& fault_state() {
  static auto* f = new Fault();   // never destroyed: destructors of statics ask it after main returns
  return *f;
}

}  // namespace

void device_fault(const std::string& detail) {
  Fault& f = fault_state();
  std::lock_guard<std::mutex> lock(f.mu);
  if (f.code.load() != cudaSuccess) return;
  f.detail = detail;
  f.code.store(cudaErrorLaunchFailure);
}

cudaError_t device_error() { return fault_state().code.load(std::memory_order_relaxed); }

void clear_device_fault() {
  Fault& f = fault_state();
  std::lock_guard<std::mutex> lock(f.mu);
  f.code.store(cudaSuccess);
  f.detail.clear();
  t_last = cudaSuccess;
}

void set_last_error(cudaError_t e, const std::string& detail) {
  t_last = e;
  t_detail = detail;
  t_detail_code = e;
}

#if defined(__SANITIZE_ADDRESS__)
void poison_device(const void* p, size_t bytes, cudaStream_t stream, bool captured) {
  enqueue(stream, [p, bytes] { ASAN_POISON_MEMORY_REGION(p, bytes); }, {}, captured);
}
void unpoison_device(const void* p, size_t bytes, cudaStream_t stream, bool captured) {
  enqueue(stream, [p, bytes] { ASAN_UNPOISON_MEMORY_REGION(p, bytes); }, {}, captured);
}
bool asan_build() { return true; }
namespace {
void poison_host(const void* p, size_t bytes) { ASAN_POISON_MEMORY_REGION(p, bytes); }
void unpoison_host(const void* p, size_t bytes) { ASAN_UNPOISON_MEMORY_REGION(p, bytes); }
}  // namespace
#else
void poison_device(const void*, size_t, cudaStream_t, bool) {}
void unpoison_device(const void*, size_t, cudaStream_t, bool) {}
bool asan_build() { return false; }
namespace {
void poison_host(const void*, size_t) {}
void unpoison_host(const void*, size_t) {}
}  // namespace
#endif

bool device_range_live(const void* p, size_t bytes) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  return range_live_locked(s, p, bytes);
}

std::vector<std::pair<uintptr_t, size_t>> device_allocations() {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  std::vector<std::pair<uintptr_t, size_t>> v;
  v.reserve(s.device.size());
  for (const auto& [base, bytes] : s.device) v.emplace_back(base, (bytes + 255) / 256 * 256);
  const std::vector<std::pair<uintptr_t, size_t>> mapped = mapped_ranges();
  v.insert(v.end(), mapped.begin(), mapped.end());
  std::sort(v.begin(), v.end());
  return v;
}

bool take_device_capacity(size_t bytes) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.used + bytes > s.capacity) return false;
  s.used += bytes;
  return true;
}

void give_device_capacity(size_t bytes) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  s.used -= bytes;
}

}  // namespace minidl::cuda::emu

using namespace minidl::cuda::emu;   // NOLINT: the C entry points below are the runtime's

extern "C" {

cudaError_t cudaGetDeviceCount(int* count) {
  if (count == nullptr) return fail(cudaErrorInvalidValue, "cudaGetDeviceCount: NULL");
  *count = 1;
  return cudaSuccess;
}

cudaError_t cudaSetDevice(int device) {
  if (device != 0) return fail(cudaErrorInvalidDevice, "cudaSetDevice: the emulator has one device, 0");
  t_device = device;
  return cudaSuccess;
}

cudaError_t cudaGetDevice(int* device) {
  if (device == nullptr) return fail(cudaErrorInvalidValue, "cudaGetDevice: NULL");
  *device = t_device;
  return cudaSuccess;
}

cudaError_t cudaGetDeviceProperties(cudaDeviceProp* p, int device) {
  if (p == nullptr || device != 0) return fail(cudaErrorInvalidDevice, "cudaGetDeviceProperties: no such device");
  *p = cudaDeviceProp{};
  std::strncpy(p->name, "minidl emulated CUDA device (CPU)", sizeof(p->name) - 1);
  p->totalGlobalMem = st().capacity;
  p->sharedMemPerBlock = 48 * 1024;
  p->sharedMemPerBlockOptin = kSharedOptInLimit;   // cudaFuncSetAttribute's ceiling (kernel_attributes.cpp)
  p->sharedMemPerMultiprocessor = 228 * 1024;
  p->regsPerBlock = 65536;
  p->warpSize = 32;
  p->maxThreadsPerBlock = 1024;
  p->maxThreadsDim[0] = 1024;
  p->maxThreadsDim[1] = 1024;
  p->maxThreadsDim[2] = 64;
  p->maxGridSize[0] = 2147483647;
  p->maxGridSize[1] = 65535;
  p->maxGridSize[2] = 65535;
  p->major = 9;
  p->minor = 0;
  p->multiProcessorCount = 132;
  return cudaSuccess;
}

cudaError_t cudaDriverGetVersion(int* v) {
  if (v == nullptr) return fail(cudaErrorInvalidValue, "cudaDriverGetVersion: NULL");
  *v = CUDART_VERSION;
  return cudaSuccess;
}

cudaError_t cudaRuntimeGetVersion(int* v) {
  if (v == nullptr) return fail(cudaErrorInvalidValue, "cudaRuntimeGetVersion: NULL");
  *v = CUDART_VERSION;
  return cudaSuccess;
}

// A sticky fault is every call's last error, and reading it does not clear it.
cudaError_t cudaGetLastError(void) {
  MINIDL_EMU_STICKY();
  const cudaError_t e = t_last;
  t_last = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) {
  MINIDL_EMU_STICKY();
  return t_last;
}

const char* cudaGetErrorName(cudaError_t e) {
  const ErrorText* t = error_text(e);
  return t != nullptr ? t->name : "cudaErrorUnknown";
}

const char* cudaGetErrorString(cudaError_t e) {
  static thread_local std::string s;
  const ErrorText* t = error_text(e);
  s = t != nullptr ? t->meaning : "unknown error";
  if (Fault& f = fault_state(); e != cudaSuccess && e == device_error()) {
    std::lock_guard<std::mutex> lock(f.mu);
    s += " [emulator: " + f.detail + "]";
  } else if (e == t_detail_code && !t_detail.empty()) {
    s += " [emulator: " + t_detail + "]";
  }
  return s.c_str();
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  MINIDL_EMU_STICKY();
  if (p == nullptr) return fail(cudaErrorInvalidValue, "cudaMalloc: NULL output pointer");
  if (const cudaError_t c = capture_forbids("cudaMalloc"); c != cudaSuccess) return c;
  *p = nullptr;
  if (bytes == 0) return cudaSuccess;
  const size_t rounded = (bytes + 255) / 256 * 256;
  State& s = st();
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.used + rounded > s.capacity) {
      return fail(cudaErrorMemoryAllocation, "cudaMalloc(" + std::to_string(bytes) + "): " + std::to_string(s.used) +
                                                 " of " + std::to_string(s.capacity) + " bytes in use");
    }
    s.used += rounded;
  }
  void* m = std::aligned_alloc(256, rounded);
  if (m == nullptr) {
    std::lock_guard<std::mutex> lock(s.mu);
    s.used -= rounded;
    return fail(cudaErrorMemoryAllocation, "cudaMalloc: the host is out of memory");
  }
  std::memset(m, 0xFF, rounded);
  std::lock_guard<std::mutex> lock(s.mu);
  s.device[reinterpret_cast<uintptr_t>(m)] = bytes;   // ranges end where the caller's bytes do
  *p = m;
  return cudaSuccess;
}

cudaError_t cudaFree(void* p) {
  if (p == nullptr) return cudaSuccess;
  if (const cudaError_t c = capture_forbids("cudaFree"); c != cudaSuccess) return c;
  synchronize_all();   // cudaFree waits for the device's work, as on a GPU
  race_host_waits_all();
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.device.find(reinterpret_cast<uintptr_t>(p));
  if (it == s.device.end()) return fail(cudaErrorInvalidValue, "cudaFree: not the start of a live allocation");
  s.used -= (it->second + 255) / 256 * 256;
  unpoison_host(p, (it->second + 255) / 256 * 256);
  s.device.erase(it);
  std::free(p);
  return device_error();   // freed even after a fault (a destructor's call), which it then reports
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  MINIDL_EMU_STICKY();
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  if (free_bytes != nullptr) *free_bytes = s.capacity - s.used;
  if (total != nullptr) *total = s.capacity;
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) {
  MINIDL_EMU_STICKY();
  if (p == nullptr) return fail(cudaErrorInvalidValue, "cudaHostAlloc: NULL output pointer");
  if (const cudaError_t c = capture_forbids("cudaHostAlloc"); c != cudaSuccess) return c;
  *p = std::aligned_alloc(4096, (bytes + 4095) / 4096 * 4096);
  if (*p == nullptr) return fail(cudaErrorMemoryAllocation, "cudaHostAlloc: out of host memory");
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  s.pinned[reinterpret_cast<uintptr_t>(*p)] = bytes;
  return cudaSuccess;
}

cudaError_t cudaMallocHost(void** p, size_t bytes) { return cudaHostAlloc(p, bytes, 0); }

cudaError_t cudaFreeHost(void* p) {
  if (p == nullptr) return cudaSuccess;
  if (const cudaError_t c = capture_forbids("cudaFreeHost"); c != cudaSuccess) return c;
  synchronize_all();   // as cudaFree
  race_host_waits_all();
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.pinned.erase(reinterpret_cast<uintptr_t>(p)) == 0) {
    return fail(cudaErrorInvalidValue, "cudaFreeHost: not a live pinned allocation");
  }
  std::free(p);
  return device_error();
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t stream) {
  MINIDL_EMU_STICKY();
  if (!stream_live(stream)) return fail(cudaErrorInvalidResourceHandle, "cudaMemcpyAsync: stream is not live");
  if (const cudaError_t e = check_copy(dst, src, n, kind, "cudaMemcpyAsync"); e != cudaSuccess) return e;
  if (n == 0) return cudaSuccess;
  const bool dst_dev = is_device(dst), src_dev = is_device(src);
  const std::string label = copy_label("cudaMemcpyAsync", dst_dev, src_dev, n);
  if ((!dst_dev && !is_pinned(dst, n)) || (!src_dev && !is_pinned(src, n))) {
    // A graph replays a copy from the addresses it captured, so CUDA refuses pageable host memory.
    if (const cudaError_t c = capture_refuse(stream, label + " with pageable host memory on a capturing stream: a "
                                                     "graph's copy must use pinned host memory (cudaHostAlloc), "
                                                     "or keep the data on the device");
        c != cudaSuccess) {
      return c;
    }
  }
  cudaError_t queued = cudaSuccess;
  if (!dst_dev && !is_pinned(dst, n)) {
    // Into pageable host memory the call returns once the copy is done (CUDA's API sync notes).
    run_now(stream, [&] { device_copy(dst, src, n, dst_dev, src_dev); }, label);
    race_host_waits_stream(stream);
  } else if (!src_dev && !is_pinned(src, n)) {
    // From pageable host memory the bytes are staged before the call returns.
    auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                               static_cast<const unsigned char*>(src) + n);
    queued = enqueue(stream, [dst, staged, dst_dev] { device_copy(dst, staged->data(), staged->size(), dst_dev, false); },
                     label);
  } else if (!dst_dev) {
    // Into pinned memory: the host must not read it before a synchronization; under ASan it is
    // poisoned until the copy runs, so a read without one is reported.
    if (deferred_streams() && !stream_capturing(stream)) poison_host(dst, n);
    queued = enqueue(stream, [dst, src, n, src_dev] {
      unpoison_host(dst, n);
      device_copy(dst, src, n, false, src_dev);
    }, label);
  } else {
    queued = enqueue(stream, [dst, src, n, src_dev] { device_copy(dst, src, n, true, src_dev); }, label);
  }
  return queued != cudaSuccess ? queued : device_error();
}

// On the legacy default stream, returning when done: the emulator runs every stream first (a valid
// schedule), but the race check orders the copy after what the legacy stream would wait for only.
cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  MINIDL_EMU_STICKY();
  if (const cudaError_t e = check_copy(dst, src, n, kind, "cudaMemcpy"); e != cudaSuccess) return e;
  if (const cudaError_t c = capture_forbids("cudaMemcpy (synchronous)"); c != cudaSuccess) return c;
  synchronize_all();
  if (n == 0) return device_error();
  const bool dst_dev = is_device(dst), src_dev = is_device(src);
  run_now(nullptr, [&] { device_copy(dst, src, n, dst_dev, src_dev); }, copy_label("cudaMemcpy", dst_dev, src_dev, n));
  race_host_waits_stream(nullptr);
  return device_error();
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t n, cudaStream_t stream) {
  MINIDL_EMU_STICKY();
  if (!stream_live(stream)) return fail(cudaErrorInvalidResourceHandle, "cudaMemsetAsync: stream is not live");
  if (n == 0) return cudaSuccess;
  if (!device_range_live(p, n)) {
    return fail(cudaErrorInvalidValue, "cudaMemsetAsync: range of " + std::to_string(n) +
                                                   " bytes is not inside one live device allocation");
  }
  const cudaError_t queued = enqueue(stream, [p, value, n] {
    if (!device_range_live(p, n)) {
      throw std::runtime_error("a memset of " + std::to_string(n) + " bytes runs on a range that is no longer "
                               "inside one live device allocation (illegal address; freed since a graph captured it?)");
    }
    log_transfer("memset", n, nullptr);
    race_note(p, n, AccessKind::Store);
    std::memset(p, value, n);
  }, "cudaMemsetAsync of " + std::to_string(n) + " bytes");
  return queued != cudaSuccess ? queued : device_error();
}

cudaError_t cudaMemset(void* p, int value, size_t n) { return cudaMemsetAsync(p, value, n, nullptr); }

}  // extern "C"
