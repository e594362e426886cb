// The CUDA backend's entry in the registry (kernels/registry.h): defining minidl_cuda_entry is all
// it takes for backend(DeviceType::CUDA) to find this backend in a program that links minidl::cuda.
#include "kernels/cuda/runtime.h"
#include "kernels/registry.h"

extern "C" const minidl::detail::CudaEntry* minidl_cuda_entry() {
  static const minidl::detail::CudaEntry entry{&minidl::cuda::device_count, &minidl::cuda::runtime_status,
                                               &minidl::cuda::cuda_backend};
  return &entry;
}
