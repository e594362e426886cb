// Shared memory on the emulated device: each planted bug is reported naming the kernel, the array,
// the offset, the block and the thread: a read of shared memory no thread of the block wrote
// (static and dynamic; the written marks do not carry over from the previous block), an access
// outside the array, and static shared memory over the 48 KiB a block may use.
#include <gtest/gtest.h>

#include <string>

#include "kernels/cuda/device/launch.cuh"
#include "tests/emu/emu_test_util.h"
#include "tests/support/holds_all.h"

namespace minidl::cuda {
namespace {

using ::minidl::testing::holds_all;

// Thread t reads s[t + 1], which thread t + 1 writes after the barrier: planted read-before-write.
__global__ void read_before_write_kernel(float* out) {
  MINIDL_SHARED_ARRAY(float, s, 64);
  s[threadIdx.x] = 1.0f;
  __syncthreads();
  float v = 0;
  if (threadIdx.x + 1 < 64) v = s[threadIdx.x + 1];
  out[threadIdx.x] = v;
}

// Correct in the first block only: block 0 writes the whole array, the others only half of it,
// and thread 0 reads s[31].
__global__ void only_first_block_writes_kernel(int* out) {
  MINIDL_SHARED_VAR(int, flag);
  MINIDL_SHARED_ARRAY(int, s, 32);
  if (blockIdx.x == 0 || threadIdx.x < 16) s[threadIdx.x] = static_cast<int>(threadIdx.x);
  if (threadIdx.x == 0) flag = 1;
  __syncthreads();
  out[blockIdx.x * 32 + threadIdx.x] = s[threadIdx.x == 0 ? 31 : threadIdx.x % 16] + flag;
}

__global__ void dynamic_read_before_write_kernel(double* out) {
  const auto s = dynamic_shared<double>();
  if (threadIdx.x != 5) s[threadIdx.x] = 2.0;   // planted: thread 5 forgets its element
  __syncthreads();
  if (threadIdx.x == 0) {
    double t = 0;
    for (unsigned k = 0; k < blockDim.x; ++k) t += s[k];
    out[0] = t;
  }
}

__global__ void shared_overrun_kernel(int* out, int n) {
  MINIDL_SHARED_ARRAY(int, s, 16);
  if (threadIdx.x == 0) s[n] = 1;   // planted when n == 16
  __syncthreads();
  out[0] = 0;
}

// 32 KiB + 24 KiB of static shared memory: each array alone is legal, together over 48 KiB.
__global__ void too_much_static_kernel(float* out) {
  MINIDL_SHARED_ARRAY(float, a, 8192);
  MINIDL_SHARED_ARRAY(float, b, 6144);
  a[threadIdx.x] = 1.0f;
  b[threadIdx.x] = 2.0f;
  __syncthreads();
  out[threadIdx.x] = a[threadIdx.x] + b[threadIdx.x];
}

// 40 KiB of static shared memory: legal alone, over 48 KiB with more than 8 KiB of dynamic.
__global__ void static_plus_dynamic_kernel(float* out) {
  MINIDL_SHARED_ARRAY(float, a, 10240);
  a[threadIdx.x] = 1.0f;
  __syncthreads();
  out[threadIdx.x] = a[threadIdx.x];
}

TEST(EmuSharedMemory, ReadBeforeWriteIsReportedWithArrayOffsetAndThread) {
  Buf<float> out(64);
  const std::string e =
      error_of([&] { MINIDL_LAUNCH("planted", read_before_write_kernel, 1, 64, 0, nullptr, out.get()); });
  // Index order: every s[t + 1] was written before the barrier, so it passes...
  EXPECT_EQ(e, "");
  Buf<float> out2(64);
  // ...but 64 threads writing only s[0..62] (one element too few) is caught.
  const std::string e2 =
      error_of([&] { MINIDL_LAUNCH("planted", read_before_write_kernel, 1, 63, 0, nullptr, out2.get()); });
  EXPECT_TRUE(holds_all(e2, {"read_before_write_kernel (planted)",
                             "shared memory read before any thread of the block wrote it",
                             "4 bytes at offset 252 of `s` (256 bytes",
                             "block (0, 0, 0) thread (62, 0, 0)"}));
}

TEST(EmuSharedMemory, WrittenMarksAreClearedAtEachBlocksStart) {
  Buf<int> out(32);
  EXPECT_EQ(error_of([&] { MINIDL_LAUNCH("ok", only_first_block_writes_kernel, 1, 32, 0, nullptr, out.get()); }), "");
  EXPECT_EQ(out.host()[0], 31 + 1);
  Buf<int> out2(64);
  const std::string e =
      error_of([&] { MINIDL_LAUNCH("planted", only_first_block_writes_kernel, 2, 32, 0, nullptr, out2.get()); });
  EXPECT_NE(e.find("read before any thread of the block wrote it: 4 bytes at offset 124 of `s`"), std::string::npos)
      << e;
  EXPECT_NE(e.find("block (1, 0, 0) thread (0, 0, 0)"), std::string::npos) << e;
}

TEST(EmuSharedMemory, DynamicSharedMemoryIsCheckedToo) {
  Buf<double> out(1);
  const std::string e = error_of([&] {
    MINIDL_LAUNCH("planted", dynamic_read_before_write_kernel, 1, 32, 32 * sizeof(double), nullptr, out.get());
  });
  EXPECT_TRUE(holds_all(e, {"8 bytes at offset 40 of dynamic shared memory (256 bytes", "thread (0, 0, 0)"}));
}

TEST(EmuSharedMemory, AccessOutsideASharedArrayIsReported) {
  Buf<int> out(1);
  EXPECT_EQ(error_of([&] { MINIDL_LAUNCH("ok", shared_overrun_kernel, 1, 32, 0, nullptr, out.get(), 15); }), "");
  const std::string e =
      error_of([&] { MINIDL_LAUNCH("planted", shared_overrun_kernel, 1, 32, 0, nullptr, out.get(), 16); });
  EXPECT_NE(e.find("shared memory write out of bounds: 4 bytes at offset 64 of `s` (64 bytes)"), std::string::npos)
      << e;
}

TEST(EmuSharedMemory, StaticSharedMemoryOver48KiBIsRejected) {
  Buf<float> out(32);
  const std::string e =
      error_of([&] { MINIDL_LAUNCH("planted", too_much_static_kernel, 1, 32, 0, nullptr, out.get()); });
  EXPECT_TRUE(holds_all(e, {"too_much_static_kernel (planted)",
                            "static shared memory over the 48 KiB",
                            "`b` (24576 bytes) after the static `a` (32768 bytes)",
                            "uses too much shared data"}));
  // 40 KiB static + 8 KiB dynamic is exactly the limit; one more dynamic byte is over it.
  EXPECT_EQ(error_of([&] { MINIDL_LAUNCH("ok", static_plus_dynamic_kernel, 1, 32, 8192, nullptr, out.get()); }), "");
  const std::string e2 =
      error_of([&] { MINIDL_LAUNCH("planted", static_plus_dynamic_kernel, 1, 32, 8193, nullptr, out.get()); });
  EXPECT_TRUE(holds_all(e2, {"and 8193 bytes of dynamic shared memory", "cudaErrorInvalidValue"}));
}

}  // namespace
}  // namespace minidl::cuda
