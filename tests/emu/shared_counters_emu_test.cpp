// The counters of cuda_emu/profiler.h in the tests' build of the emulated device (minidl_emu), whose
// kernels are not instrumented: shared memory, barriers and divergence are still counted (every
// shared access goes through the checked views), global accesses are not and say so; with
// profiling off nothing is recorded.
#include <gtest/gtest.h>

#include <vector>

#include "cuda_emu/profiler.h"
#include "tests/emu/emu_test_util.h"
#include "tests/emu/planted_kernels.h"

namespace minidl::cuda {
namespace {

TEST(EmuSharedCounters, SharedMemoryIsCountedWithoutTheInstrumentedKernels) {
  EXPECT_FALSE(emu::global_accesses_instrumented());
  Buf<float> in(1024), out(1024);
  emu::clear_profile();
  emu::set_profiling(true);
  MINIDL_LAUNCH("tile", (tile_transpose_kernel<32>), 1, dim3(32, 32), 0, nullptr, in.get(), out.get());
  MINIDL_LAUNCH("tile", (tile_transpose_kernel<33>), 1, dim3(32, 32), 0, nullptr, in.get(), out.get());
  emu::set_profiling(false);
  const std::vector<emu::LaunchCounters>& p = emu::profile();
  ASSERT_EQ(p.size(), 2u);
  EXPECT_FALSE(p[0].global_counted);
  EXPECT_EQ(p[0].gld_requests + p[0].gst_requests + p[0].unique_sectors_read, 0u);
  EXPECT_EQ(p[0].shared_ld_requests, 32u);
  EXPECT_EQ(p[0].shared_ld_wavefronts, 32u * 32u);   // a column of the unpadded tile is one bank
  EXPECT_EQ(p[1].shared_ld_wavefronts, 32u);         // padded to 33: no conflict
  EXPECT_EQ(p[0].barriers, 32u);
  EXPECT_EQ(p[0].mem_instructions, 64u);             // the shared load and store of each warp
  EXPECT_EQ(p[0].active_lanes, 64u * 32u);
}

TEST(EmuSharedCounters, NothingIsRecordedWithProfilingOff) {
  Buf<float> in(1024), out(1024);
  emu::clear_profile();
  ASSERT_FALSE(emu::profiling());
  MINIDL_LAUNCH("tile", (tile_transpose_kernel<32>), 1, dim3(32, 32), 0, nullptr, in.get(), out.get());
  EXPECT_TRUE(emu::profile().empty());
}

}  // namespace
}  // namespace minidl::cuda
