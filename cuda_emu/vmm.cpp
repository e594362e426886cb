// The driver's virtual memory calls on the emulated device, reached as the CUDA backend reaches them on
// a GPU: through cudaGetDriverEntryPointByVersion (the backend never links libcuda). They exist for
// the caching allocator's expandable segments (kernels/caching_allocator.h): an address range is
// reserved (host address space with no access, mmap PROT_NONE), physical memory is created (counted
// against MINIDL_EMU_MEMORY_MB as cudaMalloc's is, so it runs out as a GPU's does), mapped at an
// address of the range and made accessible (mprotect; its bytes filled with 0xFF, as a fresh
// cudaMalloc's are), then unmapped (inaccessible again: a kernel or copy still using it faults) and
// released. The checks are the driver's: a map inside a reservation, of a whole handle, onto
// addresses not mapped yet; an unmap of what is mapped; an address range freed only when nothing in
// it is mapped. A mapped range is device memory to the copies' and kernels' range checks.
#include <cuda.h>
#include <sys/mman.h>

#include <cstdio>
#include <cstring>
#include <map>
#include <mutex>
#include <string>

#include "cuda_emu/runtime_state.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

namespace minidl::cuda::emu {
namespace {

constexpr size_t kGranularity = size_t{2} << 20;   // cuMemGetAllocationGranularity on an H100 or H200

struct Vmm {
  std::mutex mu;
  std::map<uintptr_t, size_t> reserved;                 // base -> bytes of each cuMemAddressReserve
  std::map<CUmemGenericAllocationHandle, size_t> handles;   // live cuMemCreate handles -> bytes
  std::map<uintptr_t, std::pair<size_t, CUmemGenericAllocationHandle>> mapped;   // base -> bytes, handle
  CUmemGenericAllocationHandle next = 1;
};
Vmm& vmm() {
  static Vmm* v = new Vmm();   // never destroyed, as the runtime's state
  return *v;
}

// The mapped ranges made accessible, neighbours merged (a block spanning two pages is inside one
// range, as on a GPU): what the runtime's range checks ask. Its own lock, taken last (the runtime's
// checks hold theirs, the calls below hold Vmm's).
struct Accessible {
  std::mutex mu;
  std::map<uintptr_t, size_t> ranges;
};
Accessible& accessible() {
  static Accessible* a = new Accessible();
  return *a;
}

void add_accessible(uintptr_t base, size_t bytes) {
  Accessible& a = accessible();
  std::lock_guard<std::mutex> lock(a.mu);
  auto next = a.ranges.find(base + bytes);
  if (next != a.ranges.end()) {
    bytes += next->second;
    a.ranges.erase(next);
  }
  auto it = a.ranges.lower_bound(base);
  if (it != a.ranges.begin() && std::prev(it)->first + std::prev(it)->second == base) {
    std::prev(it)->second += bytes;
    return;
  }
  a.ranges[base] = bytes;
}

// Not accessible yet when cuMemSetAccess never ran: nothing to remove.
void remove_accessible(uintptr_t base, size_t bytes) {
  Accessible& a = accessible();
  std::lock_guard<std::mutex> lock(a.mu);
  if (!range_inside(a.ranges, base, bytes)) return;
  auto it = std::prev(a.ranges.upper_bound(base));
  const uintptr_t start = it->first, end = it->first + it->second;
  a.ranges.erase(it);
  if (start < base) a.ranges[start] = base - start;
  if (base + bytes < end) a.ranges[base + bytes] = end - base - bytes;
}

// The driver answers with a code alone; the emulator also says why, on stderr.
CUresult refuse(CUresult r, const std::string& why) {
  std::fprintf(stderr, "emulated CUDA driver: %s\n", why.c_str());
  return r;
}

bool overlaps_mapped(Vmm& v, uintptr_t a, size_t bytes) {
  auto it = v.mapped.lower_bound(a);
  if (it != v.mapped.end() && it->first < a + bytes) return true;
  return it != v.mapped.begin() && std::prev(it)->first + std::prev(it)->second.first > a;
}

CUresult drv_granularity(size_t* g, const CUmemAllocationProp* prop, CUmemAllocationGranularity_flags) {
  if (g == nullptr || prop == nullptr) return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemGetAllocationGranularity: NULL");
  if (prop->type != CU_MEM_ALLOCATION_TYPE_PINNED || prop->location.type != CU_MEM_LOCATION_TYPE_DEVICE)
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemGetAllocationGranularity: only pinned device memory is emulated");
  *g = kGranularity;
  return CUDA_SUCCESS;
}

CUresult drv_reserve(CUdeviceptr* p, size_t bytes, size_t alignment, CUdeviceptr addr, unsigned long long flags) {
  if (p == nullptr || bytes == 0 || bytes % kGranularity != 0 || addr != 0 || flags != 0 ||
      (alignment != 0 && alignment % kGranularity != 0))
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemAddressReserve: a size that is a multiple of the granularity, no "
                                            "fixed address, no flags");
  const size_t align = alignment == 0 ? kGranularity : alignment;
  void* m = mmap(nullptr, bytes + align, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return refuse(CUDA_ERROR_OUT_OF_MEMORY, "cuMemAddressReserve: no host address space left");
  // The aligned part is the reservation; the slack before and after it goes back at once.
  const auto start = reinterpret_cast<uintptr_t>(m), base = (start + align - 1) / align * align;
  if (base > start) munmap(m, base - start);
  if (start + align > base) munmap(reinterpret_cast<void*>(base + bytes), start + align - base);
  Vmm& v = vmm();
  std::lock_guard<std::mutex> lock(v.mu);
  v.reserved[base] = bytes;
  *p = base;
  return CUDA_SUCCESS;
}

CUresult drv_address_free(CUdeviceptr p, size_t bytes) {
  Vmm& v = vmm();
  std::lock_guard<std::mutex> lock(v.mu);
  auto it = v.reserved.find(p);
  if (it == v.reserved.end() || it->second != bytes)
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemAddressFree: not a reservation of that size");
  if (overlaps_mapped(v, p, bytes)) return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemAddressFree: pages still mapped");
  munmap(reinterpret_cast<void*>(p), bytes);
  v.reserved.erase(it);
  return CUDA_SUCCESS;
}

CUresult drv_create(CUmemGenericAllocationHandle* h, size_t bytes, const CUmemAllocationProp* prop,
                    unsigned long long) {
  if (h == nullptr || prop == nullptr || bytes == 0 || bytes % kGranularity != 0)
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemCreate: a size that is a multiple of the granularity");
  if (!take_device_capacity(bytes)) return CUDA_ERROR_OUT_OF_MEMORY;
  Vmm& v = vmm();
  std::lock_guard<std::mutex> lock(v.mu);
  *h = v.next++;
  v.handles[*h] = bytes;
  return CUDA_SUCCESS;
}

CUresult drv_release(CUmemGenericAllocationHandle h) {
  Vmm& v = vmm();
  std::lock_guard<std::mutex> lock(v.mu);
  auto it = v.handles.find(h);
  if (it == v.handles.end()) return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemRelease: not a live handle");
  for (const auto& [base, m] : v.mapped)
    if (m.second == h) return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemRelease: emulated handles are released unmapped");
  give_device_capacity(it->second);
  v.handles.erase(it);
  return CUDA_SUCCESS;
}

CUresult drv_map(CUdeviceptr p, size_t bytes, size_t offset, CUmemGenericAllocationHandle h, unsigned long long flags) {
  if (capture_forbids("cuMemMap") != cudaSuccess) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  Vmm& v = vmm();
  {
    std::lock_guard<std::mutex> lock(v.mu);
    auto it = v.handles.find(h);
    if (it == v.handles.end() || offset != 0 || flags != 0 || it->second != bytes)
      return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemMap: a whole live handle, offset 0, no flags");
    if (p % kGranularity != 0 || !range_inside(v.reserved, p, bytes))
      return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemMap: an aligned range inside one reservation");
    if (overlaps_mapped(v, p, bytes)) return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemMap: addresses already mapped");
    v.mapped[p] = {bytes, h};
  }
  // Accessible only after cuMemSetAccess, as on a GPU; filled as cudaMalloc's memory is.
  void* q = reinterpret_cast<void*>(p);
  mprotect(q, bytes, PROT_READ | PROT_WRITE);
  std::memset(q, 0xFF, bytes);
  mprotect(q, bytes, PROT_NONE);
  return CUDA_SUCCESS;
}

CUresult drv_set_access(CUdeviceptr p, size_t bytes, const CUmemAccessDesc* desc, size_t count) {
  if (desc == nullptr || count != 1 || desc->flags != CU_MEM_ACCESS_FLAGS_PROT_READWRITE)
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemSetAccess: one read-write descriptor");
  Vmm& v = vmm();
  {
    std::lock_guard<std::mutex> lock(v.mu);
    for (uintptr_t a = p; a < p + bytes;) {
      auto it = v.mapped.find(a);
      if (it == v.mapped.end()) return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemSetAccess: a range not mapped");
      a += it->second.first;
    }
  }
  mprotect(reinterpret_cast<void*>(p), bytes, PROT_READ | PROT_WRITE);
  add_accessible(p, bytes);
  return CUDA_SUCCESS;
}

CUresult drv_unmap(CUdeviceptr p, size_t bytes) {
  if (capture_forbids("cuMemUnmap") != cudaSuccess) return CUDA_ERROR_STREAM_CAPTURE_INVALIDATED;
  synchronize_all();   // modelled as cudaFree: the device's queued work runs before the memory goes
  Vmm& v = vmm();
  std::lock_guard<std::mutex> lock(v.mu);
  auto it = v.mapped.find(p);
  if (it == v.mapped.end() || it->second.first != bytes)
    return refuse(CUDA_ERROR_INVALID_VALUE, "cuMemUnmap: not a mapping of that size");
  remove_accessible(p, bytes);
  v.mapped.erase(it);
  void* q = reinterpret_cast<void*>(p);
#if defined(__SANITIZE_ADDRESS__)
  ASAN_UNPOISON_MEMORY_REGION(q, bytes);
#endif
  madvise(q, bytes, MADV_DONTNEED);
  mprotect(q, bytes, PROT_NONE);
  return CUDA_SUCCESS;
}

}  // namespace

bool mapped_range_live(uintptr_t a, size_t bytes) {
  Accessible& acc = accessible();
  std::lock_guard<std::mutex> lock(acc.mu);
  return range_inside(acc.ranges, a, bytes);
}

std::vector<std::pair<uintptr_t, size_t>> mapped_ranges() {
  Accessible& acc = accessible();
  std::lock_guard<std::mutex> lock(acc.mu);
  return {acc.ranges.begin(), acc.ranges.end()};
}

}  // namespace minidl::cuda::emu

using namespace minidl::cuda::emu;   // NOLINT: the C entry point below is the runtime's

extern "C" cudaError_t cudaGetDriverEntryPointByVersion(const char* symbol, void** fn, unsigned int /*version*/,
                                                        unsigned long long /*flags*/,
                                                        cudaDriverEntryPointQueryResult* status) {
  if (symbol == nullptr || fn == nullptr)
    return runtime_fail(cudaErrorInvalidValue, "cudaGetDriverEntryPointByVersion: NULL");
  static const std::map<std::string, void*> table{
      {"cuMemGetAllocationGranularity", reinterpret_cast<void*>(&drv_granularity)},
      {"cuMemAddressReserve", reinterpret_cast<void*>(&drv_reserve)},
      {"cuMemAddressFree", reinterpret_cast<void*>(&drv_address_free)},
      {"cuMemCreate", reinterpret_cast<void*>(&drv_create)},
      {"cuMemRelease", reinterpret_cast<void*>(&drv_release)},
      {"cuMemMap", reinterpret_cast<void*>(&drv_map)},
      {"cuMemUnmap", reinterpret_cast<void*>(&drv_unmap)},
      {"cuMemSetAccess", reinterpret_cast<void*>(&drv_set_access)}};
  const auto it = table.find(symbol);
  *fn = it == table.end() ? nullptr : it->second;
  if (status != nullptr) *status = it == table.end() ? cudaDriverEntryPointSymbolNotFound : cudaDriverEntryPointSuccess;
  return cudaSuccess;
}
