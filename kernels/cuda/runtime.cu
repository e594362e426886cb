// Device discovery through the CUDA runtime. On machines without a usable driver
// cudaGetDeviceCount fails (e.g. "driver version is insufficient"); that is reported, not thrown.
#include <cuda_runtime.h>

#include "kernels/cuda/runtime.h"

namespace minidl::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    return 0;
  }
  return n;
}

std::string runtime_status() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(e);
  }
  return std::to_string(n) + (n == 1 ? " device" : " devices");
}

}  // namespace minidl::cuda
