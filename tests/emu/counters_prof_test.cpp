// The counters of cuda_emu/profiler.h on planted kernels whose answers are known by hand
// (docs/cuda/counters.md): a coalesced f32 copy (4 sectors per request), a stride-2 read (8), a
// float4 copy (16), a naive transpose (32 on the store side), a 32x32 shared tile read by column
// (32 wavefronts per request) and padded to 33 (1), atomics, barriers and divergent lanes. Built
// like the kernels of minidl_emu_prof (ThreadSanitizer instrumentation, tsan_hooks.cpp), linked
// against it. Every expected number below is worked out in the comment beside it.
#include <gtest/gtest.h>

#include <ostream>
#include <vector>

#include "core/ops.h"
#include "core/tensor.h"
#include "kernels/cuda/device/launch.cuh"
#include "cuda_emu/profiler.h"
#include "tests/emu/emu_test_util.h"
#include "tests/emu/planted_kernels.h"

namespace minidl::cuda {
namespace {

__global__ void copy_f32_kernel(const float* in, float* out) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  out[i] = in[i];
}

__global__ void stride2_read_kernel(const float* in, float* out) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  out[i] = in[2 * i];
}

__global__ void copy_float4_kernel(const float4* in, float4* out) {
  const unsigned i = blockIdx.x * blockDim.x + threadIdx.x;
  out[i] = in[i];
}

// out (cols x rows) = in (rows x cols) transposed, one element per thread, no shared memory.
__global__ void naive_transpose_kernel(const float* in, float* out, int rows, int cols) {
  const unsigned x = blockIdx.x * blockDim.x + threadIdx.x, y = blockIdx.y * blockDim.y + threadIdx.y;
  out[x * rows + y] = in[y * cols + x];
}

__global__ void atomics_kernel(float* sum, int* bins) {
  atomicAdd(sum, 1.0f);
  atomicAdd(&bins[threadIdx.x % 4], 1);
}

__global__ void barriers_kernel(float* out) {
  MINIDL_SHARED_ARRAY(float, s, 96);
  s[threadIdx.x] = static_cast<float>(threadIdx.x);
  __syncthreads();
  const float v = s[(threadIdx.x + 1) % 96];
  __syncthreads();
  out[blockIdx.x * 96 + threadIdx.x] = v;
}

__global__ void every_fourth_lane_stores_kernel(float* out) {
  if (threadIdx.x % 4 == 0) out[threadIdx.x] = 1.0f;
}

__global__ void same_row_for_every_block_kernel(const float* in, float* out) {
  out[blockIdx.x * blockDim.x + threadIdx.x] = in[threadIdx.x];
}

// The counters of the one launch `launch` issues.
template <typename F>
emu::LaunchCounters counters_of(F&& launch) {
  emu::clear_profile();
  emu::set_profiling(true);
  launch();
  emu::set_profiling(false);
  const std::vector<emu::LaunchCounters>& p = emu::profile();
  EXPECT_EQ(p.size(), 1u);
  return p.empty() ? emu::LaunchCounters{} : p.back();
}

// Global loads and stores as (warp-level requests, sectors per request, bytes the lanes asked for).
struct Traffic {
  uint64_t requests, sectors_per_request, bytes;
  bool operator==(const Traffic&) const = default;
};
std::ostream& operator<<(std::ostream& os, const Traffic& t) {
  return os << "{" << t.requests << " requests x " << t.sectors_per_request << " sectors, " << t.bytes << " bytes}";
}
Traffic loads(const emu::LaunchCounters& c) {
  return {c.gld_requests, c.gld_requests == 0 ? 0 : c.gld_sectors / c.gld_requests, c.gld_bytes};
}
Traffic stores(const emu::LaunchCounters& c) {
  return {c.gst_requests, c.gst_requests == 0 ? 0 : c.gst_sectors / c.gst_requests, c.gst_bytes};
}

// Shared-memory stores and loads as (warp-level requests, wavefronts): a wavefront per request is
// conflict-free, 32 is every lane in one bank.
struct SharedTraffic {
  uint64_t st_requests, st_wavefronts, ld_requests, ld_wavefronts;
  bool operator==(const SharedTraffic&) const = default;
};
std::ostream& operator<<(std::ostream& os, const SharedTraffic& t) {
  return os << "{stores " << t.st_requests << " requests / " << t.st_wavefronts << " wavefronts, loads "
            << t.ld_requests << " / " << t.ld_wavefronts << "}";
}
SharedTraffic shared(const emu::LaunchCounters& c) {
  return {c.shared_st_requests, c.shared_st_wavefronts, c.shared_ld_requests, c.shared_ld_wavefronts};
}

// One block of 32x32 threads transposing 1024 floats through a 32 x Pitch shared tile.
template <int Pitch>
emu::LaunchCounters tile_transpose_counters(const Buf<float>& in, const Buf<float>& out) {
  return counters_of(
      [&] { MINIDL_LAUNCH("tile", (tile_transpose_kernel<Pitch>), 1, dim3(32, 32), 0, nullptr, in.get(), out.get()); });
}

TEST(EmuCounters, TheseTestsRunOnTheInstrumentedKernels) {
  EXPECT_TRUE(emu::global_accesses_instrumented());
}

TEST(EmuCounters, CoalescedF32CopyTakesFourSectorsPerRequest) {
  constexpr int n = 4096;
  Buf<float> in(n), out(n);
  const emu::LaunchCounters c =
      counters_of([&] { MINIDL_LAUNCH("copy", copy_f32_kernel, 16, 256, 0, nullptr, in.get(), out.get()); });
  EXPECT_EQ(c.kernel, "copy_f32_kernel");
  EXPECT_EQ(c.op, "copy");
  EXPECT_EQ(c.stream, nullptr);
  EXPECT_EQ(c.grid.x, 16u);
  EXPECT_EQ(c.block.x, 256u);
  EXPECT_TRUE(c.global_counted);
  EXPECT_EQ(c.threads, 4096u);
  EXPECT_EQ(c.blocks, 16u);
  // 128 warps, each one load and one store of 32 consecutive floats: 128 bytes, 4 sectors.
  EXPECT_EQ(loads(c), (Traffic{128, 4, 16384}));
  EXPECT_EQ(stores(c), (Traffic{128, 4, 16384}));
  EXPECT_EQ(c.gld_sectors, 512u);           // exactly: no request took more
  EXPECT_EQ(c.unique_sectors_read, 512u);   // 16 KiB / 32 B
  EXPECT_EQ(c.unique_sectors_written, 512u);
  EXPECT_EQ(c.mem_instructions, 256u);
  EXPECT_EQ(c.active_lanes, 256u * 32u);
  EXPECT_EQ(c.shared_ld_requests + c.shared_st_requests + c.atomics + c.barriers, 0u);
}

TEST(EmuCounters, StrideTwoReadTakesEightSectorsPerRequest) {
  constexpr int n = 4096;
  Buf<float> in(2 * n), out(n);
  const emu::LaunchCounters c =
      counters_of([&] { MINIDL_LAUNCH("stride", stride2_read_kernel, 16, 256, 0, nullptr, in.get(), out.get()); });
  // A warp's 32 loads span 256 bytes: 8 sectors, half of each unused. Every sector of `in` is hit.
  EXPECT_EQ(loads(c), (Traffic{128, 8, 16384}));
  EXPECT_EQ(c.gld_sectors, 128u * 8u);
  EXPECT_EQ(c.unique_sectors_read, 1024u);
  EXPECT_EQ(stores(c), (Traffic{128, 4, 16384}));
}

TEST(EmuCounters, Float4CopyTakesSixteenSectorsPerRequest) {
  constexpr int n = 1024;   // float4s
  Buf<float4> in(n), out(n);
  const emu::LaunchCounters c =
      counters_of([&] { MINIDL_LAUNCH("copy", copy_float4_kernel, 4, 256, 0, nullptr, in.get(), out.get()); });
  // 32 warps, each one 16-byte load per lane: 512 bytes, 16 sectors.
  EXPECT_EQ(loads(c), (Traffic{32, 16, 16384}));
  EXPECT_EQ(stores(c), (Traffic{32, 16, 16384}));
  EXPECT_EQ(c.gld_sectors + c.gst_sectors, 2u * 32u * 16u);
}

TEST(EmuCounters, NaiveTransposeTakesThirtyTwoSectorsPerStoreRequest) {
  constexpr int rows = 64, cols = 64;
  Buf<float> in(rows * cols), out(rows * cols);
  const emu::LaunchCounters c = counters_of([&] {
    MINIDL_LAUNCH("transpose", naive_transpose_kernel, dim3(cols / 32, rows / 8), dim3(32, 8), 0, nullptr, in.get(),
                  out.get(), rows, cols);
  });
  // 128 warps. A warp's lanes read 32 consecutive floats of one row of `in` (4 sectors) and write
  // one column of `out`, 256 bytes apart: 32 sectors. The launch still writes each sector once.
  EXPECT_EQ(loads(c), (Traffic{128, 4, 16384}));
  EXPECT_EQ(stores(c), (Traffic{128, 32, 16384}));
  EXPECT_EQ(c.gst_sectors, 128u * 32u);
  EXPECT_EQ(c.unique_sectors_read, 512u);
  EXPECT_EQ(c.unique_sectors_written, 512u);
}

TEST(EmuCounters, SharedTileReadByColumnIsAThirtyTwoWayBankConflict) {
  Buf<float> in(1024), out(1024);
  const emu::LaunchCounters c = tile_transpose_counters<32>(in, out);
  // 32 warps. The row-wise store puts lane l in bank l: one wavefront. The column read puts every
  // lane's word (l * 32 + ty) in bank ty: 32 distinct words in one bank, 32 wavefronts.
  EXPECT_EQ(shared(c), (SharedTraffic{32, 32, 32, 32 * 32}));
  EXPECT_EQ(c.static_smem, 32u * 32u * 4u);
  EXPECT_EQ(c.barriers, 32u);   // one __syncthreads in each of the 32 warps
  EXPECT_EQ(c.gld_sectors, 32u * 4u);
  EXPECT_EQ(c.gst_sectors, 32u * 4u);
  EXPECT_EQ(c.mem_instructions, 4u * 32u);
}

TEST(EmuCounters, PaddingTheTileTo33RemovesTheConflict) {
  Buf<float> in(1024), out(1024);
  const emu::LaunchCounters c = tile_transpose_counters<33>(in, out);
  // Word l * 33 + ty is in bank (l + ty) % 32: every lane its own bank, both ways.
  EXPECT_EQ(shared(c), (SharedTraffic{32, 32, 32, 32}));
  EXPECT_EQ(c.static_smem, 32u * 33u * 4u);
  const std::vector<float> got = out.host();
  EXPECT_EQ(got.size(), 1024u);
}

TEST(EmuCounters, AtomicsCountOnePerLane) {
  Buf<float> sum(1);
  Buf<int> bins(4);
  const emu::LaunchCounters c =
      counters_of([&] { MINIDL_LAUNCH("atomics", atomics_kernel, 2, 128, 0, nullptr, sum.get(), bins.get()); });
  // 256 threads, two atomics each; 8 warps, two atomic instructions each, each on one sector.
  EXPECT_EQ(c.atomics, 512u);
  EXPECT_EQ(c.atomic_requests, 16u);
  EXPECT_EQ(c.atomic_sectors, 16u);
  EXPECT_EQ(c.unique_sectors_read, 2u);   // an atomic reads and writes its sector
  EXPECT_EQ(c.unique_sectors_written, 2u);
  EXPECT_EQ(c.gld_requests + c.gst_requests, 0u);   // not the plain loads the emulation is made of
  EXPECT_EQ(sum.host()[0], 256.0f);
  EXPECT_EQ(bins.host(), std::vector<int>({64, 64, 64, 64}));
}

TEST(EmuCounters, BarriersCountOnePerWarp) {
  Buf<float> out(2 * 96);
  const emu::LaunchCounters c =
      counters_of([&] { MINIDL_LAUNCH("sync", barriers_kernel, 2, 96, 0, nullptr, out.get()); });
  EXPECT_EQ(c.barriers, 2u * 2u * 3u);   // 2 blocks x 2 barriers x 3 warps
  EXPECT_EQ(c.shared_st_requests, 6u);
  EXPECT_EQ(c.shared_ld_requests, 6u);
  EXPECT_EQ(c.shared_ld_wavefronts, 6u);   // lane l reads word l + 1 (mod 96): distinct banks
}

TEST(EmuCounters, DivergentLanesShowInActiveLanesPerInstruction) {
  Buf<float> out(128);
  const emu::LaunchCounters c =
      counters_of([&] { MINIDL_LAUNCH("diverge", every_fourth_lane_stores_kernel, 1, 128, 0, nullptr, out.get()); });
  // 4 warps store with 8 lanes each; the 8 floats still span a warp's 128 bytes: 4 sectors.
  EXPECT_EQ(c.gst_requests, 4u);
  EXPECT_EQ(c.gst_sectors, 16u);
  EXPECT_EQ(c.gst_bytes, 4u * 8u * 4u);
  EXPECT_EQ(c.mem_instructions, 4u);
  EXPECT_EQ(c.active_lanes, 32u);
  // A block of 48 threads: its second warp has 16 lanes.
  const emu::LaunchCounters p =
      counters_of([&] { MINIDL_LAUNCH("copy", copy_f32_kernel, 1, 48, 0, nullptr, out.get(), out.get() + 64); });
  EXPECT_EQ(p.gld_requests, 2u);
  EXPECT_EQ(p.active_lanes, 2u * (32u + 16u));
  EXPECT_EQ(p.gld_sectors, 4u + 2u);
}

TEST(EmuCounters, UniqueSectorsAreTheLaunchsDistinctBytesNotItsRequests) {
  Buf<float> in(128), out(8 * 128);
  const emu::LaunchCounters c = counters_of(
      [&] { MINIDL_LAUNCH("reuse", same_row_for_every_block_kernel, 8, 128, 0, nullptr, in.get(), out.get()); });
  EXPECT_EQ(c.gld_sectors, 8u * 4u * 4u);    // 8 blocks x 4 warps x 4 sectors
  EXPECT_EQ(c.unique_sectors_read, 16u);     // the same 512 bytes every time
  EXPECT_EQ(c.unique_sectors_written, 128u);
}

TEST(EmuCounters, LaunchesAreListedInTheOrderTheyRanAndOnlyWhileProfiling) {
  const DeferredStreams deferred;
  Buf<float> a(256), b(256), c(256);
  cudaStream_t s = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  emu::clear_profile();
  MINIDL_LAUNCH("unprofiled", copy_f32_kernel, 1, 256, 0, nullptr, a.get(), c.get());
  emu::set_profiling(true);
  MINIDL_LAUNCH("first", copy_f32_kernel, 1, 256, 0, s, a.get(), b.get());
  MINIDL_LAUNCH("second", stride2_read_kernel, 1, 128, 0, nullptr, a.get(), c.get());
  emu::set_profiling(false);
  ASSERT_EQ(cudaStreamSynchronize(nullptr), cudaSuccess);   // runs "second" (and "unprofiled")
  ASSERT_EQ(cudaStreamSynchronize(s), cudaSuccess);         // then "first"
  const std::vector<emu::LaunchCounters>& p = emu::profile();
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].op, "second");
  EXPECT_EQ(p[1].op, "first");
  EXPECT_EQ(p[1].stream, static_cast<const void*>(s));
  cudaStreamDestroy(s);
}

// The backend's own kernels run instrumented in minidl_emu_prof: a contiguous f32 add and a ReLU
// load and store 16-byte vectors (Vec<float, 4>): one request per warp and vector, as nvcc's
// LDG.128 / STG.128, 16 sectors each, each byte once, all 32 lanes in every request. (g++ -O3
// split these: the vector into four 4-byte loads (scalar replacement of aggregates) and the
// ReLU's store into two copies, one per sign, which halved the lanes per store; hence -O2
// -fno-tree-sra in the profiling build.)
TEST(EmuCounters, TheBackendsOwnKernelsAreCountedToo) {
  constexpr int64_t n = 1 << 16;   // 16384 vectors: 512 warp requests per operand
  const TensorOptions on_device{DType::f32, Device::cuda(0)};
  const Tensor a = ones({n}, on_device), b = full({n}, 2.0, on_device), x = randn({n}, on_device);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  emu::clear_profile();
  emu::set_profiling(true);
  const Tensor c = add(a, b), r = relu(x);
  emu::set_profiling(false);
  const std::vector<emu::LaunchCounters>& p = emu::profile();
  ASSERT_EQ(p.size(), 2u);
  EXPECT_NE(p[0].kernel.find("binary_vec_kernel"), std::string::npos) << p[0].kernel;
  EXPECT_NE(p[1].kernel.find("unary_vec_kernel"), std::string::npos) << p[1].kernel;
  for (uint64_t operands = 2; const emu::LaunchCounters& k : p) {
    EXPECT_EQ(loads(k), (Traffic{512u * operands, 16, operands * n * 4})) << k.kernel;
    EXPECT_EQ(stores(k), (Traffic{512, 16, uint64_t{n * 4}})) << k.kernel;
    EXPECT_EQ(k.gld_sectors + k.gst_sectors, 16u * 512u * (operands + 1)) << k.kernel;
    EXPECT_EQ(k.unique_sectors_read, operands * n * 4 / 32) << k.kernel;
    EXPECT_EQ(k.unique_sectors_written, uint64_t{n * 4 / 32}) << k.kernel;
    EXPECT_EQ(k.active_lanes, 32 * k.mem_instructions) << k.kernel;
    operands = 1;
  }
}

}  // namespace
}  // namespace minidl::cuda
