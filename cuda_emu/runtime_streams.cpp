// The emulated runtime's stream and event entry points (cuda_runtime_api.h's signatures): handles
// kept in a registry, stream order through streams.cpp, and the ordering each call creates told to
// the race check (race_check.h): an event carries its stream's clock, a stream that waits for it
// joins that clock, a host synchronization covers what it waited for. Events record the host time
// at which their stream reached them. After a device fault every call returns the sticky error.
#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <string>

#include "cuda_emu/race_check.h"
#include "cuda_emu/runtime_state.h"

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
  ClockPtr clock;                  // the race check's view of the same position
  cudaStream_t captured_on = nullptr;   // last recorded into this capturing stream (else nullptr)
};

struct Handles {
  std::mutex mu;
  std::set<const void*> streams, events;
};
Handles& handles() {
  static auto* h = new Handles();   // never destroyed: streams are used after main returns
  return *h;
}

// Streams and events are heap objects whose addresses are the handles, kept in a registry so a
// destroyed or foreign handle gets CUDA's cudaErrorInvalidResourceHandle instead of a crash.
using Registry = std::set<const void*> Handles::*;

template <typename T, typename Handle>
cudaError_t create_handle(Handle* out, T init, Registry registry, const char* call) {
  if (out == nullptr) return runtime_fail(cudaErrorInvalidValue, std::string(call) + ": NULL");
  auto* h = new T(init);
  *out = reinterpret_cast<Handle>(h);
  Handles& s = handles();
  std::lock_guard<std::mutex> lock(s.mu);
  (s.*registry).insert(h);
  return cudaSuccess;
}

template <typename T, typename Handle>
cudaError_t destroy_handle(Handle h, Registry registry, const char* why) {
  Handles& s = handles();
  std::lock_guard<std::mutex> lock(s.mu);
  if ((s.*registry).erase(h) == 0) return runtime_fail(cudaErrorInvalidResourceHandle, why);
  delete reinterpret_cast<T*>(h);
  return cudaSuccess;
}

// An event last recorded into a capture marks no point of real work: waiting for it is refused.
template <typename Ev>
cudaError_t event_captured(const char* call, Ev* ev) {
  if (ev->captured_on != nullptr && stream_capturing(ev->captured_on)) {
    return capture_forbids_on(call, ev->captured_on);
  }
  return capture_forbids(call);
}

bool event_live(cudaEvent_t e) {
  Handles& s = handles();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.events.count(e) != 0;
}

}  // namespace

bool stream_live(cudaStream_t s) {
  if (s == nullptr) return true;
  Handles& h = handles();
  std::lock_guard<std::mutex> lock(h.mu);
  return h.streams.count(s) != 0;
}

}  // namespace minidl::cuda::emu

using namespace minidl::cuda::emu;   // NOLINT: the C entry points below are the runtime's

extern "C" {

cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int flags) {
  MINIDL_EMU_STICKY();
  const cudaError_t e = create_handle(s, EmuStream{flags}, &Handles::streams, "cudaStreamCreateWithFlags");
  if (e == cudaSuccess) register_stream(*s, (flags & cudaStreamNonBlocking) == 0);
  return e;
}

cudaError_t cudaStreamCreate(cudaStream_t* s) { return cudaStreamCreateWithFlags(s, cudaStreamDefault); }

cudaError_t cudaStreamGetFlags(cudaStream_t s, unsigned int* flags) {
  if (flags == nullptr) return runtime_fail(cudaErrorInvalidValue, "cudaStreamGetFlags: NULL");
  if (!stream_live(s)) return runtime_fail(cudaErrorInvalidResourceHandle, "cudaStreamGetFlags: not a live stream");
  *flags = s == nullptr ? cudaStreamDefault : reinterpret_cast<EmuStream*>(s)->flags;
  return cudaSuccess;
}

// Destroying still frees the handle after a fault (a destructor's call), and then reports it.
cudaError_t cudaStreamDestroy(cudaStream_t s) {
  if (s != nullptr && stream_live(s)) forget_stream(s);
  const cudaError_t e = destroy_handle<EmuStream>(s, &Handles::streams, "cudaStreamDestroy: not a live stream");
  return device_error() != cudaSuccess ? device_error() : e;
}

cudaError_t cudaStreamSynchronize(cudaStream_t s) {
  MINIDL_EMU_STICKY();
  if (!stream_live(s)) return runtime_fail(cudaErrorInvalidResourceHandle, "cudaStreamSynchronize: not a live stream");
  if (const cudaError_t c = capture_forbids_on("cudaStreamSynchronize", s); c != cudaSuccess) return c;
  synchronize_stream(s);
  race_host_waits_stream(s);
  return device_error();
}

cudaError_t cudaStreamQuery(cudaStream_t s) {
  MINIDL_EMU_STICKY();
  if (!stream_live(s)) return runtime_fail(cudaErrorInvalidResourceHandle, "cudaStreamQuery: not a live stream");
  if (const cudaError_t c = capture_forbids_on("cudaStreamQuery", s); c != cudaSuccess) return c;
  synchronize_stream(s);   // a valid answer: the device may have finished it by now
  race_host_waits_stream(s);
  return device_error();
}

cudaError_t cudaDeviceSynchronize(void) {
  MINIDL_EMU_STICKY();
  if (const cudaError_t c = capture_forbids("cudaDeviceSynchronize"); c != cudaSuccess) return c;
  synchronize_all();
  race_host_waits_all();
  return device_error();
}

cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int flags) {
  MINIDL_EMU_STICKY();
  return create_handle(e, EmuEvent{flags, {}, nullptr, nullptr}, &Handles::events, "cudaEventCreate");
}

cudaError_t cudaEventCreate(cudaEvent_t* e) { return cudaEventCreateWithFlags(e, cudaEventDefault); }

cudaError_t cudaEventDestroy(cudaEvent_t e) {
  const cudaError_t r = destroy_handle<EmuEvent>(e, &Handles::events, "cudaEventDestroy: not a live event");
  return device_error() != cudaSuccess ? device_error() : r;
}

cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
  MINIDL_EMU_STICKY();
  if (!event_live(e) || !stream_live(s)) {
    return runtime_fail(cudaErrorInvalidResourceHandle, "cudaEventRecord: event or stream not live");
  }
  auto* ev = reinterpret_cast<EmuEvent*>(e);
  auto stamp = std::make_shared<Stamp>();
  ev->stamp = stamp;
  const cudaError_t queued = enqueue(s, [stamp] {
    stamp->at = std::chrono::steady_clock::now();
    stamp->set = true;
  });
  ev->captured_on = stream_capturing(s) ? s : nullptr;
  ev->pos = stream_tail(s);
  ev->clock = race_stream_clock(s);
  return queued;
}

cudaError_t cudaEventSynchronize(cudaEvent_t e) {
  MINIDL_EMU_STICKY();
  if (!event_live(e)) return runtime_fail(cudaErrorInvalidResourceHandle, "cudaEventSynchronize: not a live event");
  if (const cudaError_t c = event_captured("cudaEventSynchronize", reinterpret_cast<EmuEvent*>(e)); c != cudaSuccess) return c;
  run_until(reinterpret_cast<EmuEvent*>(e)->pos);
  race_host_waits(reinterpret_cast<EmuEvent*>(e)->clock);
  return device_error();
}

cudaError_t cudaEventQuery(cudaEvent_t e) {
  MINIDL_EMU_STICKY();
  if (!event_live(e)) return runtime_fail(cudaErrorInvalidResourceHandle, "cudaEventQuery: not a live event");
  if (const cudaError_t c = event_captured("cudaEventQuery", reinterpret_cast<EmuEvent*>(e)); c != cudaSuccess) return c;
  run_until(reinterpret_cast<EmuEvent*>(e)->pos);   // a valid answer, as cudaStreamQuery
  race_host_waits(reinterpret_cast<EmuEvent*>(e)->clock);
  return device_error();
}

cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
  MINIDL_EMU_STICKY();
  if (ms == nullptr) return runtime_fail(cudaErrorInvalidValue, "cudaEventElapsedTime: NULL");
  if (!event_live(a) || !event_live(b)) {
    return runtime_fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: not live");
  }
  auto* ea = reinterpret_cast<EmuEvent*>(a);
  auto* eb = reinterpret_cast<EmuEvent*>(b);
  if ((ea->flags & cudaEventDisableTiming) != 0 || (eb->flags & cudaEventDisableTiming) != 0) {
    return runtime_fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: an event was created without timing");
  }
  if (!ea->stamp || !eb->stamp) {
    return runtime_fail(cudaErrorInvalidResourceHandle, "cudaEventElapsedTime: not recorded");
  }
  if (!ea->stamp->set || !eb->stamp->set) {
    return runtime_fail(cudaErrorNotReady, "cudaEventElapsedTime: an event's stream has not reached it yet");
  }
  *ms = std::chrono::duration<float, std::milli>(eb->stamp->at - ea->stamp->at).count();
  return cudaSuccess;
}

// A host function runs in stream order, as on a GPU (where a driver thread runs it once the stream's
// earlier work is done and holds the stream's later work until it returns): deferred, at the next
// synchronising call; immediate, at once. It may not call the CUDA API (as on a GPU). Captured, it is
// a node of the graph and runs at every replay.
cudaError_t cudaLaunchHostFunc(cudaStream_t s, cudaHostFn_t fn, void* data) {
  MINIDL_EMU_STICKY();
  if (fn == nullptr) return runtime_fail(cudaErrorInvalidValue, "cudaLaunchHostFunc: NULL function");
  if (!stream_live(s)) return runtime_fail(cudaErrorInvalidResourceHandle, "cudaLaunchHostFunc: not a live stream");
  return enqueue(s, [fn, data] { fn(data); }, "host function");
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
  MINIDL_EMU_STICKY();
  if (!event_live(e) || !stream_live(s)) {
    return runtime_fail(cudaErrorInvalidResourceHandle, "cudaStreamWaitEvent: event or stream not live");
  }
  auto* ev = reinterpret_cast<EmuEvent*>(e);
  if (stream_capturing(s)) {
    // A wait for earlier work of the capturing stream itself orders nothing new; a wait that would
    // pull another stream into the capture (fork and join) is not modelled by the emulator.
    if (ev->captured_on == s) return cudaSuccess;
    return capture_refuse(s, "cudaStreamWaitEvent on a capturing stream for an event of another stream (the emulator "
                             "captures one stream; fork and join of streams inside a capture is not modelled)");
  }
  enqueue_wait(s, ev->pos);
  race_stream_waits(s, ev->clock);
  return cudaSuccess;
}

}  // extern "C"
