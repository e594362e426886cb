// The shape-only ("meta") device: tensors with shapes, dtypes and strides but no storage, so a
// training step runs through the same front-ends, autograd, optimizers and recomputation as on a
// real device, computing nothing, while every allocation goes through a model of the real
// allocator. Each kernel allocates and frees the temporaries its real counterpart would, sized by
// the functions the real kernels use (kernels/cpu/workspace.h, kernels/cuda/workspace.h), so the
// dry run's peak allocated and peak reserved are the real ones (docs/memory.md).
#pragma once
#include <memory>
#include <mutex>

#include "core/backend.h"
#include "kernels/common/backend_overrides.h"

namespace minidl::meta {

class MetaBackend final : public Backend {
 public:
  const char* name() const override { return "meta"; }
  // index: the modelled DeviceType. CPU: the host allocator's books without malloc; CUDA: the
  // caching allocator on address ranges (kernels/caching_allocator.h).
  Allocator& allocator(int device_index) override;

  // Every kernel of core/backend.h and what a GPU adds (kernels/common/backend_overrides.h): each
  // allocates what its real counterpart would and computes nothing. conv2d_backward_input_add
  // adds for a model of a GPU, as CudaBackend does, and not for one of the CPU, as the CPU does not.
  MINIDL_BACKEND_KERNELS(MINIDL_DECLARE_OVERRIDE)
  MINIDL_DEVICE_BACKEND_KERNELS(MINIDL_DECLARE_OVERRIDE)
  // The gradient scaler's device state (a graphed run's dry run): as the CUDA backend allocates.
  void unscale_grads_device(const std::vector<Tensor>& grads, const Tensor& scale, const Tensor& found_inf) override;
  void update_scale_device(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                           double growth_factor, double backoff_factor, int64_t growth_interval) override;

  // The CUDA model's cuBLAS workspace: drawn at the first GEMM, or before (draw_library_workspaces),
  // and held, as a device context does.
  void draw_cublas_workspace();
  void draw_library_workspaces(int device_index) override;
  bool release_library_workspaces(int device_index) override;

  // A CUDA graph on the model of a GPU (meta:cuda): `work` runs with the caching allocator's
  // private pool current, as a capture does, so the pool's segments count in reserved bytes and
  // the budget while the graph lives; a replay allocates nothing and computes nothing. The model
  // of the CPU has no graphs, as the CPU has none.
  std::unique_ptr<Graph> capture_graph(int device_index, const std::function<void()>& work,
                                       const Graph* share_pool = nullptr) override;
  bool capturing(int device_index) override;

 private:
  bool capturing_ = false;
  std::mutex mu_;
  std::unique_ptr<Allocator> cpu_, cuda_;
  void* cublas_ptr_ = nullptr;
};

MetaBackend& meta_backend();

}  // namespace minidl::meta
