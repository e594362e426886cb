// Stream order on the emulated device's deferred mode (MINIDL_EMU_DEFER_STREAMS=1): work waits in
// its stream until a synchronization point, a stream that waits for an event runs the recording
// stream's work up to the event and no further, and the host reading a pinned buffer that a
// pending device-to-host copy will fill (a missing synchronization) is reported under ASan.
#include <gtest/gtest.h>

#include <cstring>

#include "kernels/cuda/device/launch.cuh"
#include "cuda_emu/runtime_state.h"
#include "tests/emu/emu_test_util.h"

namespace minidl::cuda {
namespace {

__global__ void fill_kernel(int* out, int v) { out[threadIdx.x] = v; }

struct Stream {
  Stream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess); }
  ~Stream() { cudaStreamDestroy(s); }
  cudaStream_t s = nullptr;
};

struct Pinned {
  explicit Pinned(size_t n) { EXPECT_EQ(cudaHostAlloc(reinterpret_cast<void**>(&p), n * sizeof(int), 0), cudaSuccess); }
  ~Pinned() { cudaFreeHost(p); }
  int* p = nullptr;
};

// b reads x while a's memset after the event writes it: a race on purpose, to see that the executor
// runs a up to the event and no further. The race check would report it (EmuRaces.*), so it is off.
TEST(EmuStreams, DeferredWorkRunsAtSynchronizationPointsInStreamAndEventOrder) {
  const DeferredStreams deferred;
  const RaceCheckOff no_race_check;
  Stream a, b;
  Buf<int> x(1), y(1);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);   // Buf's cudaMemset is on the legacy stream, which
  Pinned h(1);                                       // the non-blocking streams do not wait for
  h.p[0] = -1;
  cudaEvent_t e = nullptr;
  ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(x.get(), 0x11, sizeof(int), a.s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(e, a.s), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(x.get(), 0x22, sizeof(int), a.s), cudaSuccess);   // after the event
  EXPECT_EQ(emu::pending_work(a.s), 3u);
  ASSERT_EQ(cudaStreamWaitEvent(b.s, e, 0), cudaSuccess);
  ASSERT_EQ(cudaEventDestroy(e), cudaSuccess);   // the wait holds the stream position, not the event
  ASSERT_EQ(cudaMemcpyAsync(y.get(), x.get(), sizeof(int), cudaMemcpyDeviceToDevice, b.s), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(h.p, y.get(), sizeof(int), cudaMemcpyDeviceToHost, b.s), cudaSuccess);
  EXPECT_EQ(emu::pending_work(b.s), 3u);
  if (!emu::asan_build()) {   // (under ASan this read is the death test's planted bug)
    EXPECT_EQ(h.p[0], -1) << "the copy into pinned memory ran before a synchronization";
  }
  ASSERT_EQ(cudaStreamSynchronize(b.s), cudaSuccess);
  EXPECT_EQ(h.p[0], 0x11111111) << "b must see a's work up to the event and not the memset after it";
  EXPECT_EQ(emu::pending_work(a.s), 1u);
  EXPECT_EQ(emu::pending_work(b.s), 0u);
  // A kernel waits in its stream too; a synchronous copy runs everything before it.
  MINIDL_LAUNCH("test", fill_kernel, 1, 1, 0, a.s, x.get(), 7);
  EXPECT_EQ(emu::pending_work(a.s), 2u);
  EXPECT_EQ(x.host()[0], 7);
  EXPECT_EQ(emu::pending_work(a.s), 0u);
  // A copy into pageable memory returns once done (CUDA's synchronous case).
  MINIDL_LAUNCH("test", fill_kernel, 1, 1, 0, a.s, x.get(), 9);
  int pageable = 0;
  ASSERT_EQ(cudaMemcpyAsync(&pageable, x.get(), sizeof(int), cudaMemcpyDeviceToHost, a.s), cudaSuccess);
  EXPECT_EQ(pageable, 9);
}

TEST(EmuStreams, TheLegacyDefaultStreamAndBlockingStreamsWaitForEachOther) {
  const DeferredStreams deferred;
  cudaStream_t blocking = nullptr;
  ASSERT_EQ(cudaStreamCreate(&blocking), cudaSuccess);
  Stream nonblocking;
  Buf<int> x(1), y(1), z(1);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(x.get(), 1, sizeof(int), blocking), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(z.get(), 3, sizeof(int), nonblocking.s), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(y.get(), 2, sizeof(int), nullptr), cudaSuccess);   // waits for `blocking` only
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);
  EXPECT_EQ(emu::pending_work(blocking), 0u);
  EXPECT_EQ(emu::pending_work(nonblocking.s), 1u);
  ASSERT_EQ(cudaMemsetAsync(x.get(), 4, sizeof(int), nullptr), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(y.get(), 5, sizeof(int), blocking), cudaSuccess);   // after the legacy memset
  ASSERT_EQ(cudaStreamSynchronize(blocking), cudaSuccess);
  EXPECT_EQ(emu::pending_work(nullptr), 0u);
  EXPECT_EQ(x.host()[0], 0x04040404);
  cudaStreamDestroy(blocking);
}

TEST(EmuStreams, EventTimesNeedTheirWorkToHaveRun) {
  const DeferredStreams deferred;
  Stream a;
  cudaEvent_t t0 = nullptr, t1 = nullptr;
  ASSERT_EQ(cudaEventCreate(&t0), cudaSuccess);
  ASSERT_EQ(cudaEventCreate(&t1), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(t0, a.s), cudaSuccess);
  ASSERT_EQ(cudaEventRecord(t1, a.s), cudaSuccess);
  float ms = -1;
  EXPECT_EQ(cudaEventElapsedTime(&ms, t0, t1), cudaErrorNotReady);
  cudaGetLastError();
  ASSERT_EQ(cudaEventSynchronize(t1), cudaSuccess);
  EXPECT_EQ(cudaEventElapsedTime(&ms, t0, t1), cudaSuccess);
  EXPECT_GE(ms, 0.0f);
  cudaEventDestroy(t0);
  cudaEventDestroy(t1);
}

// The planted bug: the host reads a pinned buffer that a pending device-to-host copy will fill.
TEST(EmuStreamsDeathTest, ReadingAPinnedCopyDestinationWithoutASyncIsReportedUnderAsan) {
  if (!emu::asan_build()) GTEST_SKIP() << "needs the ASan build of the emulator (-DMINIDL_EMU_ASAN=ON)";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const DeferredStreams deferred;
  Stream a;
  Buf<int> x(4);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  Pinned h(4);
  ASSERT_EQ(cudaMemcpyAsync(h.p, x.get(), 4 * sizeof(int), cudaMemcpyDeviceToHost, a.s), cudaSuccess);
  EXPECT_DEATH(
      {
        volatile int v = h.p[2];
        (void)v;
      },
      "AddressSanitizer: use-after-poison");
  ASSERT_EQ(cudaStreamSynchronize(a.s), cudaSuccess);   // with the synchronization, the read is fine
  EXPECT_EQ(h.p[2], 0);
}

}  // namespace
}  // namespace minidl::cuda
