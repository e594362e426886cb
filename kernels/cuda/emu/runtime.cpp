// The emulated CUDA runtime: the cuda* entry points the backend calls (cuda_runtime_api.h's own
// signatures), on host memory. One device; device memory is aligned host memory filled with 0xFF
// bytes (NaN / -1) so a read of memory nothing wrote shows; its capacity is MINIDL_EMU_MEMORY_MB
// (default 4096) so cudaMalloc can run out as a GPU does. Work goes through streams.cpp: deferred
// to the next synchronization point (the default) or run when queued (MINIDL_EMU_DEFER_STREAMS=0);
// events mark a stream position and record the host time when their stream reaches it.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <vector>

#include "kernels/cuda/emu/call_log.h"
#include "kernels/cuda/emu/emu_libs.h"
#include "kernels/cuda/emu/runtime_state.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace minidl::cuda::emu {
namespace {

struct EmuStream {
  unsigned flags = 0;
};
// The host time at which the stream reached the event's position (unset until it did).
struct Stamp {
  bool set = false;
  std::chrono::steady_clock::time_point at{};
};
struct EmuEvent {
  unsigned flags = 0;
  StreamPos pos{};                 // the recording stream's work up to the last cudaEventRecord
  std::shared_ptr<Stamp> stamp;    // shared with the queued work that sets it
};

struct State {
  std::mutex mu;
  std::map<uintptr_t, size_t> device;   // base -> bytes asked for, of live cudaMalloc allocations
  std::map<uintptr_t, size_t> pinned;   // base -> bytes of live cudaHostAlloc allocations
  std::set<const void*> streams, events;
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

cudaError_t fail(cudaError_t e, const std::string& detail) {
  set_last_error(e, detail);
  return e;
}

bool range_live_locked(State& s, const void* p, size_t bytes) {
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = s.device.upper_bound(a);
  if (it == s.device.begin()) return false;
  --it;
  return a >= it->first && a + bytes <= it->first + it->second;
}

bool is_pinned(const void* p, size_t bytes) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  const auto a = reinterpret_cast<uintptr_t>(p);
  auto it = s.pinned.upper_bound(a);
  if (it == s.pinned.begin()) return false;
  --it;
  return a >= it->first && a + bytes <= it->first + it->second;
}

bool is_device(const void* p) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  return range_live_locked(s, p, 1);
}

// The call log's name of a copy (call_log.h), from where its ends really are.
const char* copy_op(cudaMemcpyKind kind, const void* src, const void* dst) {
  if (kind == cudaMemcpyHostToHost) return "memcpy HtoH";
  const bool s = is_device(src), d = is_device(dst);
  return s && d ? "memcpy DtoD" : s ? "memcpy DtoH" : d ? "memcpy HtoD" : "memcpy HtoH";
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

// The cuBLAS / cuDNN stand-ins ask the runtime which ranges and streams are live.
const bool g_hooks = [] {
  set_device_range_checker([](const void* p, size_t n) { return device_range_live(p, n); });
  set_stream_checker([](cudaStream_t s) { return stream_live(s); });
  set_stream_flusher([](cudaStream_t s) { synchronize_stream(s); });
  return true;
}();

// Streams and events are heap objects whose addresses are the handles, kept in a registry so a
// destroyed or foreign handle gets CUDA's cudaErrorInvalidResourceHandle instead of a crash.
using Registry = std::set<const void*> State::*;

template <typename T, typename Handle>
cudaError_t create_handle(Handle* out, T init, Registry registry, const char* call) {
  if (out == nullptr) return fail(cudaErrorInvalidValue, std::string(call) + ": NULL");
  auto* h = new T(init);
  *out = reinterpret_cast<Handle>(h);
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  (s.*registry).insert(h);
  return cudaSuccess;
}

template <typename T, typename Handle>
cudaError_t destroy_handle(Handle h, Registry registry, const char* why) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  if ((s.*registry).erase(h) == 0) return fail(cudaErrorInvalidResourceHandle, why);
  delete reinterpret_cast<T*>(h);
  return cudaSuccess;
}

}  // namespace

void set_last_error(cudaError_t e, const std::string& detail) {
  t_last = e;
  t_detail = detail;
  t_detail_code = e;
}

bool stream_live(cudaStream_t s) {
  if (s == nullptr) return true;
  State& st_ = st();
  std::lock_guard<std::mutex> lock(st_.mu);
  return st_.streams.count(s) != 0;
}

#if defined(__SANITIZE_ADDRESS__)
void poison_device(const void* p, size_t bytes, cudaStream_t stream) {
  enqueue(stream, [p, bytes] { ASAN_POISON_MEMORY_REGION(p, bytes); });
}
void unpoison_device(const void* p, size_t bytes, cudaStream_t stream) {
  enqueue(stream, [p, bytes] { ASAN_UNPOISON_MEMORY_REGION(p, bytes); });
}
bool asan_build() { return true; }
namespace {
void poison_host(const void* p, size_t bytes) { ASAN_POISON_MEMORY_REGION(p, bytes); }
void unpoison_host(const void* p, size_t bytes) { ASAN_UNPOISON_MEMORY_REGION(p, bytes); }
}  // namespace
#else
void poison_device(const void*, size_t, cudaStream_t) {}
void unpoison_device(const void*, size_t, cudaStream_t) {}
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
  return v;
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

cudaError_t cudaGetLastError(void) {
  const cudaError_t e = t_last;
  t_last = cudaSuccess;
  return e;
}

cudaError_t cudaPeekAtLastError(void) { return t_last; }

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess: return "cudaSuccess";
    case cudaErrorInvalidValue: return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation: return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration: return "cudaErrorInvalidConfiguration";
    case cudaErrorInvalidDevice: return "cudaErrorInvalidDevice";
    case cudaErrorInvalidResourceHandle: return "cudaErrorInvalidResourceHandle";
    case cudaErrorInvalidMemcpyDirection: return "cudaErrorInvalidMemcpyDirection";
    case cudaErrorNotReady: return "cudaErrorNotReady";
    default: return "cudaErrorUnknown";
  }
}

const char* cudaGetErrorString(cudaError_t e) {
  static thread_local std::string s;
  switch (e) {
    case cudaSuccess: s = "no error"; break;
    case cudaErrorInvalidValue: s = "invalid argument"; break;
    case cudaErrorMemoryAllocation: s = "out of memory"; break;
    case cudaErrorInvalidConfiguration: s = "invalid configuration argument"; break;
    case cudaErrorInvalidDevice: s = "invalid device ordinal"; break;
    case cudaErrorInvalidResourceHandle: s = "invalid resource handle"; break;
    case cudaErrorInvalidMemcpyDirection: s = "invalid copy direction for memcpy"; break;
    case cudaErrorNotReady: s = "device not ready"; break;
    default: s = "unknown error"; break;
  }
  if (e == t_detail_code && !t_detail.empty()) s += " [emulator: " + t_detail + "]";
  return s.c_str();
}

cudaError_t cudaMalloc(void** p, size_t bytes) {
  if (p == nullptr) return fail(cudaErrorInvalidValue, "cudaMalloc: NULL output pointer");
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
  synchronize_all();   // cudaFree waits for the device's work, as on a GPU
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.device.find(reinterpret_cast<uintptr_t>(p));
  if (it == s.device.end()) return fail(cudaErrorInvalidValue, "cudaFree: not the start of a live allocation");
  s.used -= (it->second + 255) / 256 * 256;
  unpoison_host(p, (it->second + 255) / 256 * 256);
  s.device.erase(it);
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMemGetInfo(size_t* free_bytes, size_t* total) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  if (free_bytes != nullptr) *free_bytes = s.capacity - s.used;
  if (total != nullptr) *total = s.capacity;
  return cudaSuccess;
}

cudaError_t cudaHostAlloc(void** p, size_t bytes, unsigned int) {
  if (p == nullptr) return fail(cudaErrorInvalidValue, "cudaHostAlloc: NULL output pointer");
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
  synchronize_all();   // as cudaFree
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  if (s.pinned.erase(reinterpret_cast<uintptr_t>(p)) == 0) {
    return fail(cudaErrorInvalidValue, "cudaFreeHost: not a live pinned allocation");
  }
  std::free(p);
  return cudaSuccess;
}

cudaError_t cudaMemcpyAsync(void* dst, const void* src, size_t n, cudaMemcpyKind kind, cudaStream_t stream) {
  if (!stream_live(stream)) return fail(cudaErrorInvalidResourceHandle, "cudaMemcpyAsync: stream is not live");
  if (const cudaError_t e = check_copy(dst, src, n, kind, "cudaMemcpyAsync"); e != cudaSuccess) return e;
  if (n == 0) return cudaSuccess;
  const bool dst_dev = is_device(dst), src_dev = is_device(src);
  if (!dst_dev && !is_pinned(dst, n)) {
    // Into pageable host memory the call returns once the copy is done (CUDA's API sync notes).
    synchronize_stream(stream);
    log_transfer(copy_op(kind, src, dst), n, stream);
    std::memmove(dst, src, n);
  } else if (!src_dev && !is_pinned(src, n)) {
    // From pageable host memory the bytes are staged before the call returns.
    auto staged = std::make_shared<std::vector<unsigned char>>(static_cast<const unsigned char*>(src),
                                                               static_cast<const unsigned char*>(src) + n);
    enqueue(stream, [dst, staged, stream] {
      log_transfer("memcpy HtoD", staged->size(), stream);
      std::memmove(dst, staged->data(), staged->size());
    });
  } else if (!dst_dev) {
    // Into pinned memory: the host must not read it before a synchronization; under ASan it is
    // poisoned until the copy runs, so a read without one is reported.
    if (deferred_streams()) poison_host(dst, n);
    enqueue(stream, [dst, src, n, stream] {
      log_transfer("memcpy DtoH", n, stream);
      unpoison_host(dst, n);
      std::memmove(dst, src, n);
    });
  } else {
    enqueue(stream, [dst, src, n, stream, op = copy_op(kind, src, dst)] {
      log_transfer(op, n, stream);
      std::memmove(dst, src, n);
    });
  }
  return cudaSuccess;
}

cudaError_t cudaMemcpy(void* dst, const void* src, size_t n, cudaMemcpyKind kind) {
  if (const cudaError_t e = check_copy(dst, src, n, kind, "cudaMemcpy"); e != cudaSuccess) return e;
  synchronize_all();   // the legacy default stream after every blocking stream; returns when done
  if (n != 0) log_transfer(copy_op(kind, src, dst), n, nullptr);
  if (n != 0) std::memmove(dst, src, n);
  return cudaSuccess;
}

cudaError_t cudaMemsetAsync(void* p, int value, size_t n, cudaStream_t stream) {
  if (!stream_live(stream)) return fail(cudaErrorInvalidResourceHandle, "cudaMemsetAsync: stream is not live");
  if (n == 0) return cudaSuccess;
  if (!device_range_live(p, n)) {
    return fail(cudaErrorInvalidValue, "cudaMemsetAsync: range of " + std::to_string(n) +
                                           " bytes is not inside one live device allocation");
  }
  enqueue(stream, [p, value, n, stream] {
    log_transfer("memset", n, stream);
    std::memset(p, value, n);
  });
  return cudaSuccess;
}

cudaError_t cudaMemset(void* p, int value, size_t n) { return cudaMemsetAsync(p, value, n, nullptr); }

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  const cudaError_t e = create_handle(s, EmuStream{flags}, &State::streams, "cudaStreamCreateWithFlags");
  if (e == cudaSuccess) register_stream(*s, (flags & cudaStreamNonBlocking) == 0);
  return e;
}

cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (s != nullptr && stream_live(s)) forget_stream(s);
  return destroy_handle<EmuStream>(s, &State::streams, "cudaStreamDestroy: not a live stream");
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  if (!stream_live(s)) return fail(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize: not a live stream");
  synchronize_stream(s);
  return cudaSuccess;
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
  if (!stream_live(s)) return fail(cudaErrorInvalidResourceHandle, "cudaStreamQuery: not a live stream");
  synchronize_stream(s);   // a valid answer: the device may have finished it by now
  return cudaSuccess;
}

cudaError_t cudaDeviceSynchronize(void) {
  synchronize_all();
  return cudaSuccess;
}

static bool event_live(cudaEvent_t e) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.events.count(e) != 0;
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  return create_handle(e, EmuEvent{flags, {}, nullptr}, &State::events, "cudaEventCreate");
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  return destroy_handle<EmuEvent>(e, &State::events, "cudaEventDestroy: not a live event");
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  if (!event_live(e) || !stream_live(s)) {
    return fail(cudaErrorInvalidResourceHandle, "cudaEventRecord: event or stream not live");
  }
  auto* ev = reinterpret_cast<EmuEvent*>(e);
  auto stamp = std::make_shared<Stamp>();
  ev->stamp = stamp;
  enqueue(s, [stamp] {
    stamp->at = std::chrono::steady_clock::now();
    stamp->set = true;
  });
  ev->pos = stream_tail(s);
  return cudaSuccess;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  if (!event_live(e)) return fail(cudaErrorInvalidResourceHandle, "cudaEventSynchronize: not a live event");
  run_until(reinterpret_cast<EmuEvent*>(e)->pos);
  return cudaSuccess;
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  if (!event_live(e)) return fail(cudaErrorInvalidResourceHandle, "cudaEventQuery: not a live event");
  run_until(reinterpret_cast<EmuEvent*>(e)->pos);   // a valid answer, as cudaStreamQuery
  return cudaSuccess;
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  if (ms == nullptr) return fail(cudaErrorInvalidValue, "cudaEventElapsedTime: NULL");
  if (!event_live(a) || !event_live(b)) return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: not live");
  auto* ea = reinterpret_cast<EmuEvent*>(a);
  auto* eb = reinterpret_cast<EmuEvent*>(b);
  if ((ea->flags & cudaEventDisableTiming) != 0 || (eb->flags & cudaEventDisableTiming) != 0) {
    return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event was created without timing");
  }
  if (!ea->stamp || !eb->stamp) return fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: not recorded");
  if (!ea->stamp->set || !eb->stamp->set) {
    return fail(cudaErrorNotReady, "cudaEventElapsedTime: an event's stream has not reached it yet");
  }
  *ms = std::chrono::duration<float, std::milli>(eb->stamp->at - ea->stamp->at).count();
  return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  if (!event_live(e) || !stream_live(s)) {
    return fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: event or stream not live");
  }
  enqueue_wait(s, reinterpret_cast<EmuEvent*>(e)->pos);
  return cudaSuccess;
}

}  // extern "C"
