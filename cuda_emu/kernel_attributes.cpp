// cudaFuncSetAttribute / cudaFuncGetAttributes on the emulated device: a kernel may use more than 48
// KiB of dynamic shared memory only after cudaFuncAttributeMaxDynamicSharedMemorySize raised its
// limit, and that limit plus the kernel's static shared memory cannot pass the H100's opt-in
// maximum per block (cudaDevAttrMaxSharedMemoryPerBlockOptin, 227 KiB). The emulator learns a
// kernel's static shared bytes when it first runs (its threads declare the arrays), so a limit set
// before that is checked against them at the launch (shared_arena.cpp).
#include <algorithm>
#include <mutex>
#include <string>
#include <unordered_map>

#include "cuda_emu/runtime_state.h"
#include "cuda_emu/shared_arena.h"

namespace minidl::cuda::emu {
namespace {

struct Attributes {
  size_t max_dynamic = kSharedLimit;
  int carveout = -1;
  size_t static_bytes = 0;   // learned at the kernel's launches (0 before the first)
};

struct Registry {
  std::mutex mu;
  std::unordered_map<const void*, Attributes> kernels;
};
Registry& reg() {
  static auto* r = new Registry();   // never destroyed: kernels launch after main returns
  return *r;
}

}  // namespace

size_t max_dynamic_shared(const void* func) {
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.mu);
  auto it = r.kernels.find(func);
  return it == r.kernels.end() ? kSharedLimit : it->second.max_dynamic;
}

void note_static_shared(const void* func, size_t bytes) {
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.mu);
  Attributes& a = r.kernels[func];
  a.static_bytes = std::max(a.static_bytes, bytes);
}

}  // namespace minidl::cuda::emu

using namespace minidl::cuda::emu;   // NOLINT: the C entry points below are the runtime's

extern "C" {

cudaError_t cudaFuncSetAttribute(const void* func, cudaFuncAttribute attr, int value) {
  MINIDL_EMU_STICKY();
  if (func == nullptr) return runtime_fail(cudaErrorInvalidDeviceFunction, "cudaFuncSetAttribute: NULL kernel");
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.mu);
  Attributes& a = r.kernels[func];
  switch (attr) {
    case cudaFuncAttributeMaxDynamicSharedMemorySize:
      if (value < 0 || static_cast<size_t>(value) + a.static_bytes > kSharedOptInLimit) {
        return runtime_fail(cudaErrorInvalidValue,
                            "cudaFuncSetAttribute(cudaFuncAttributeMaxDynamicSharedMemorySize, " +
                                std::to_string(value) + "): with the kernel's " + std::to_string(a.static_bytes) +
                                " bytes of static shared memory it passes the " + std::to_string(kSharedOptInLimit) +
                                " bytes (227 KiB) an H100 block may opt in to");
      }
      a.max_dynamic = static_cast<size_t>(value);
      return cudaSuccess;
    case cudaFuncAttributePreferredSharedMemoryCarveout:
      if (value < -1 || value > 100) {
        return runtime_fail(cudaErrorInvalidValue,
                            "cudaFuncSetAttribute(cudaFuncAttributePreferredSharedMemoryCarveout, " +
                                std::to_string(value) + "): a percentage in [0, 100], or -1");
      }
      a.carveout = value;   // a hint to the hardware's L1 / shared split; nothing to emulate
      return cudaSuccess;
    default:
      return runtime_fail(cudaErrorInvalidValue, "cudaFuncSetAttribute: attribute " +
                                                     std::to_string(static_cast<int>(attr)) +
                                                     " is not modelled by the emulated device");
  }
}

cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* out, const void* func) {
  MINIDL_EMU_STICKY();
  if (out == nullptr || func == nullptr) return runtime_fail(cudaErrorInvalidValue, "cudaFuncGetAttributes: NULL");
  Registry& r = reg();
  std::lock_guard<std::mutex> lock(r.mu);
  const Attributes a = r.kernels.count(func) != 0 ? r.kernels[func] : Attributes{};
  *out = cudaFuncAttributes{};
  out->sharedSizeBytes = a.static_bytes;   // as far as the emulator has seen it run
  out->maxThreadsPerBlock = 1024;
  out->ptxVersion = 90;
  out->binaryVersion = 90;
  out->maxDynamicSharedSizeBytes = static_cast<int>(a.max_dynamic);
  out->preferredShmemCarveout = a.carveout;
  return cudaSuccess;
}

}  // extern "C"
