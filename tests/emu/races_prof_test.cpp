// The cross-stream race check on kernels (cuda_emu/race_check.h), which needs each launch's read and
// write sets: the instrumented kernels of minidl_emu_prof (the counters' build) give them. The
// planted race: a kernel on one stream writes what a kernel on another reads, with no event between
// them; the report names both kernels, both streams and the allocation. Ordered, or on other bytes,
// or both atomic, nothing is reported.
#include <gtest/gtest.h>

#include <string>

#include "kernels/cuda/device/launch.cuh"
#include "cuda_emu/profiler.h"
#include "cuda_emu/race_check.h"
#include "tests/emu/emu_test_util.h"

namespace minidl::cuda {
namespace {

__global__ void produce_kernel(float* x, int offset) { x[offset + threadIdx.x] = 1.0f; }

__global__ void consume_kernel(const float* x, float* y, int offset) { y[threadIdx.x] = x[offset + threadIdx.x]; }

__global__ void count_kernel(int* counter) { atomicAdd(counter, 1); }

TEST(EmuKernelRaces, AKernelReadingWhatAnotherStreamsKernelWritesWithoutAnEventIsReported) {
  ASSERT_TRUE(emu::global_accesses_instrumented());
  for (bool deferred : {true, false}) {
    const bool before = emu::deferred_streams();
    emu::set_deferred_streams(deferred);
    Buf<float> x(256), y(64);
    const StreamPair s;
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);   // the Bufs' memsets are on the legacy stream
    const std::string e = error_of([&] {
      MINIDL_LAUNCH("produce", produce_kernel, 1, 64, 0, s.a, x.get(), 128);
      MINIDL_LAUNCH("consume", consume_kernel, 1, 64, 0, s.b, x.get(), y.get(), 160);   // planted: no event
    });
    EXPECT_TRUE(mentions(e, "cross-stream race on the emulated device")) << e;
    EXPECT_TRUE(mentions(e, "kernel produce_kernel (produce) on stream 0x")) << e;
    EXPECT_TRUE(mentions(e, "kernel consume_kernel (consume) on stream 0x")) << e;
    // x[160..192) both touch: 128 bytes at offset 640 of the 1024-byte allocation.
    EXPECT_TRUE(mentions(e, "(128 bytes) at offset 640 of the 1024-byte allocation at 0x")) << e;
    emu::set_deferred_streams(before);
  }
}

TEST(EmuKernelRaces, OrderedOrDisjointOrAtomicKernelsDoNotRace) {
  Buf<float> x(256), y(64);
  Buf<int> counter(1);
  const StreamPair s;
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  cudaEvent_t done = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), cudaSuccess);
  EXPECT_EQ(error_of([&] {
              MINIDL_LAUNCH("produce", produce_kernel, 1, 64, 0, s.a, x.get(), 128);
              ASSERT_EQ(cudaEventRecord(done, s.a), cudaSuccess);
              ASSERT_EQ(cudaStreamWaitEvent(s.b, done, 0), cudaSuccess);
              MINIDL_LAUNCH("consume", consume_kernel, 1, 64, 0, s.b, x.get(), y.get(), 160);
            }),
            "");
  EXPECT_EQ(error_of([&] {   // other bytes of the same allocation
              MINIDL_LAUNCH("produce", produce_kernel, 1, 64, 0, s.a, x.get(), 0);
              MINIDL_LAUNCH("consume", consume_kernel, 1, 64, 0, s.b, x.get(), y.get(), 64);
            }),
            "");
  EXPECT_EQ(error_of([&] {   // atomics from both streams on one counter
              MINIDL_LAUNCH("count", count_kernel, 1, 32, 0, s.a, counter.get());
              MINIDL_LAUNCH("count", count_kernel, 1, 32, 0, s.b, counter.get());
            }),
            "");
  EXPECT_EQ(counter.host()[0], 64);
  cudaEventDestroy(done);
}

}  // namespace
}  // namespace minidl::cuda
