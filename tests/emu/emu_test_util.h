// What the emulated device's own tests share: a device buffer copied back to the host, and the
// message of the minidl::Error a launch throws (at the launch, or when its stream runs).
#pragma once
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cuda/emu/runtime_state.h"

namespace minidl::cuda {

// Device buffer of n Ts, copied back with host().
template <typename T>
struct Buf {
  explicit Buf(size_t count) : n(count) {
    EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess);
    EXPECT_EQ(cudaMemset(p, 0, n * sizeof(T)), cudaSuccess);
  }
  ~Buf() { cudaFree(p); }
  T* get() const { return static_cast<T*>(p); }
  std::vector<T> host() const {
    std::vector<T> h(n);
    EXPECT_EQ(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return h;
  }
  void* p = nullptr;
  size_t n;
};

// The message of the error `f` throws ("" when none), its kernels run (deferred streams) included.
template <typename F>
std::string error_of(F&& f) {
  try {
    f();
    cudaDeviceSynchronize();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// Deferred streams for one test; the mode before it afterwards.
struct DeferredStreams {
  DeferredStreams() { emu::set_deferred_streams(true); }
  ~DeferredStreams() { emu::set_deferred_streams(before); }
  bool before = emu::deferred_streams();
};

// Runs `f` and the device work it queued (deferred streams).
template <typename F>
void run_now(F&& f) {
  f();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace minidl::cuda
