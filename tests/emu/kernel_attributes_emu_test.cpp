// cudaFuncSetAttribute on the emulated device (issue 30): more than 48 KiB of dynamic shared memory
// needs the kernel's opt-in (cudaFuncAttributeMaxDynamicSharedMemorySize), which cannot pass the
// H100's 227 KiB per block with the kernel's static shared memory. The planted bugs: a launch that
// forgot the opt-in, one above the limit it set, and limits the hardware refuses.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/cuda/device/launch.cuh"
#include "tests/emu/emu_test_util.h"

namespace minidl::cuda {
namespace {

// Stages n floats through dynamic shared memory and sums them in thread 0.
__global__ void big_dynamic_sum_kernel(const float* x, float* out, int n) {
  const auto s = dynamic_shared<float>();
  for (int i = threadIdx.x; i < n; i += blockDim.x) s[i] = x[i];
  __syncthreads();
  if (threadIdx.x == 0) {
    float t = 0;
    for (int i = 0; i < n; ++i) t += s[i];
    out[0] = t;
  }
}

// 40 KiB of static shared memory besides the launch's dynamic bytes.
__global__ void static_40k_kernel(float* out) {
  MINIDL_SHARED_ARRAY(float, a, 10 * 1024);
  a[threadIdx.x] = 1.0f;
  __syncthreads();
  out[threadIdx.x] = a[threadIdx.x];
}

TEST(EmuKernelAttributes, DynamicSharedMemoryAbove48KiBNeedsTheOptIn) {
  constexpr int n = 100 * 1024 / 4;   // 100 KiB of floats
  std::vector<float> x(n, 0.5f);
  Buf<float> dx(n), out(1);
  ASSERT_EQ(cudaMemcpy(dx.get(), x.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
  const size_t bytes = n * sizeof(float);
  // Planted: no opt-in. The launch fails, as on a GPU, saying what to call.
  const std::string e = error_of(
      [&] { MINIDL_LAUNCH("planted", big_dynamic_sum_kernel, 1, 256, bytes, nullptr, dx.get(), out.get(), n); });
  EXPECT_TRUE(mentions(e, "more than 48 KiB of dynamic shared memory without the opt-in")) << e;
  EXPECT_TRUE(mentions(e, "cudaFuncAttributeMaxDynamicSharedMemorySize")) << e;
  // With it, the kernel runs and uses all of it.
  ASSERT_EQ(cudaFuncSetAttribute(big_dynamic_sum_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                 static_cast<int>(bytes)),
            cudaSuccess);
  EXPECT_EQ(
      error_of([&] { MINIDL_LAUNCH("ok", big_dynamic_sum_kernel, 1, 256, bytes, nullptr, dx.get(), out.get(), n); }),
      "");
  EXPECT_EQ(out.host()[0], 0.5f * n);
  cudaFuncAttributes attrs{};
  ASSERT_EQ(cudaFuncGetAttributes(&attrs, big_dynamic_sum_kernel), cudaSuccess);
  EXPECT_EQ(attrs.maxDynamicSharedSizeBytes, static_cast<int>(bytes));
  // Planted: 4 bytes above the limit it set.
  const std::string e2 = error_of([&] {
    MINIDL_LAUNCH("planted", big_dynamic_sum_kernel, 1, 256, bytes + 4, nullptr, dx.get(), out.get(), n + 1);
  });
  EXPECT_TRUE(mentions(e2, "more than the 102400 bytes of dynamic shared memory cudaFuncSetAttribute allowed")) << e2;
}

TEST(EmuKernelAttributes, TheOptInStopsAtTheH100s227KiBWithTheStaticBytes) {
  int device_optin = 0;
  cudaDeviceProp prop{};
  ASSERT_EQ(cudaGetDeviceProperties(&prop, 0), cudaSuccess);
  device_optin = static_cast<int>(prop.sharedMemPerBlockOptin);
  EXPECT_EQ(device_optin, 227 * 1024);
  EXPECT_EQ(cudaFuncSetAttribute(big_dynamic_sum_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, device_optin),
            cudaSuccess);
  EXPECT_EQ(cudaFuncSetAttribute(big_dynamic_sum_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, device_optin + 1),
            cudaErrorInvalidValue);
  const std::string why = cudaGetErrorString(cudaErrorInvalidValue);
  EXPECT_TRUE(mentions(why, "227 KiB")) << why;
  cudaGetLastError();
  // Once the kernel ran, its 40 KiB of static shared memory count against the 227 KiB.
  Buf<float> out(32);
  ASSERT_EQ(error_of([&] { MINIDL_LAUNCH("ok", static_40k_kernel, 1, 32, 0, nullptr, out.get()); }), "");
  EXPECT_EQ(cudaFuncSetAttribute(static_40k_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 187 * 1024),
            cudaSuccess);
  EXPECT_EQ(cudaFuncSetAttribute(static_40k_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, 187 * 1024 + 1),
            cudaErrorInvalidValue);
  cudaGetLastError();
  // With the opt-in, 40 KiB static + 100 KiB dynamic fit in one block (over 48 KiB together).
  EXPECT_EQ(error_of([&] { MINIDL_LAUNCH("ok", static_40k_kernel, 1, 32, 100 * 1024, nullptr, out.get()); }), "");
  // The carveout is a hint in percent; other attributes are not modelled and say so.
  EXPECT_EQ(cudaFuncSetAttribute(static_40k_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 50), cudaSuccess);
  EXPECT_EQ(cudaFuncSetAttribute(static_40k_kernel, cudaFuncAttributePreferredSharedMemoryCarveout, 101),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaFuncSetAttribute(static_40k_kernel, cudaFuncAttributeRequiredClusterWidth, 2), cudaErrorInvalidValue);
  EXPECT_TRUE(mentions(cudaGetErrorString(cudaErrorInvalidValue), "not modelled"));
  cudaGetLastError();
}

}  // namespace
}  // namespace minidl::cuda
