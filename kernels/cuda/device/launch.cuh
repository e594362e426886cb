// The one way the backend launches a kernel, in both builds: nvcc gets the plain
// `kernel<<<grid, block, smem, stream>>>(args...)` plus the launch-error check (the generated code
// is that of a hand-written launch); the emulated build (MINIDL_CUDA_EMU) runs the grid on the CPU.
#pragma once
#include <cuda_runtime.h>

#include <cstddef>
#include <utility>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device/shared.cuh"   // shared memory, with the launch that sizes it

#ifdef MINIDL_CUDA_EMU
#include "kernels/cuda/emu/runner.h"
#endif

namespace minidl::cuda {

// `op` names the operation in errors ("copy", "batch_norm apply"), `kernel_name` the kernel.
// Arguments are converted to the kernel's parameter types here, as a launch does.
template <typename... P, typename... A>
inline void launch_kernel(const char* op, const char* kernel_name, void (*kernel)(P...), dim3 grid, dim3 block,
                          size_t smem, cudaStream_t stream, A&&... args) {
#ifdef MINIDL_CUDA_EMU
  emu::run_grid(op, kernel_name, kernel, grid, block, smem, stream, static_cast<P>(std::forward<A>(args))...);
#else
  (void)kernel_name;
  kernel<<<grid, block, smem, stream>>>(static_cast<P>(std::forward<A>(args))...);
#endif
  MINIDL_CUDA_LAUNCH_CHECK(op);
}

}  // namespace minidl::cuda

// MINIDL_LAUNCH(op, kernel, grid, block, smem, stream, args...): a template kernel goes in
// parentheses, `(copy_kernel<D, S>)`, so its commas stay inside one macro argument.
#define MINIDL_LAUNCH(op, kernel, ...) ::minidl::cuda::launch_kernel(op, #kernel, kernel, __VA_ARGS__)
