// Faults of device work are sticky on the emulated device, as on a GPU (issue 30): after a kernel
// faults, the call that ran it and every later runtime call return cudaErrorLaunchFailure with the
// kernel's report, and a fault that surfaces in a cudaFree called by a destructor is logged there
// instead of ending the program. Each test plants the fault in a small kernel.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device/launch.cuh"
#include "cuda_emu/runtime_state.h"
#include "tests/emu/emu_test_util.h"

namespace minidl::cuda {
namespace {

__global__ void divergent_barrier_kernel(int* out) {
  if (threadIdx.x < 16) __syncthreads();   // planted: threads 16.. never arrive
  out[threadIdx.x] = 1;
}

__global__ void fill_kernel(int* out, int v) { out[threadIdx.x] = v; }

TEST(EmuFaults, AKernelFaultIsStickyEveryLaterCallReturnsIt) {
  const DeferredStreams deferred;
  Buf<int> out(64);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  MINIDL_LAUNCH("planted", divergent_barrier_kernel, 1, 64, 0, nullptr, out.get());   // queued: no error yet
  ASSERT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);   // the call that runs the kernel
  const std::string report = cudaGetErrorString(cudaErrorLaunchFailure);
  EXPECT_TRUE(mentions(report, "unspecified launch failure")) << report;
  EXPECT_TRUE(mentions(report, "divergent_barrier_kernel (planted)")) << report;
  EXPECT_TRUE(mentions(report, "__syncthreads() not reached by every thread")) << report;
  // Every later call returns it; reading the last error does not clear it.
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaGetLastError(), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaPeekAtLastError(), cudaErrorLaunchFailure);
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 256), cudaErrorLaunchFailure);
  EXPECT_EQ(p, nullptr);
  int host = 0;
  EXPECT_EQ(cudaMemcpy(&host, out.get(), sizeof(int), cudaMemcpyDeviceToHost), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaMemsetAsync(out.get(), 0, sizeof(int), nullptr), cudaErrorLaunchFailure);
  cudaStream_t s = nullptr;
  EXPECT_EQ(cudaStreamCreate(&s), cudaErrorLaunchFailure);
  EXPECT_EQ(cudaStreamSynchronize(nullptr), cudaErrorLaunchFailure);
  // A later launch runs nothing; its launch check throws with the first fault's report.
  const std::string e = error_of([&] { MINIDL_LAUNCH("after", fill_kernel, 1, 32, 0, nullptr, out.get(), 5); });
  EXPECT_TRUE(mentions(e, "cudaErrorLaunchFailure")) << e;
  EXPECT_TRUE(mentions(e, "divergent_barrier_kernel")) << e;
  // (error_of gave the next code a fresh device, as a new process gets one.)
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(&host, out.get(), sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
}

TEST(EmuFaults, InTheImmediateModeTheLaunchCheckReportsTheFault) {
  const bool before = emu::deferred_streams();
  emu::set_deferred_streams(false);
  Buf<int> out(64);
  try {
    MINIDL_LAUNCH("planted", divergent_barrier_kernel, 1, 64, 0, nullptr, out.get());
    ADD_FAILURE() << "the launch check did not throw";
  } catch (const Error& x) {
    EXPECT_TRUE(mentions(x.what(), "cudaErrorLaunchFailure")) << x.what();
    EXPECT_TRUE(mentions(x.what(), "divergent_barrier_kernel")) << x.what();
  }
  EXPECT_EQ(cudaDeviceSynchronize(), cudaErrorLaunchFailure);
  emu::clear_device_fault();
  emu::set_deferred_streams(before);
}

// What the backend's RAII holders do: free in the destructor, and only log a failure there.
struct DeviceBuffer {
  DeviceBuffer() { MINIDL_CUDA_CHECK(cudaMalloc(&p, 64 * sizeof(int))); }
  ~DeviceBuffer() { MINIDL_CUDA_LOG(cudaFree(p)); }
  int* get() const { return static_cast<int*>(p); }
  void* p = nullptr;
};

// The planted fault is queued (deferred streams), so it first runs inside the destructor's cudaFree,
// which used to throw out of a destructor: std::terminate. Run in a child process so that a
// terminate fails this test instead of ending the run.
TEST(EmuFaultsDeathTest, AFaultSurfacingInCudaFreeInADestructorIsLoggedNotFatal) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  EXPECT_EXIT(
      {
        emu::set_deferred_streams(true);
        {
          const DeviceBuffer buf;
          MINIDL_LAUNCH("planted", divergent_barrier_kernel, 1, 64, 0, nullptr, buf.get());
        }
        std::exit(emu::device_error() == cudaErrorLaunchFailure ? 0 : 3);
      },
      ::testing::ExitedWithCode(0),
      "cudaFree\\(p\\)` failed in a destructor: unspecified launch failure \\[emulator: .*divergent_barrier_kernel");
}

}  // namespace
}  // namespace minidl::cuda
