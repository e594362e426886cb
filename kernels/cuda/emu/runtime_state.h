// What the emulated runtime (runtime.cpp) shares with the kernel runner: the per-thread last error
// that cudaGetLastError returns (with the emulator's explanation, shown by cudaGetErrorString),
// the registry of live streams, and the live device allocations (for range checks).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace minidl::cuda::emu {

void set_last_error(cudaError_t e, const std::string& detail);
bool stream_live(cudaStream_t s);   // the legacy default stream 0 is always live
// [p, p + bytes) inside one live cudaMalloc allocation.
bool device_range_live(const void* p, size_t bytes);
// The live cudaMalloc allocations (base, bytes rounded up to 256), sorted by base.
std::vector<std::pair<uintptr_t, size_t>> device_allocations();

// In the ASan build (-DMINIDL_EMU_ASAN=ON), marks device memory no tensor owns (the caching
// allocator's free blocks, split remainders and rounding slack), so a kernel or copy touching it
// is reported even inside one cudaMalloc segment. No-ops otherwise.
// `stream` orders the marking with the stream's work in the deferred mode (below): a block freed
// while a queued kernel still uses it is poisoned after that kernel runs.
void poison_device(const void* p, size_t bytes, cudaStream_t stream = nullptr);
void unpoison_device(const void* p, size_t bytes, cudaStream_t stream = nullptr);
bool asan_build();

// ---- Stream order (streams.cpp). Deferred mode (the default): work waits in its stream's queue
// until a synchronization point runs it; the legacy default stream (nullptr) and the blocking
// streams wait for each other's earlier work, as on a GPU. Immediate mode
// (MINIDL_EMU_DEFER_STREAMS=0, or set_deferred_streams(false)): work runs when queued.
bool deferred_streams();
void set_deferred_streams(bool on);   // runs all pending work first
struct StreamPos {
  const void* stream = nullptr;
  uint64_t seq = 0;   // the stream's work up to here (0: nothing)
};
void register_stream(cudaStream_t s, bool blocking);
void forget_stream(cudaStream_t s);   // runs its pending work first
void enqueue(cudaStream_t s, std::function<void()> work);
StreamPos stream_tail(cudaStream_t s);
void enqueue_wait(cudaStream_t s, StreamPos p);   // cudaStreamWaitEvent
bool reached(StreamPos p);
void run_until(StreamPos p);
void synchronize_stream(cudaStream_t s);
void synchronize_all();
size_t pending_work(cudaStream_t s);   // queued items not yet run (tests)

}  // namespace minidl::cuda::emu
