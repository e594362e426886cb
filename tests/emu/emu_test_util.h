// What the emulated device's own tests share: a device buffer copied back to the host, the report
// of a launch's fault (at the launch, or when its stream runs), deferred streams for one test.
#pragma once
#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "cuda_emu/race_check.h"
#include "cuda_emu/runtime_state.h"

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

// What went wrong in `f` and the device work it queued (deferred streams): the message of the
// minidl::Error it throws (a launch check), else cudaGetErrorString of the device's fault ("" when
// none). A fault is sticky, as on a GPU, so the device is then made fresh again for what follows,
// as a new process would get one.
template <typename F>
std::string error_of(F&& f) {
  std::string what;
  try {
    f();
    if (const cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) what = cudaGetErrorString(e);
  } catch (const Error& e) {
    what = e.what();
  }
  emu::clear_device_fault();
  return what;
}

// Every test starts on a fresh device, as it does under ctest (one process per test): a fault a
// test left behind is sticky and would fail every later test of a whole-binary run.
class FreshDevicePerTest : public ::testing::EmptyTestEventListener {
  void OnTestEnd(const ::testing::TestInfo&) override {
    cudaDeviceSynchronize();
    emu::clear_device_fault();
  }
};
inline const bool kFreshDevicePerTest = [] {
  ::testing::UnitTest::GetInstance()->listeners().Append(new FreshDevicePerTest);
  return true;
}();

// Two streams of one kind (non-blocking unless asked), destroyed with the object.
struct StreamPair {
  explicit StreamPair(unsigned flags = cudaStreamNonBlocking) {
    EXPECT_EQ(cudaStreamCreateWithFlags(&a, flags), cudaSuccess);
    EXPECT_EQ(cudaStreamCreateWithFlags(&b, flags), cudaSuccess);
  }
  ~StreamPair() {
    cudaStreamDestroy(a);
    cudaStreamDestroy(b);
  }
  StreamPair(const StreamPair&) = delete;
  StreamPair& operator=(const StreamPair&) = delete;
  cudaStream_t a = nullptr, b = nullptr;
};

inline bool mentions(const std::string& s, const std::string& what) { return s.find(what) != std::string::npos; }

// Deferred streams for one test; the mode before it afterwards.
struct DeferredStreams {
  DeferredStreams() { emu::set_deferred_streams(true); }
  ~DeferredStreams() { emu::set_deferred_streams(before); }
  bool before = emu::deferred_streams();
};

// The race check off for one test (a test that races on purpose); the setting before it afterwards.
struct RaceCheckOff {
  RaceCheckOff() { emu::set_race_check(false); }
  ~RaceCheckOff() { emu::set_race_check(before); }
  bool before = emu::race_check();
};

// Runs `f` and the device work it queued (deferred streams).
template <typename F>
void run_now(F&& f) {
  f();
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

}  // namespace minidl::cuda
