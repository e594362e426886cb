// What the emulated runtime (runtime.cpp) shares with the kernel runner: the per-thread last error
// that cudaGetLastError returns (with the emulator's explanation, shown by cudaGetErrorString),
// the registry of live streams, and the live device allocations (for range checks).
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <string>

namespace minidl::cuda::emu {

void set_last_error(cudaError_t e, const std::string& detail);
bool stream_live(cudaStream_t s);   // the legacy default stream 0 is always live
// [p, p + bytes) inside one live cudaMalloc allocation.
bool device_range_live(const void* p, size_t bytes);

// In the ASan build (-DMINIDL_EMU_ASAN=ON), marks device memory no tensor owns (the caching
// allocator's free blocks, split remainders and rounding slack), so a kernel or copy touching it
// is reported even inside one cudaMalloc segment. No-ops otherwise.
void poison_device(const void* p, size_t bytes);
void unpoison_device(const void* p, size_t bytes);
bool asan_build();

}  // namespace minidl::cuda::emu
