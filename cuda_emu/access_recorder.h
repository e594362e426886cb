// How the emulated device sees a kernel's memory accesses, for the counters (profiler.h) and the
// cross-stream race check (race_check.h): the instrumented kernels (tsan_hooks.cpp), the shared
// views (shared_arena.cpp) and the runner (runner.cpp) report here, and the launch's recorder
// rebuilds warp-level instructions from the lanes, which run one after another as fibers.
#pragma once
#include <cstddef>
#include <cstdint>

namespace minidl::cuda::emu {

struct LaunchInfo;
class LaunchRecorder;

enum class AccessKind : uint8_t { Load, Store, Atomic };

// The running launch's recorder on this host thread: null outside kernels and when neither the
// counters nor the race check want accesses, so every hook starts with one TLS load and a branch.
extern thread_local LaunchRecorder* t_recorder __attribute__((tls_model("initial-exec")));
// The running fiber's linear thread index in its block (set by the runner at each switch).
extern thread_local int t_record_thread __attribute__((tls_model("initial-exec")));

// `pc` identifies the instruction: the address the instrumentation call returns to.
void record_global(const void* p, size_t n, AccessKind kind, const void* pc);
void record_shared(size_t arena_offset, size_t n, AccessKind kind, const void* pc);
// device_api.h's atomics in the profiling build.
void record_device_atomic(const void* p, size_t n, const void* pc);

// ---- the runner's side
void recorder_launch_begin(const LaunchInfo& info, int threads_per_block);
void recorder_block_end();
void recorder_barrier();            // a __syncthreads completed in the running block
void recorder_warp_collective();    // a warp's shuffle or vote completed
// `static_smem`: the block's static shared bytes. Hands the accesses to the race check and, when
// profiling, appends the launch's counters.
void recorder_launch_end(size_t static_smem);
void recorder_launch_abort();   // a fault: nothing is kept

// Set once, by tsan_hooks.cpp's static initializer, in programs linking minidl_emu_prof.
void mark_global_accesses_instrumented();

}  // namespace minidl::cuda::emu
