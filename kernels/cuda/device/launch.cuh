// The one way the backend launches a kernel, in both builds: nvcc gets the plain
// `kernel<<<grid, block, smem, stream>>>(args...)` plus the launch-error check (the generated code
// is that of a hand-written launch); the emulated build (MINIDL_CUDA_EMU) runs the grid on the CPU.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device/shared.cuh"   // shared memory, with the launch that sizes it
#include "kernels/cuda/launch_timer.cuh"

#ifdef MINIDL_CUDA_EMU
#include <string>
#include <typeinfo>

// emu::run_grid, enqueue, call_logging: the emulator's backend_hooks.h, force-included in its build
#endif

namespace minidl::cuda {

// What a launch is filed under when a caller-level op runs a generic kernel for its own ends: a
// copy that transposes a convolution's operands into channels-last is "copy (conv2d NHWC
// transpose)", not one more "copy". The name replaces the launch's op in errors, in the emulated
// device's profile and in the per-launch timer (the model and the GPU measurement key on it).
inline thread_local const char* launch_scope_name = nullptr;
class LaunchScope {
 public:
  explicit LaunchScope(const char* op) : previous_(launch_scope_name) { launch_scope_name = op; }
  ~LaunchScope() { launch_scope_name = previous_; }
  LaunchScope(const LaunchScope&) = delete;
  LaunchScope& operator=(const LaunchScope&) = delete;

 private:
  const char* previous_;
};

// `op` names the operation in errors ("copy", "batch_norm apply"), `kernel_name` the kernel.
// Arguments are converted to the kernel's parameter types here, as a launch does. `kNeverWaits`
// (MINIDL_LAUNCH_NOWAIT): the kernel calls no __syncthreads() or warp collective; the GPU build
// ignores it, the emulated one runs the threads without fibers (and faults on a wait).
template <bool kNeverWaits = false, typename... P, typename... A>
inline void launch_kernel(const char* op, const char* kernel_name, void (*kernel)(P...), dim3 grid, dim3 block,
                          size_t smem, cudaStream_t stream, A&&... args) {
  if (launch_scope_name != nullptr) op = launch_scope_name;
#ifdef MINIDL_CUDA_EMU
  {
    ScopedLaunchTimer timer(op, kernel_name, stream);
    emu::run_grid(op, kernel_name, kNeverWaits, kernel, grid, block, smem, stream,
                  static_cast<P>(std::forward<A>(args))...);
  }
  if (emu::call_logging() || emu::stream_capturing(stream)) {
    // A marker behind the launch in its stream: the kernels' run order, and the parameter types
    // that tell the nvcc build's instantiation of a template kernel (call_log.h). A captured one
    // logs at each replay made while logging is on.
    static const std::string parameters = emu::parameter_types(typeid(kernel).name());
    emu::enqueue(stream, [kernel_name] {
      if (emu::call_logging()) emu::log_kernel_run(kernel_name, &parameters);
    });
  }
#else
  if (launch_timing_on()) [[unlikely]] {
    ScopedLaunchTimer timer(op, kernel_name, stream);
    kernel<<<grid, block, smem, stream>>>(static_cast<P>(std::forward<A>(args))...);
  } else {
    kernel<<<grid, block, smem, stream>>>(static_cast<P>(std::forward<A>(args))...);
  }
#endif
  MINIDL_CUDA_LAUNCH_CHECK(op);
}

}  // namespace minidl::cuda

// MINIDL_LAUNCH(op, kernel, grid, block, smem, stream, args...): a template kernel goes in
// parentheses, `(copy_contig_kernel<D, S>)`, so its commas stay inside one macro argument.
#define MINIDL_LAUNCH(op, kernel, ...) ::minidl::cuda::launch_kernel(op, #kernel, kernel, __VA_ARGS__)
// The same for a kernel that calls no __syncthreads() or warp collective (elementwise kernels):
// the emulated device runs its threads one after another instead of as fibers.
#define MINIDL_LAUNCH_NOWAIT(op, kernel, ...) ::minidl::cuda::launch_kernel<true>(op, #kernel, kernel, __VA_ARGS__)
