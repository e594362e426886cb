// Per-launch GPU times for calibrating the H100 step-time model (perfmodel/, docs/cuda/perfmodel.md):
// with MINIDL_LAUNCH_TIMING=1 (or cuda::set_launch_timing(true)) every kernel launch, cuBLAS GEMM
// and cuDNN convolution is bracketed by a pair of CUDA events, keyed by its op and kernel as the
// model keys them. Off, a launch pays one load and one predictable branch.
//
// Gated (cuda::set_launch_gating(true)), each timed launch is held on the GPU until the host has
// finished enqueueing it: a host function that waits for the timer's destructor goes first, then
// the start event, the launch and the stop event. An eager step whose host is slower than its GPU
// (a cuDNN legacy call takes 150-300 us of host time on an H100/H200) otherwise starts the start
// event on an idle GPU while the host is still inside the call, so the pair measured the host's
// time, not the kernel's. Gated, the pair brackets the GPU's work alone; the step's wall time then
// holds the gaps, so it is timed in other steps (minidl-gpumodel --measure does both).
#pragma once
#include <cuda_runtime_api.h>

#include <memory>

namespace minidl::cuda {

namespace detail {
extern bool g_launch_timing;   // set once from MINIDL_LAUNCH_TIMING, then by set_launch_timing
}
inline bool launch_timing_on() { return detail::g_launch_timing; }

// Records a start event on `stream` when constructed and the stop event when destroyed (both only
// while timing is on). `op` and `kernel` must outlive the process (string literals, or names the
// launch site keeps), as launch sites pass them.
struct LaunchGate;
class ScopedLaunchTimer {
 public:
  ScopedLaunchTimer(const char* op, const char* kernel, cudaStream_t stream);
  ~ScopedLaunchTimer();
  ScopedLaunchTimer(const ScopedLaunchTimer&) = delete;
  ScopedLaunchTimer& operator=(const ScopedLaunchTimer&) = delete;

 private:
  long slot_ = -1;   // index of this launch's record, -1 when timing is off
  cudaStream_t stream_ = nullptr;
  std::shared_ptr<LaunchGate> gate_;   // gated timing: opened by the destructor
};

}  // namespace minidl::cuda
