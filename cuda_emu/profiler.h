// Nsight-Compute-style counters per kernel launch on the emulated device (docs/cuda/counters.md):
// what a CUDA engineer reads first (sectors per request, shared-memory wavefronts,
// divergence), measured on the CPU so a kernel's memory efficiency is known without a GPU. Global
// loads and stores are seen only in the profiling build of the kernels (target minidl_emu_prof);
// in minidl_emu the global counters stay 0 and `global_counted` is false.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "core/non_copyable.h"

namespace minidl::cuda::emu {

struct LaunchCounters {
  std::string op, kernel;   // LaunchInfo's op and kernel names
  const void* stream = nullptr;
  dim3 grid, block;
  size_t dynamic_smem = 0, static_smem = 0;
  uint64_t threads = 0;   // threads launched
  // Global memory (Nsight: l1tex__t_requests / l1tex__t_sectors / bytes, pipe_lsu_mem_global_op_ld|st):
  // warp-level requests, distinct 32-byte sectors per request summed, and the bytes the lanes asked for.
  uint64_t gld_requests = 0, gld_sectors = 0, gld_bytes = 0;
  uint64_t gst_requests = 0, gst_sectors = 0, gst_bytes = 0;
  // Distinct 32-byte sectors the whole launch read / wrote (an atomic does both): the DRAM lower bound.
  uint64_t unique_sectors_read = 0, unique_sectors_written = 0;
  // Shared memory: warp-level requests and the wavefronts they take (32 banks of 4 bytes).
  uint64_t shared_ld_requests = 0, shared_ld_wavefronts = 0, shared_st_requests = 0, shared_st_wavefronts = 0;
  uint64_t atomics = 0;    // global atomic operations, one per lane (atomicAdd, atomicMin, ...)
  uint64_t barriers = 0;   // warp-level __syncthreads instructions (a block of W warps: W per barrier)
  // Warp-level memory instructions (global, shared, atomic) and the lanes active in them:
  // active_lanes / mem_instructions is 32 for a warp without divergence.
  uint64_t mem_instructions = 0, active_lanes = 0;
  // Beyond the interface the step-time model reads:
  uint64_t atomic_requests = 0;     // warp-level atomic instructions
  uint64_t atomic_sectors = 0;      // distinct sectors per atomic request, summed
  uint64_t warp_collectives = 0;    // warp-level shuffles and votes
  uint64_t blocks = 0;
  bool global_counted = false;      // global accesses were instrumented (minidl_emu_prof)
};

// Launches issued while profiling is on are counted when they run. Off by default; off costs one
// branch per launch and per shared access (and, in minidl_emu_prof, per instrumented access).
void set_profiling(bool on);
bool profiling();
// A graph replay's launches are issued by cudaGraphLaunch, not at the capture: graphs.cpp runs each
// replayed node under this scope, which carries whether profiling was on at that launch.
class ReplayIssue : NonCopyable {
 public:
  explicit ReplayIssue(bool profiled);
  ~ReplayIssue();

 private:
  int before_;
};
// Every profiled launch, in the order the launches ran (stream order), appended here. Runs the
// device's queued work first (a device synchronization), so every issued launch is in it.
const std::vector<LaunchCounters>& profile();
void clear_profile();
// True when this program links the profiling build of the kernels (minidl_emu_prof).
bool global_accesses_instrumented();

}  // namespace minidl::cuda::emu
