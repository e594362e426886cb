// Picks the backend of a device type. The CUDA backend is linked only in CUDA builds; asking for
// it elsewhere throws an error that says how to get one.
#include "core/backend.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/meta/meta_backend.h"

#ifdef MINIDL_WITH_CUDA
#include "kernels/cuda/runtime.h"
#endif

namespace minidl {

bool cuda_built() {
#ifdef MINIDL_WITH_CUDA
  return true;
#else
  return false;
#endif
}

int cuda_device_count() {
#ifdef MINIDL_WITH_CUDA
  return cuda::device_count();
#else
  return 0;
#endif
}

bool cuda_available() { return cuda_device_count() > 0; }

Backend& backend(DeviceType t) {
  if (t == DeviceType::CPU) return cpu::cpu_backend();
  if (t == DeviceType::Meta) return meta::meta_backend();
#ifdef MINIDL_WITH_CUDA
  MINIDL_CHECK(cuda::device_count() > 0, "CUDA device requested but none is usable: ", cuda::runtime_status(),
               ". Use the cpu device (--device cpu) on this machine");
  return cuda::cuda_backend();
#else
  MINIDL_FAIL("CUDA device requested, but this build of minidl has no CUDA backend (configured with "
              "MINIDL_CUDA=OFF, or nvcc/cuDNN were not found). Rebuild with -DMINIDL_CUDA=ON on a machine with the "
              "CUDA toolkit and cuDNN, or use the cpu device (--device cpu)");
#endif
}

}  // namespace minidl
