// conv2d_stats (core/conv_bn.h) on the GPU: the convolutions that carry batch norm, as cuDNN's
// fused graphs (docs/conv_bn.md). Until those graphs are built here, both calls answer false and
// the op runs its composition of this backend's convolution and elementwise kernels.
#include "kernels/cuda/cuda_backend.cuh"

namespace minidl::cuda {

bool CudaBackend::conv2d_stats_forward(const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                       const Conv2dOptions&, const Tensor&, const Tensor&, const Tensor&) {
  return false;
}

bool CudaBackend::conv2d_stats_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&,
                                        const Conv2dOptions&, const Tensor&, const Tensor&, const Tensor&,
                                        const Tensor&) {
  return false;
}

}  // namespace minidl::cuda
