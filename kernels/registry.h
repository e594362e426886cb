// How the CUDA backend joins the registry of kernels/registry.cpp without the CPU library knowing
// it: minidl::cuda (kernels/cuda/register.cu) defines minidl_cuda_entry(); minidl::core only
// declares it weak, so a program that does not link minidl::cuda has no CUDA backend and no CUDA
// library. minidl::cuda's link options name the symbol (--undefined), so a static link keeps it.
#pragma once
#include <string>

namespace minidl {
class Backend;
namespace cuda {
struct WorkspaceQueries;   // kernels/cuda/workspace.h
}

namespace detail {
struct CudaEntry {
  int (*device_count)();             // 0 on any error
  std::string (*runtime_status)();   // "2 devices" or the runtime's error string
  Backend& (*backend)();
  const cuda::WorkspaceQueries* workspace;   // the temporaries' sizes, for meta:cuda
};
}  // namespace detail

// The CUDA backend's workspace queries, or nullptr in a program without minidl::cuda.
const cuda::WorkspaceQueries* cuda_workspace_queries();
}  // namespace minidl

extern "C" const minidl::detail::CudaEntry* minidl_cuda_entry();
