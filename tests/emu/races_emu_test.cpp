// The cross-stream race check (cuda_emu/race_check.h) on copies and memsets, which every build of the
// emulated device sees (kernels' accesses need minidl_emu_prof: races_prof_test.cpp). The planted
// race: two streams touch the same bytes, one writing, with no event between them; it is reported
// as the device's fault naming both streams, both pieces of work and the allocation, in either
// stream mode. Ordered by an event, a synchronization, the legacy stream's implicit barrier, or
// touching other bytes, nothing is reported.
#include <gtest/gtest.h>

#include <string>

#include "cuda_emu/race_check.h"
#include "cuda_emu/runtime_state.h"
#include "tests/emu/emu_test_util.h"

namespace minidl::cuda {
namespace {

using Streams = StreamPair;

// A memset on a and a copy out of the same bytes on b, ordered by `order` (or not).
template <typename Order>
std::string memset_then_copy(bool deferred, Order&& order) {
  const bool before = emu::deferred_streams();
  emu::set_deferred_streams(deferred);
  Buf<int> x(64), y(64);
  std::string what;
  {
    const Streams s;
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(cudaMemsetAsync(x.get() + 8, 1, 16 * sizeof(int), s.a), cudaSuccess);
    order(s);
    cudaMemcpyAsync(y.get(), x.get(), 32 * sizeof(int), cudaMemcpyDeviceToDevice, s.b);
    what = error_of([] {});
  }
  emu::set_deferred_streams(before);
  return what;
}

TEST(EmuRaces, TwoStreamsTouchingTheSameBytesWithoutAnEventAreReported) {
  ASSERT_TRUE(emu::race_check());
  for (bool deferred : {true, false}) {
    const std::string e = memset_then_copy(deferred, [](const Streams&) {});   // planted: no event
    EXPECT_TRUE(mentions(e, "cross-stream race on the emulated device")) << e;
    EXPECT_TRUE(mentions(e, "cudaMemsetAsync of 64 bytes on stream 0x")) << e;
    EXPECT_TRUE(mentions(e, "cudaMemcpyAsync (device to device, 128 bytes) on stream 0x")) << e;
    EXPECT_TRUE(mentions(e, "(64 bytes) at offset 32 of the 256-byte allocation at 0x")) << e;
    EXPECT_TRUE(mentions(e, "cudaStreamWaitEvent")) << e;
  }
}

TEST(EmuRaces, AnEventOrASynchronizationBetweenThemIsEnough) {
  for (bool deferred : {true, false}) {
    EXPECT_EQ(memset_then_copy(deferred,
                               [](const Streams& s) {
                                 cudaEvent_t e = nullptr;
                                 ASSERT_EQ(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), cudaSuccess);
                                 ASSERT_EQ(cudaEventRecord(e, s.a), cudaSuccess);
                                 ASSERT_EQ(cudaStreamWaitEvent(s.b, e, 0), cudaSuccess);
                                 ASSERT_EQ(cudaEventDestroy(e), cudaSuccess);
                               }),
              "");
    EXPECT_EQ(memset_then_copy(deferred, [](const Streams& s) { ASSERT_EQ(cudaStreamSynchronize(s.a), cudaSuccess); }),
              "");
    EXPECT_EQ(memset_then_copy(deferred, [](const Streams&) { ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess); }), "");
  }
}

TEST(EmuRaces, OtherBytesOfTheSameAllocationAndTwoReadersDoNotRace) {
  const Streams s;
  Buf<int> x(64), y(64), z(64);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  ASSERT_EQ(cudaMemsetAsync(x.get(), 1, 32 * sizeof(int), s.a), cudaSuccess);   // the first half
  ASSERT_EQ(cudaMemsetAsync(x.get() + 32, 2, 32 * sizeof(int), s.b), cudaSuccess);   // the second
  ASSERT_EQ(cudaMemcpyAsync(y.get(), z.get(), 64 * sizeof(int), cudaMemcpyDeviceToDevice, s.a), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(x.get() + 32, z.get(), 32 * sizeof(int), cudaMemcpyDeviceToDevice, s.b), cudaSuccess);
  EXPECT_EQ(error_of([] {}), "");
}

TEST(EmuRaces, TheLegacyStreamOrdersBlockingStreamsButNotNonBlockingOnes) {
  const DeferredStreams deferred;   // every call succeeds; the race is reported at the synchronization
  Buf<int> x(64), y(64);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  {
    const Streams blocking(cudaStreamDefault);
    ASSERT_EQ(cudaMemsetAsync(x.get(), 1, 64 * sizeof(int), blocking.a), cudaSuccess);
    ASSERT_EQ(cudaMemcpyAsync(y.get(), x.get(), 64 * sizeof(int), cudaMemcpyDeviceToDevice, nullptr), cudaSuccess);
    EXPECT_EQ(error_of([] {}), "");
  }
  const Streams nonblocking;
  ASSERT_EQ(cudaMemsetAsync(x.get(), 1, 64 * sizeof(int), nonblocking.a), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(y.get(), x.get(), 64 * sizeof(int), cudaMemcpyDeviceToDevice, nullptr), cudaSuccess);
  const std::string e = error_of([] {});
  EXPECT_TRUE(mentions(e, "on the legacy default stream")) << e;
}

TEST(EmuRaces, TheCheckCanBeTurnedOff) {
  const RaceCheckOff off;
  EXPECT_EQ(memset_then_copy(true, [](const Streams&) {}), "");
}

}  // namespace
}  // namespace minidl::cuda
