// The CUDA backend: every op family of core/backend.h on the GPU, checked against the CPU backend
// by tests/kernels/backend_parity_cuda_test.cpp. Each family lives in its own .cu file
// (elementwise, reduce, matmul, random, conv, pool, batch_norm, softmax, loss, amp, optim_fused);
// this header gathers them.
#pragma once
#include "core/backend.h"
#include "kernels/common/backend_overrides.h"
#include "kernels/common/checks.h"

namespace minidl::cuda {

class CudaBackend final : public Backend {
 public:
  const char* name() const override { return "cuda"; }
  Allocator& allocator(int device_index) override;

  // Every kernel of core/backend.h, one .cu file per family, and what a GPU adds
  // (kernels/common/backend_overrides.h). The fused optimizer steps (optim_fused.cu) take groups of
  // contiguous f32 parameters in one launch and return false for anything else.
  MINIDL_BACKEND_KERNELS(MINIDL_DECLARE_OVERRIDE)
  MINIDL_DEVICE_BACKEND_KERNELS(MINIDL_DECLARE_OVERRIDE)

  // amp.cu: one launch over all gradients.
  void unscale_grads_device(const std::vector<Tensor>& grads, const Tensor& scale, const Tensor& found_inf) override;
  void update_scale_device(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                           double growth_factor, double backoff_factor, int64_t growth_interval) override;
  // graph.cu: stream capture into a graph with a private memory pool.
  std::unique_ptr<Graph> capture_graph(int device_index, const std::function<void()>& work,
                                       const Graph* share_pool = nullptr) override;
  bool capturing(int device_index) override;
  // graph.cu: the device context's cuBLAS handle and its workspace.
  void draw_library_workspaces(int device_index) override;
  bool release_library_workspaces(int device_index) override;
  // pinned.cu: page-locked host memory (cudaHostAlloc) for the loader's batches.
  void synchronize(int device_index) override;
  void* pinned_alloc(size_t bytes) override;
  void pinned_free(void* p) override;
  // pinned.cu: the copies queued on the device's copy stream (cuda::AsyncCopy).
  std::unique_ptr<CopyHandle> copy_async(const std::vector<std::pair<const void*, Tensor>>& copies) override;
  // runtime.cu: CUDA events around intervals (cuda::EventTimer).
  std::unique_ptr<IntervalTimer> interval_timer(int device_index, std::string* why) override;
 private:
  // amp.cu: the one unscale pass; 1/scale from the host (scale == nullptr) or from the device.
  void unscale(const std::vector<Tensor>& grads, double inv_scale, const float* scale, const Tensor& found_inf);
};

// Checks shared by the families: on this backend's device, and (for kernels that need it) contiguous.
void check_cuda(const char* op, std::initializer_list<const Tensor*> ts);
inline void check_contiguous(const char* op, std::initializer_list<const Tensor*> ts) {
  common::check_contiguous("cuda", op, ts);
}
// The memory format of a call over 4-d operands: channels-last when any defined operand is
// (prefers_channels_last), and then every one must be is_channels_last; else all contiguous.
bool check_memory_format(const char* op, std::initializer_list<const Tensor*> ts);

}  // namespace minidl::cuda
