// One kernel launch as the emulated device describes it: what the runner (runner.h) executes and
// the counters and race check (profiler.h, access_recorder.h) record. Plain data in a header of
// its own, so the profiler reads launches without depending on the runner that calls it.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>

namespace minidl::cuda::emu {

struct LaunchInfo {
  const char* op;
  const char* kernel;
  dim3 grid, block;
  size_t smem;
  cudaStream_t stream;
  const void* func = nullptr;   // the kernel, as cudaFuncSetAttribute names it
  bool profiled = false;        // profiling was on when the launch was issued (profiler.h)
  // Launched with MINIDL_LAUNCH_NOWAIT: the kernel calls no __syncthreads() or warp collective, so
  // the runner runs its threads one after another without fibers (a wait is a fault).
  bool never_waits = false;
};

}  // namespace minidl::cuda::emu
