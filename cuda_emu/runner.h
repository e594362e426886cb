// The emulated build's kernel launch (device/launch.cuh calls run_grid): the grid's blocks run one
// after another on the calling thread, each block's threads as cooperative fibers (runner.cpp), or,
// for a kernel launched as one that never waits (`never_waits`, MINIDL_LAUNCH_NOWAIT), one thread
// after another on the calling thread's stack.
// A bad configuration sets the runtime's last error, as a real launch does; a fault inside the
// kernel is the device's sticky fault (runtime_state.h): the call that ran the kernel and every later
// one return cudaErrorLaunchFailure, whose cudaGetErrorString names the kernel, block and thread.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <tuple>

#include "cuda_emu/launch_info.h"

namespace minidl::cuda::emu {

// Runs `body(arg)` once per thread of the grid (the body calls the kernel with its own copy of the
// arguments, as each GPU thread reads the launch's parameters), in the stream's order: now, or at
// the next synchronization point in the deferred mode (runtime_state.h), so `arg` is shared.
void run_grid_erased(const LaunchInfo& info, void (*body)(void*), std::shared_ptr<void> arg);

template <typename... P>
void run_grid(const char* op, const char* kernel_name, bool never_waits, void (*kernel)(P...), dim3 grid, dim3 block,
              size_t smem, cudaStream_t stream, P... args) {
  struct Call {
    void (*kernel)(P...);
    std::tuple<P...> args;
  };
  auto call = std::make_shared<Call>(Call{kernel, std::tuple<P...>(args...)});
  auto body = [](void* p) {
    auto* c = static_cast<Call*>(p);
    std::apply([c](const P&... a) { c->kernel(a...); }, c->args);
  };
  run_grid_erased(LaunchInfo{.op = op, .kernel = kernel_name, .grid = grid, .block = block, .smem = smem,
                             .stream = stream, .func = reinterpret_cast<const void*>(kernel),
                             .never_waits = never_waits},
                  body, std::move(call));
}

// The fiber order between barriers: 0 runs threads in index order; any other seed runs them in
// a seeded random order (a second valid schedule, for races). Default: MINIDL_EMU_SCHEDULE or 0.
void set_schedule_seed(uint64_t seed);
uint64_t schedule_seed();

}  // namespace minidl::cuda::emu
