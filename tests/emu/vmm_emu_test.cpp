// The emulated driver's virtual memory calls (cuda_emu/vmm.cpp), found as the CUDA backend finds
// them (cudaGetDriverEntryPointByVersion): memory mapped into a reserved range is device memory to
// copies and kernels, neighbouring pages make one range, unmapped memory is not device memory any
// more, physical memory runs out at the device's capacity, and the driver's rules are enforced.
#include <gtest/gtest.h>
#include <cuda.h>

#include <cstring>
#include <vector>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/device/launch.cuh"
#include "cuda_emu/runtime_state.h"
#include "tests/emu/emu_test_util.h"

namespace minidl::cuda {
namespace {

template <class F>
F entry(const char* name) {
  void* p = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  EXPECT_EQ(cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &found), cudaSuccess);
  EXPECT_EQ(found, cudaDriverEntryPointSuccess) << name;
  return reinterpret_cast<F>(p);
}

struct Driver {
  using Granularity = CUresult (*)(size_t*, const CUmemAllocationProp*, CUmemAllocationGranularity_flags);
  using Reserve = CUresult (*)(CUdeviceptr*, size_t, size_t, CUdeviceptr, unsigned long long);
  using AddressFree = CUresult (*)(CUdeviceptr, size_t);
  using Create = CUresult (*)(CUmemGenericAllocationHandle*, size_t, const CUmemAllocationProp*, unsigned long long);
  using Release = CUresult (*)(CUmemGenericAllocationHandle);
  using Map = CUresult (*)(CUdeviceptr, size_t, size_t, CUmemGenericAllocationHandle, unsigned long long);
  using Unmap = CUresult (*)(CUdeviceptr, size_t);
  using SetAccess = CUresult (*)(CUdeviceptr, size_t, const CUmemAccessDesc*, size_t);
  Granularity granularity = entry<Granularity>("cuMemGetAllocationGranularity");
  Reserve reserve = entry<Reserve>("cuMemAddressReserve");
  AddressFree address_free = entry<AddressFree>("cuMemAddressFree");
  Create create = entry<Create>("cuMemCreate");
  Release release = entry<Release>("cuMemRelease");
  Map map = entry<Map>("cuMemMap");
  Unmap unmap = entry<Unmap>("cuMemUnmap");
  SetAccess set_access = entry<SetAccess>("cuMemSetAccess");
  CUmemAllocationProp prop{};
  CUmemAccessDesc rw{};
  size_t page = 0;
  Driver() {
    prop.type = CU_MEM_ALLOCATION_TYPE_PINNED;
    prop.location.type = CU_MEM_LOCATION_TYPE_DEVICE;
    rw.location = prop.location;
    rw.flags = CU_MEM_ACCESS_FLAGS_PROT_READWRITE;
    EXPECT_EQ(granularity(&page, &prop, CU_MEM_ALLOC_GRANULARITY_MINIMUM), CUDA_SUCCESS);
  }
  // A page of physical memory at `at`, accessible; its handle.
  CUmemGenericAllocationHandle map_page(CUdeviceptr at) {
    CUmemGenericAllocationHandle h = 0;
    EXPECT_EQ(create(&h, page, &prop, 0), CUDA_SUCCESS);
    EXPECT_EQ(map(at, page, 0, h, 0), CUDA_SUCCESS);
    EXPECT_EQ(set_access(at, page, &rw, 1), CUDA_SUCCESS);
    return h;
  }
};

__global__ void fill_kernel(int* out, int v, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] = v;
}

TEST(EmuVmm, MappedPagesAreDeviceMemoryAndNeighboursMakeOneRange) {
  Driver d;
  ASSERT_EQ(d.page, size_t{2} << 20);
  CUdeviceptr base = 0;
  ASSERT_EQ(d.reserve(&base, 8 * d.page, d.page, 0, 0), CUDA_SUCCESS);
  EXPECT_EQ(base % d.page, 0u);
  const CUmemGenericAllocationHandle a = d.map_page(base), b = d.map_page(base + d.page);
  // A kernel and a copy across the two pages: one range, as on a GPU.
  int* p = reinterpret_cast<int*>(base + d.page - 4096);
  const int n = 2048;   // 8 KiB across the page boundary
  MINIDL_LAUNCH("vmm", fill_kernel, 8, 256, 0, nullptr, p, 7, n);
  std::vector<int> host(n, 0);
  ASSERT_EQ(cudaMemcpy(host.data(), p, n * sizeof(int), cudaMemcpyDeviceToHost), cudaSuccess);
  for (int v : host) ASSERT_EQ(v, 7);
  // The third page is reserved, not mapped: not device memory.
  EXPECT_FALSE(emu::device_range_live(reinterpret_cast<void*>(base + 2 * d.page), 16));
  EXPECT_EQ(cudaMemcpy(reinterpret_cast<void*>(base + 2 * d.page), host.data(), 16, cudaMemcpyHostToDevice),
            cudaErrorInvalidValue);
  EXPECT_EQ(cudaGetLastError(), cudaErrorInvalidValue);   // read, and cleared
  // Unmapping the first page leaves the second alone.
  ASSERT_EQ(d.unmap(base, d.page), CUDA_SUCCESS);
  EXPECT_FALSE(emu::device_range_live(reinterpret_cast<void*>(base), 16));
  EXPECT_TRUE(emu::device_range_live(reinterpret_cast<void*>(base + d.page), d.page));
  EXPECT_EQ(d.address_free(base, 8 * d.page), CUDA_ERROR_INVALID_VALUE) << "a page is still mapped";
  ASSERT_EQ(d.unmap(base + d.page, d.page), CUDA_SUCCESS);
  EXPECT_EQ(d.release(a), CUDA_SUCCESS);
  EXPECT_EQ(d.release(b), CUDA_SUCCESS);
  EXPECT_EQ(d.address_free(base, 8 * d.page), CUDA_SUCCESS);
  ASSERT_EQ(cudaGetLastError(), cudaSuccess);
}

TEST(EmuVmm, PhysicalMemoryRunsOutAtTheDevicesCapacityAndTheDriversRulesHold) {
  Driver d;
  size_t free_bytes = 0, total = 0;
  ASSERT_EQ(cudaMemGetInfo(&free_bytes, &total), cudaSuccess);
  std::vector<CUmemGenericAllocationHandle> hs;
  CUmemGenericAllocationHandle h = 0;
  while (d.create(&h, d.page, &d.prop, 0) == CUDA_SUCCESS) hs.push_back(h);
  EXPECT_EQ(hs.size(), free_bytes / d.page) << "cuMemCreate draws on the capacity cudaMalloc draws on";
  size_t now_free = 0;
  ASSERT_EQ(cudaMemGetInfo(&now_free, &total), cudaSuccess);
  EXPECT_LT(now_free, d.page);
  for (auto x : hs) ASSERT_EQ(d.release(x), CUDA_SUCCESS);
  EXPECT_EQ(d.release(hs.front()), CUDA_ERROR_INVALID_VALUE) << "released twice";

  CUdeviceptr base = 0;
  ASSERT_EQ(d.reserve(&base, 4 * d.page, 0, 0, 0), CUDA_SUCCESS);
  ASSERT_EQ(d.create(&h, d.page, &d.prop, 0), CUDA_SUCCESS);
  EXPECT_EQ(d.map(base + 4096, d.page, 0, h, 0), CUDA_ERROR_INVALID_VALUE) << "not on a page boundary";
  EXPECT_EQ(d.map(base + 4 * d.page, d.page, 0, h, 0), CUDA_ERROR_INVALID_VALUE) << "outside the reservation";
  ASSERT_EQ(d.map(base, d.page, 0, h, 0), CUDA_SUCCESS);
  EXPECT_EQ(d.map(base, d.page, 0, h, 0), CUDA_ERROR_INVALID_VALUE) << "mapped twice";
  EXPECT_FALSE(emu::device_range_live(reinterpret_cast<void*>(base), 16)) << "no access before cuMemSetAccess";
  ASSERT_EQ(d.set_access(base, d.page, &d.rw, 1), CUDA_SUCCESS);
  EXPECT_TRUE(emu::device_range_live(reinterpret_cast<void*>(base), d.page));
  EXPECT_EQ(d.unmap(base + d.page, d.page), CUDA_ERROR_INVALID_VALUE) << "not mapped";
  ASSERT_EQ(d.unmap(base, d.page), CUDA_SUCCESS);
  ASSERT_EQ(d.release(h), CUDA_SUCCESS);
  ASSERT_EQ(d.address_free(base, 4 * d.page), CUDA_SUCCESS);
  void* missing = &missing;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSuccess;
  ASSERT_EQ(cudaGetDriverEntryPointByVersion("cuNotAFunction", &missing, 12000, cudaEnableDefault, &found),
            cudaSuccess);
  EXPECT_EQ(found, cudaDriverEntryPointSymbolNotFound);
  EXPECT_EQ(missing, nullptr);
}

}  // namespace
}  // namespace minidl::cuda
