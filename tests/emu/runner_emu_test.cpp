// The emulated device's kernel runner on small kernels: warp shuffles and votes return what the
// hardware returns (widths, up/down/xor edges), __shared__ and __syncthreads make a block reduction
// work, and each planted bug is reported with the kernel, block and thread: a divergent
// __syncthreads, a shuffle mask naming a lane that does not take part or not naming the caller,
// launch configurations the hardware rejects, a misaligned float4 load (UBSan's alignment check,
// on in the emulated build), a race that a second (seeded) schedule exposes.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"
#include "kernels/cuda/device/launch.cuh"
#include "cuda_emu/runner.h"
#include "cuda_emu/runtime_state.h"
#include "tests/emu/emu_test_util.h"

namespace minidl::cuda {
namespace {

constexpr unsigned kFull = 0xffffffffu;

// ---- Kernels ----

__global__ void shuffles_kernel(int* out, int width) {
  const int l = static_cast<int>(threadIdx.x);
  out[4 * l + 0] = __shfl_sync(kFull, 100 + l, 3, width);
  out[4 * l + 1] = __shfl_down_sync(kFull, 100 + l, 5, width);
  out[4 * l + 2] = __shfl_up_sync(kFull, 100 + l, 2, width);
  out[4 * l + 3] = __shfl_xor_sync(kFull, 100 + l, 9, width);
}

__global__ void votes_kernel(unsigned* out) {
  const unsigned l = threadIdx.x;
  out[3 * l + 0] = __ballot_sync(kFull, l % 3 == 0);
  out[3 * l + 1] = static_cast<unsigned>(__any_sync(kFull, l == 17));
  out[3 * l + 2] = static_cast<unsigned>(__all_sync(kFull, l < 31));
}

__global__ void block_sum_kernel(const float* x, float* out, int n) {
  MINIDL_SHARED_ARRAY(float, s, 32);
  float v = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) v += x[i];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(kFull, v, o);
  if ((threadIdx.x & 31) == 0) s[threadIdx.x >> 5] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float t = 0;
    for (unsigned w = 0; w < blockDim.x / 32; ++w) t += s[w];
    out[blockIdx.x] = t;
  }
}

// The same block sum staged through dynamic shared memory (the launch's smem bytes).
__global__ void dynamic_block_sum_kernel(const float* x, float* out, int n) {
  const auto s = dynamic_shared<float>();
  float v = 0;
  for (int i = threadIdx.x; i < n; i += blockDim.x) v += x[i];
  s[threadIdx.x] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    float t = 0;
    for (unsigned k = 0; k < blockDim.x; ++k) t += s[k];
    out[blockIdx.x] = t;
  }
}

__global__ void divergent_sync_kernel(int* out) {
  if (threadIdx.x < 40) __syncthreads();   // planted: threads 40.. never arrive
  out[threadIdx.x] = 1;
}

__global__ void two_barriers_kernel(int* out) {
  if (threadIdx.x % 2 == 0) {
    __syncthreads();   // planted: even and odd threads wait at different barriers
    out[threadIdx.x] = 1;
  } else {
    out[threadIdx.x] = 2;
    __syncthreads();
  }
}

__global__ void mask_misses_caller_kernel(int* out) {
  out[threadIdx.x] = __shfl_sync(0x0000ffffu, 1, 0);   // planted: lanes 16..31 are not in the mask
}

__global__ void mask_names_exited_kernel(int* out) {
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_sync(kFull, 1, 0);   // planted: lanes 16..31 left
}

__global__ void reads_outside_mask_kernel(int* out) {
  if (threadIdx.x < 16) out[threadIdx.x] = __shfl_down_sync(0x0000ffffu, 1, 8);   // planted: lane 8+8
}

__global__ void noop_kernel(int* out) {
  if (out != nullptr && threadIdx.x == 0 && blockIdx.x == 0) out[0] = 1;
}

__global__ void last_writer_kernel(int* out) {
  MINIDL_SHARED_VAR(int, s);
  s = static_cast<int>(threadIdx.x);   // planted race: every thread writes, the last one wins
  __syncthreads();
  if (threadIdx.x == 0) out[blockIdx.x] = s;
}

__global__ void misaligned_float4_kernel(const float* x, float* out) {
  const float4 v = reinterpret_cast<const float4*>(x + 1)[0];   // planted: x + 1 is 4-byte aligned only
  out[threadIdx.x] = v.x + v.y + v.z + v.w;
}

__global__ void write_one_past_kernel(float* x, int n) {
  if (threadIdx.x == 0) x[n] = 1.0f;   // planted: one element past the tensor, inside its segment
}

// Each thread writes the turn it ran in (a device-wide counter): the schedule itself.
__global__ void turn_kernel(int* turns, int* counter) {
  turns[blockIdx.x * blockDim.x + threadIdx.x] = atomicAdd(counter, 1);
}

__global__ void syncs_kernel(int* out) {
  __syncthreads();   // planted: launched as a kernel that never waits
  out[threadIdx.x] = 1;
}

// The hardware's shuffle sources (CUDA programming guide, warp shuffle functions).
int ref_src(int kind, int l, int param, int width) {
  const int seg = l & ~(width - 1);
  switch (kind) {
    case 0: return seg + (param & (width - 1));
    case 1: return (l - seg) + param < width ? l + param : l;
    case 2: return (l - seg) >= param ? l - param : l;
    default: {
      const int s = l ^ param;
      return s >= seg + width ? l : s;
    }
  }
}

// ---- Tests ----

TEST(EmuRunner, ShufflesMatchTheHardwareForEveryWidth) {
  for (int width : {32, 16, 8, 4, 2, 1}) {
    Buf<int> out(32 * 4);
    MINIDL_LAUNCH("test", shuffles_kernel, 1, 32, 0, nullptr, out.get(), width);
    const std::vector<int> h = out.host();
    const int params[4] = {3, 5, 2, 9};
    for (int l = 0; l < 32; ++l) {
      for (int k = 0; k < 4; ++k) {
        EXPECT_EQ(h[static_cast<size_t>(4 * l + k)], 100 + ref_src(k, l, params[k], width))
            << "width " << width << " lane " << l << " shuffle kind " << k;
      }
    }
  }
}

TEST(EmuRunner, VotesCombineTheWarp) {
  Buf<unsigned> out(32 * 3);
  MINIDL_LAUNCH("test", votes_kernel, 1, 32, 0, nullptr, out.get());
  const std::vector<unsigned> h = out.host();
  unsigned ballot = 0;
  for (unsigned l = 0; l < 32; l += 3) ballot |= 1u << l;
  for (size_t l = 0; l < 32; ++l) {
    EXPECT_EQ(h[3 * l], ballot);
    EXPECT_EQ(h[3 * l + 1], 1u);
    EXPECT_EQ(h[3 * l + 2], 0u);
  }
}

TEST(EmuRunner, SharedMemoryStaticAndDynamicAndBarriersGiveABlockSum) {
  const int n = 1000;
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) x[static_cast<size_t>(i)] = static_cast<float>(i % 7);
  Buf<float> dx(n), out(3);
  ASSERT_EQ(cudaMemcpy(dx.get(), x.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  MINIDL_LAUNCH("test", block_sum_kernel, 3, 128, 0, nullptr, dx.get(), out.get(), n);
  float want = 0;
  for (float v : x) want += v;
  for (float got : out.host()) EXPECT_EQ(got, want);
  Buf<float> out2(2);
  MINIDL_LAUNCH("test", dynamic_block_sum_kernel, 2, 64, 64 * sizeof(float), nullptr, dx.get(), out2.get(), n);
  for (float got : out2.host()) EXPECT_EQ(got, want);
}

TEST(EmuChecks, DivergentSyncthreadsIsReported) {
  Buf<int> out(64);
  const std::string e = error_of([&] { MINIDL_LAUNCH("test", divergent_sync_kernel, 2, 64, 0, nullptr, out.get()); });
  EXPECT_NE(e.find("divergent_sync_kernel"), std::string::npos) << e;
  EXPECT_NE(e.find("__syncthreads() not reached by every thread"), std::string::npos) << e;
  EXPECT_NE(e.find("block (0, 0, 0)"), std::string::npos) << e;
  const std::string e2 = error_of([&] { MINIDL_LAUNCH("test", two_barriers_kernel, 1, 64, 0, nullptr, out.get()); });
  EXPECT_NE(e2.find("two different __syncthreads()"), std::string::npos) << e2;
  EXPECT_NE(e2.find("thread ("), std::string::npos) << e2;
}

TEST(EmuChecks, BadShuffleMasksAreReported) {
  Buf<int> out(32);
  const std::string e1 = error_of([&] { MINIDL_LAUNCH("test", mask_misses_caller_kernel, 1, 32, 0, nullptr, out.get()); });
  EXPECT_NE(e1.find("which the mask does not name"), std::string::npos) << e1;
  EXPECT_NE(e1.find("thread ("), std::string::npos) << e1;   // lane 16..31, whichever runs first
  const std::string e2 = error_of([&] { MINIDL_LAUNCH("test", mask_names_exited_kernel, 1, 32, 0, nullptr, out.get()); });
  EXPECT_NE(e2.find("names lane 16, which does not take part (it exited)"), std::string::npos) << e2;
  const std::string e3 = error_of([&] { MINIDL_LAUNCH("test", reads_outside_mask_kernel, 1, 32, 0, nullptr, out.get()); });
  EXPECT_NE(e3.find("reads lane 16, which is not in the shuffle's mask"), std::string::npos) << e3;
  const std::string e4 = error_of([&] { MINIDL_LAUNCH("test", shuffles_kernel, 1, 16, 0, nullptr, out.get(), 32); });
  EXPECT_NE(e4.find("names lanes that do not exist"), std::string::npos) << e4;
}

TEST(EmuChecks, LaunchConfigurationsTheHardwareRejectsFailToLaunch) {
  struct Bad {
    dim3 grid, block;
    size_t smem;
    const char* why;
  };
  for (const Bad& b : {Bad{dim3(1), dim3(1025), 0, "more than 1024 threads"},
                       Bad{dim3(1), dim3(32, 32, 2), 0, "more than 1024 threads"},
                       Bad{dim3(1, 65536), dim3(32), 0, "grid y or z over 65535"},
                       Bad{dim3(1, 1, 70000), dim3(32), 0, "grid y or z over 65535"},
                       Bad{dim3(1), dim3(32), 49 * 1024, "48 KiB of dynamic shared memory"},
                       Bad{dim3(0), dim3(32), 0, "an empty grid"}}) {
    const std::string e = error_of([&] { MINIDL_LAUNCH("planted", noop_kernel, b.grid, b.block, b.smem, nullptr, nullptr); });
    EXPECT_NE(e.find("cudaErrorInvalidConfiguration"), std::string::npos) << e;
    EXPECT_NE(e.find(b.why), std::string::npos) << e;
    EXPECT_NE(e.find("noop_kernel"), std::string::npos) << e;
  }
  // The limits themselves are fine.
  EXPECT_EQ(error_of([&] { MINIDL_LAUNCH("ok", noop_kernel, dim3(1, 65535), dim3(1), 48 * 1024, nullptr, nullptr); }),
            "");
  EXPECT_EQ(error_of([&] { MINIDL_LAUNCH("ok", noop_kernel, dim3(1), dim3(1024), 0, nullptr, nullptr); }), "");
}

TEST(EmuChecksDeathTest, MisalignedVectorLoadsStopTheProgram) {
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  Buf<float> x(64), out(32);
  // The load from x + 1 ends the process with UBSan's alignment report, which names the type.
  EXPECT_DEATH(run_now([&] { MINIDL_LAUNCH("test", misaligned_float4_kernel, 1, 32, 0, nullptr, x.get(), out.get()); }),
               "misaligned address .* for type 'const (struct )?float4', which requires 16 byte alignment");
}

// The ASan build poisons what the caching allocator has not handed out, so an overrun into the
// rest of a segment (invisible to a plain bounds check on cudaMalloc ranges) is reported.
TEST(EmuChecksDeathTest, OverrunInsideACachedSegmentIsReportedUnderAsan) {
  if (!emu::asan_build()) GTEST_SKIP() << "needs the ASan build of the emulator (-DMINIDL_EMU_ASAN=ON)";
  GTEST_FLAG_SET(death_test_style, "threadsafe");
  const Tensor t = empty({10}, {DType::f32, Device::cuda(0)});
  // The block is handed out in its (non-blocking) context stream's order; the legacy stream below
  // does not wait for that stream, so synchronize first (as on a GPU).
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  run_now([&] { MINIDL_LAUNCH("test", write_one_past_kernel, 1, 32, 0, nullptr, t.data<float>(), 9); });   // in bounds
  EXPECT_DEATH(run_now([&] { MINIDL_LAUNCH("test", write_one_past_kernel, 1, 32, 0, nullptr, t.data<float>(), 10); }),
               "AddressSanitizer: use-after-poison");
}

TEST(EmuChecks, ASecondScheduleExposesARace) {
  const unsigned blocks = 8, threads = 64;
  const uint64_t prev = emu::schedule_seed();   // MINIDL_EMU_SCHEDULE's, restored after each run
  auto run = [&](uint64_t seed) {
    emu::set_schedule_seed(seed);
    Buf<int> out(blocks);
    run_now([&] { MINIDL_LAUNCH("test", last_writer_kernel, blocks, threads, 0, nullptr, out.get()); });
    emu::set_schedule_seed(prev);
    return out.host();
  };
  const std::vector<int> in_order = run(0);
  for (int v : in_order) EXPECT_EQ(v, static_cast<int>(threads) - 1);   // index order: the last thread wins
  EXPECT_NE(run(12345), in_order) << "the seeded schedule must run the writers in another order";
  // A kernel without a race gives the same bits under both schedules.
  const int n = 777;
  std::vector<float> x(n);
  for (int i = 0; i < n; ++i) x[static_cast<size_t>(i)] = 1.0f / static_cast<float>(i + 1);
  Buf<float> dx(n), a(2), b(2);
  ASSERT_EQ(cudaMemcpy(dx.get(), x.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  emu::set_schedule_seed(0);
  run_now([&] { MINIDL_LAUNCH("test", block_sum_kernel, 2, 256, 0, nullptr, dx.get(), a.get(), n); });
  emu::set_schedule_seed(777);
  run_now([&] { MINIDL_LAUNCH("test", block_sum_kernel, 2, 256, 0, nullptr, dx.get(), b.get(), n); });
  emu::set_schedule_seed(prev);
  EXPECT_EQ(a.host(), b.host());
}

// A kernel launched as one that never waits (MINIDL_LAUNCH_NOWAIT) runs its threads one after
// another without fibers, in the order fibers run them: index order, or the seeded schedule's (the
// blocks after the first included).
TEST(EmuRunner, AKernelThatNeverWaitsRunsInTheFibersOrder) {
  const unsigned blocks = 3, threads = 96;
  const uint64_t prev = emu::schedule_seed();
  for (const uint64_t seed : {uint64_t{0}, uint64_t{99}}) {
    SCOPED_TRACE("schedule seed " + std::to_string(seed));
    emu::set_schedule_seed(seed);
    Buf<int> fibers(blocks * threads), direct(blocks * threads), c1(1), c2(1);
    run_now([&] { MINIDL_LAUNCH("test", turn_kernel, blocks, threads, 0, nullptr, fibers.get(), c1.get()); });
    run_now([&] { MINIDL_LAUNCH_NOWAIT("test", turn_kernel, blocks, threads, 0, nullptr, direct.get(), c2.get()); });
    EXPECT_EQ(direct.host(), fibers.host());
    std::vector<int> in_order(blocks * threads);
    for (size_t i = 0; i < in_order.size(); ++i) in_order[i] = static_cast<int>(i);
    if (seed == 0) EXPECT_EQ(direct.host(), in_order);
    else EXPECT_NE(direct.host(), in_order);
  }
  emu::set_schedule_seed(prev);
}

// A kernel launched with MINIDL_LAUNCH_NOWAIT that does wait is reported, naming the fix.
TEST(EmuChecks, AWaitInAKernelLaunchedAsNeverWaitingIsReported) {
  Buf<int> out(64);
  const std::string e = error_of([&] { MINIDL_LAUNCH_NOWAIT("test", syncs_kernel, 1, 64, 0, nullptr, out.get()); });
  EXPECT_NE(e.find("syncs_kernel"), std::string::npos) << e;
  EXPECT_NE(e.find("MINIDL_LAUNCH_NOWAIT"), std::string::npos) << e;
  EXPECT_NE(e.find("launch it with MINIDL_LAUNCH"), std::string::npos) << e;
  run_now([&] { MINIDL_LAUNCH("test", syncs_kernel, 1, 64, 0, nullptr, out.get()); });   // on fibers it works
  for (int v : out.host()) EXPECT_EQ(v, 1);
}

TEST(EmuRuntime, CopiesOutsideLiveAllocationsAreRefused) {
  Buf<float> d(16);
  std::vector<float> h(32);
  EXPECT_EQ(cudaMemcpy(d.get(), h.data(), 32 * sizeof(float), cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_NE(std::string(cudaGetErrorString(cudaGetLastError())).find("not inside one live device allocation"),
            std::string::npos);
  EXPECT_EQ(cudaMemcpy(h.data(), d.get(), 16 * sizeof(float), cudaMemcpyHostToDevice), cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);
  EXPECT_EQ(cudaMemcpy(h.data(), d.get(), 16 * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  void* p = nullptr;
  size_t total = 0;
  ASSERT_EQ(cudaMemGetInfo(nullptr, &total), cudaSuccess);
  EXPECT_EQ(cudaMalloc(&p, total + 1), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaGetLastError(), cudaErrorMemoryAllocation);
  EXPECT_EQ(cudaFree(h.data()), cudaErrorInvalidValue);
  cudaGetLastError();
}

}  // namespace
}  // namespace minidl::cuda
