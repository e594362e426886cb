// Picks the backend of a device type (core/backend.h declares backend(); this is its definition,
// linked into the same library). The CPU backend is always here; the CUDA backend is whatever
// minidl::cuda registered (kernels/registry.h), and asking for it without one throws an error
// that says how to get one.
#include "kernels/registry.h"

#include "core/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/meta/meta_backend.h"

// Weak: resolved when minidl::cuda is linked, null otherwise.
extern "C" const minidl::detail::CudaEntry* minidl_cuda_entry() __attribute__((weak));

namespace minidl {
namespace {
const detail::CudaEntry* cuda_entry() { return minidl_cuda_entry != nullptr ? minidl_cuda_entry() : nullptr; }
}  // namespace

bool cuda_built() { return cuda_entry() != nullptr; }

const cuda::WorkspaceQueries* cuda_workspace_queries() {
  const detail::CudaEntry* e = cuda_entry();
  return e != nullptr ? e->workspace : nullptr;
}

int cuda_device_count() {
  const detail::CudaEntry* e = cuda_entry();
  return e != nullptr ? e->device_count() : 0;
}

bool cuda_available() { return cuda_device_count() > 0; }

Backend& backend(DeviceType t) {
  if (t == DeviceType::CPU) return cpu::cpu_backend();
  if (t == DeviceType::Meta) return meta::meta_backend();
  const detail::CudaEntry* e = cuda_entry();
  MINIDL_CHECK(e != nullptr,
               "CUDA device requested, but this program has no CUDA backend: it links minidl::core only, or minidl "
               "was configured with MINIDL_CUDA=OFF (or nvcc/cuDNN were not found). Link minidl::cuda "
               "(find_package(minidl COMPONENTS cuda)) from a CUDA build of minidl, or use the cpu device (--device cpu)");
  MINIDL_CHECK(e->device_count() > 0, "CUDA device requested but none is usable: ", e->runtime_status(),
               ". Use the cpu device (--device cpu) on this machine");
  return e->backend();
}

}  // namespace minidl
