// The occupancy calculator of the H100 model: hand-worked cases (each limit binding once), then a
// sweep over registers, block sizes and shared memory against CUDA's own calculator header.
#include <gtest/gtest.h>

#include "perfmodel/occupancy.h"

#ifdef MINIDL_HAVE_CUDA_OCCUPANCY_H
#include <cuda_occupancy.h>
#endif

namespace minidl::gpumodel {
namespace {

Occupancy occ(int regs, int threads, int static_smem = 0, int dynamic_smem = 0) {
  return theoretical_occupancy({regs, static_smem, dynamic_smem, threads, false});
}

TEST(Occupancy, HandWorkedCases) {
  // 256 threads, 32 registers: 8 warps x 1024 registers; 64K / 1024 = 64 warps = 8 blocks; the
  // 64-warp limit also gives 8: full occupancy, the warp limit reported first.
  Occupancy o = occ(32, 256);
  EXPECT_EQ(o.blocks_per_sm, 8);
  EXPECT_DOUBLE_EQ(o.fraction, 1.0);
  EXPECT_EQ(o.limiter, "warps");
  // 40 registers: 1280 per warp; a sub-partition's 16384 hold 12 warps, the SM 48 = 6 blocks: 75%.
  o = occ(40, 256);
  EXPECT_EQ(o.blocks_per_sm, 6);
  EXPECT_DOUBLE_EQ(o.fraction, 0.75);
  EXPECT_EQ(o.limiter, "registers");
  // 33 registers round up to 1280 per warp too (256-register units): also 75%.
  EXPECT_EQ(occ(33, 256).blocks_per_sm, 6);
  // 512 threads at 72 registers: 2304 per warp, 7 warps per sub-partition, 28 per SM: one
  // 16-warp block (25%).
  o = occ(72, 512);
  EXPECT_EQ(o.blocks_per_sm, 1);
  EXPECT_DOUBLE_EQ(o.fraction, 0.25);
  // 32 threads: the 32-blocks-per-SM limit binds at 32 warps: 50%.
  o = occ(16, 32);
  EXPECT_EQ(o.blocks_per_sm, 32);
  EXPECT_DOUBLE_EQ(o.fraction, 0.5);
  EXPECT_EQ(o.limiter, "blocks");
  // Shared memory: 40 KiB static + 1 KiB reserved = 41 KiB per block; 228 KiB hold 5 blocks of
  // 256 threads = 40 warps (62.5%).
  o = occ(32, 256, 40 * 1024);
  EXPECT_EQ(o.blocks_per_sm, 5);
  EXPECT_DOUBLE_EQ(o.fraction, 40.0 / 64.0);
  EXPECT_EQ(o.limiter, "shared memory");
  // Static + dynamic over 48 KiB without the opt-in: not launchable.
  o = occ(32, 256, 32 * 1024, 20 * 1024);
  EXPECT_EQ(o.blocks_per_sm, 0);
  EXPECT_NE(o.limiter.find("shared memory per block"), std::string::npos);
  // 1024 threads at 65 registers: 65 x 32 = 2080 rounds to 2304 per warp, and 32 warps need
  // 73,728 registers > 64K: the block does not fit at all. At 64: 2048 x 32 = 64K exactly, one block.
  EXPECT_EQ(occ(65, 1024).blocks_per_sm, 0);
  EXPECT_EQ(occ(64, 1024).blocks_per_sm, 1);
  // More than 1024 threads, or more than 255 registers, never launch.
  EXPECT_EQ(occ(16, 1025).blocks_per_sm, 0);
  EXPECT_EQ(occ(256, 32).blocks_per_sm, 0);
}

#ifdef MINIDL_HAVE_CUDA_OCCUPANCY_H
TEST(Occupancy, AgreesWithCudasCalculatorHeader) {
  const H100Spec s;
  cudaOccDeviceProp p{};
  p.computeMajor = 9;
  p.computeMinor = 0;
  p.maxThreadsPerBlock = s.max_threads_per_block;
  p.maxThreadsPerMultiprocessor = s.max_threads_per_sm;
  p.regsPerBlock = s.regs_per_sm;
  p.regsPerMultiprocessor = s.regs_per_sm;
  p.warpSize = s.warp_size;
  p.sharedMemPerBlock = static_cast<size_t>(s.smem_per_block_default);
  p.sharedMemPerMultiprocessor = static_cast<size_t>(s.smem_per_sm);
  p.numSms = s.sms;
  p.sharedMemPerBlockOptin = static_cast<size_t>(s.smem_per_block_optin);
  p.reservedSharedMemPerBlock = static_cast<size_t>(s.smem_reserved_per_block);
  const cudaOccDeviceState state;
  int cases = 0;
  for (int regs : {0, 8, 16, 24, 32, 33, 40, 48, 56, 64, 72, 80, 96, 128, 168, 255}) {
    for (int threads : {32, 64, 96, 128, 192, 256, 384, 512, 640, 768, 1024}) {
      for (int smem : {0, 1000, 4096, 12 * 1024, 40 * 1024, 47 * 1024}) {
        cudaOccFuncAttributes a{};
        a.maxThreadsPerBlock = 1024;
        a.numRegs = regs;
        a.sharedSizeBytes = static_cast<size_t>(smem);
        a.partitionedGCConfig = PARTITIONED_GC_OFF;
        a.shmemLimitConfig = FUNC_SHMEM_LIMIT_DEFAULT;
        a.maxDynamicSharedSizeBytes = 0;
        cudaOccResult r{};
        ASSERT_EQ(cudaOccMaxActiveBlocksPerMultiprocessor(&r, &p, &a, &state, threads, 0), CUDA_OCC_SUCCESS);
        EXPECT_EQ(occ(regs, threads, smem).blocks_per_sm, r.activeBlocksPerMultiprocessor)
            << regs << " registers, " << threads << " threads, " << smem << " bytes of static shared memory";
        ++cases;
      }
    }
  }
  EXPECT_EQ(cases, 16 * 11 * 6);
}
#endif

}  // namespace
}  // namespace minidl::gpumodel
