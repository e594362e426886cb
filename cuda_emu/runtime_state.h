// What the emulated runtime (runtime.cpp) shares with the kernel runner: the per-thread last error
// that cudaGetLastError returns (with the emulator's explanation, shown by cudaGetErrorString),
// the registry of live streams, and the live device allocations (for range checks).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace minidl::cuda::emu {

void set_last_error(cudaError_t e, const std::string& detail);
// set_last_error, handing `e` back.
inline cudaError_t runtime_fail(cudaError_t e, const std::string& detail) {
  set_last_error(e, detail);
  return e;
}
bool stream_live(cudaStream_t s);   // the legacy default stream 0 is always live

// ---- Faults of device work are sticky, as on a GPU: the first fault of a kernel (or a race the
// race check found) makes the call that ran it and every later runtime call return
// cudaErrorLaunchFailure, with the fault's report in cudaGetErrorString; the device runs nothing
// more. The runtime's C entry points never throw, so a fault surfacing in a cudaFree that a
// destructor calls is a returned error, not std::terminate.
void device_fault(const std::string& detail);   // the first report is kept
cudaError_t device_error();                     // cudaSuccess until a fault
void clear_device_fault();   // tests only: a fresh device for the next test, as a new process gets
#define MINIDL_EMU_STICKY()                                                               \
  do {                                                                                    \
    if (const cudaError_t minidl_sticky_ = ::minidl::cuda::emu::device_error();          \
        minidl_sticky_ != cudaSuccess) {                                                  \
      return minidl_sticky_;                                                              \
    }                                                                                     \
  } while (0)
// [p, p + bytes) inside one live cudaMalloc allocation or one mapped range.
bool device_range_live(const void* p, size_t bytes);
// The live cudaMalloc allocations (base, bytes rounded up to 256) and the mapped ranges, sorted by base.
std::vector<std::pair<uintptr_t, size_t>> device_allocations();
// [a, a + bytes) inside one of `ranges` (base -> bytes, not overlapping).
inline bool range_inside(const std::map<uintptr_t, size_t>& ranges, uintptr_t a, size_t bytes) {
  auto it = ranges.upper_bound(a);
  if (it == ranges.begin()) return false;
  --it;
  return a >= it->first && a + bytes <= it->first + it->second;
}
// Physical memory of the driver's virtual memory calls (vmm.cpp), counted against the device's
// capacity as cudaMalloc's is (false: none left).
bool take_device_capacity(size_t bytes);
void give_device_capacity(size_t bytes);
// The ranges those calls mapped and made accessible (vmm.cpp), neighbours merged: device memory to
// the range checks (device_range_live) while mapped, sorted by base.
bool mapped_range_live(uintptr_t a, size_t bytes);
std::vector<std::pair<uintptr_t, size_t>> mapped_ranges();

// cudaGetErrorName's and cudaGetErrorString's words for a code (runtime_errors.cpp); nullptr for a
// code the emulator never returns.
struct ErrorText {
  cudaError_t code;
  const char* name;      // cudaGetErrorName
  const char* meaning;   // cudaGetErrorString, as CUDA's runtime words it
};
const ErrorText* error_text(cudaError_t e);

// In the ASan build (-DMINIDL_EMU_ASAN=ON), marks device memory no tensor owns (the caching
// allocator's free blocks, split remainders and rounding slack), so a kernel or copy touching it
// is reported even inside one cudaMalloc segment. No-ops otherwise.
// `stream` orders the marking with the stream's work in the deferred mode (below): a block freed
// while a queued kernel still uses it is poisoned after that kernel runs.
// `captured` false: never recorded into a capture of `stream` (allocator bookkeeping of eager blocks).
void poison_device(const void* p, size_t bytes, cudaStream_t stream = nullptr, bool captured = true);
void unpoison_device(const void* p, size_t bytes, cudaStream_t stream = nullptr, bool captured = true);
bool asan_build();

// ---- Kernel attributes (kernel_attributes.cpp): the dynamic shared memory a launch of `func` may
// ask for (48 KiB unless cudaFuncSetAttribute raised it), and the static bytes it was seen to use.
size_t max_dynamic_shared(const void* func);
void note_static_shared(const void* func, size_t bytes);

// ---- Stream order (streams.cpp). Deferred mode (the default): work waits in its stream's queue
// until a synchronization point runs it; the legacy default stream (nullptr) and the blocking
// streams wait for each other's earlier work, as on a GPU. Immediate mode
// (MINIDL_EMU_DEFER_STREAMS=0, or set_deferred_streams(false)): work runs when queued.
// Running work never throws (a fault becomes device_fault). Synchronizing here only runs work:
// the entry points that make the host wait tell the race check so (race_check.h).
bool deferred_streams();
void set_deferred_streams(bool on);   // runs all pending work first
struct StreamPos {
  const void* stream = nullptr;
  uint64_t seq = 0;   // the stream's work up to here (0: nothing)
};
void register_stream(cudaStream_t s, bool blocking);
void forget_stream(cudaStream_t s);   // runs its pending work first
// `label` names the work in the race check's reports ("kernel copy_kernel (copy)").
// Work queued on a capturing stream is recorded into the capture instead (graphs.cpp); the result
// is that capture's error, if any (the last error is set too).
// `capture` false: queued in the stream's eager order even while it captures.
cudaError_t enqueue(cudaStream_t s, std::function<void()> work, std::string label = {}, bool capture = true);
// Runs `work` now as the next work of `s`, after the stream's queued work (a host-side copy that
// returns when done, as CUDA's synchronous cases do).
void run_now(cudaStream_t s, const std::function<void()>& work, std::string label);
StreamPos stream_tail(cudaStream_t s);
void enqueue_wait(cudaStream_t s, StreamPos p);   // cudaStreamWaitEvent
bool reached(StreamPos p);
void run_until(StreamPos p);
void synchronize_stream(cudaStream_t s);
void synchronize_all();
size_t pending_work(cudaStream_t s);   // queued items not yet run (tests)

// ---- Stream capture (graphs.cpp): what CUDA allows while a stream is being captured.
bool stream_capturing(cudaStream_t s);
// Work queued on `s`: recorded into its capture (*taken set, cudaSuccess), refused (*taken set, the
// capture's error: an invalidated capture, or the legacy stream's work while a blocking stream
// captures), or not captured (*taken false).
cudaError_t capture_work(cudaStream_t s, const std::function<void()>& work, const std::string& label, bool* taken);
// A potentially unsafe call (a synchronization, cudaMalloc, cudaFree, a synchronous copy): refused
// while a capture forbids it (cudaStreamCaptureModeGlobal, unless this thread exchanged its mode for
// cudaStreamCaptureModeRelaxed); every capture is then invalidated and the last error names the fix.
cudaError_t capture_forbids(const char* call);
// The same for a call on stream `s` (a synchronization or query of it): always refused when `s`
// itself is capturing, whatever the mode.
cudaError_t capture_forbids_on(const char* call, cudaStream_t s);
// Refuses something CUDA cannot capture on `s` (a copy with pageable host memory, a graph launch
// into a capture): invalidates the capture, returns cudaErrorStreamCaptureUnsupported; cudaSuccess
// when `s` is not capturing.
cudaError_t capture_refuse(cudaStream_t s, const std::string& why);

}  // namespace minidl::cuda::emu
