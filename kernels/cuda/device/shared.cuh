// Block-shared memory, declared the same way in both builds. Under nvcc MINIDL_SHARED_ARRAY(T,
// name, N) is exactly `__shared__ T name[N]`, MINIDL_SHARED_VAR(T, name) `__shared__ T name`, and
// dynamic_shared<T>() the `extern __shared__` array: the generated code is that of the plain
// declarations. In the emulated build they are checked views of the running block's shared arena
// (cuda_emu/shared_memory.h): a read of a byte no thread of the block wrote, or an access outside the
// array, fails the kernel. Pass shared arrays to device functions as a template parameter (`P
// scratch`, see block_sum in common.cuh), not as T*.
#pragma once

#ifdef MINIDL_CUDA_EMU
// emu::static_shared, SharedPtr: the emulator's backend_hooks.h, force-included in its build

// One static local per declaration (and template instantiation) identifies its arena slot.
#define MINIDL_SHARED_ARRAY(T, name, N)              \
  static const char minidl_shared_site_##name = 0; \
  const auto name = ::minidl::cuda::emu::static_shared<T, N>(&minidl_shared_site_##name, #name)
#define MINIDL_SHARED_VAR(T, name)                   \
  static const char minidl_shared_site_##name = 0; \
  const auto name = ::minidl::cuda::emu::static_shared<T, 1>(&minidl_shared_site_##name, #name)[0]
#else
#define MINIDL_SHARED_ARRAY(T, name, N) __shared__ T name[N]
#define MINIDL_SHARED_VAR(T, name) __shared__ T name
#endif

namespace minidl::cuda {

// Dynamic shared memory of the running block (the launch's `smem` bytes), as T*.
#ifdef MINIDL_CUDA_EMU
template <typename T>
inline emu::SharedPtr<T> dynamic_shared() {
  return emu::SharedPtr<T>(emu::dynamic_shared_bytes(), emu::dynamic_shared_size());
}
#else
template <typename T>
__device__ __forceinline__ T* dynamic_shared() {
  extern __shared__ __align__(16) unsigned char minidl_dynamic_smem[];
  return reinterpret_cast<T*>(minidl_dynamic_smem);
}
#endif

}  // namespace minidl::cuda
