// The CUDA backend's entry in the registry (kernels/registry.h): defining minidl_cuda_entry is all
// it takes for backend(DeviceType::CUDA) to find this backend in a program that links minidl::cuda.
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/workspace.h"
#include "kernels/registry.h"

extern "C" const minidl::detail::CudaEntry* minidl_cuda_entry() {
  namespace c = minidl::cuda;
  static const c::WorkspaceQueries queries{&c::cublas_workspace_bytes,     &c::matmul_operand_copies,
                                           &c::conv_workspace_candidates,  &c::conv_nhwc,
                                           &c::batch_norm_forward_scratch, &c::batch_norm_backward_scratch,
                                           &c::reduce_scratch_bytes,       &c::unscale_table_bytes,
                                           &c::fused_sgd_table_bytes,
                                           &c::fused_adam_table_bytes,
                                           &c::conv_stats_forward_workspaces,
                                           &c::conv_stats_backward_plan};
  static const minidl::detail::CudaEntry entry{&c::device_count, &c::runtime_status, &c::cuda_backend, &queries};
  return &entry;
}
