// What the CUDA kernels allocate besides their outputs, from the decisions the kernels themselves
// take (each function is defined next to its kernel and used by it): the meta device's model of
// a GPU (kernels/meta/cuda_model.cpp) allocates exactly this. A plain C++ header, so the host code
// of minidl can call it in any CUDA build (the nvcc one and the emulated device's).
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "core/backend.h"

namespace minidl::cuda {

// context.cu: cuBLAS's workspace, drawn from the caching allocator at a device's first GEMM (a run
// draws it before its model: DeviceServices::draw_library_workspaces) and held until the device
// context goes.
size_t cublas_workspace_bytes();

// matmul.cu: whether a (first) and b (second) are copied to contiguous memory before the GEMM.
std::pair<bool, bool> matmul_operand_copies(const Tensor& a, const Tensor& b);

// conv.cu: the workspace sizes the convolution tries, in order, until one fits the allocator: the
// execution plans of the shape's heuristic-mode plan list (conv_graph.cu: cuDNN's heuristics and
// fallback engines under the current math, determinism and layout switches, each plan's exact
// workspace) on device 0's handle, so it needs a GPU or the emulated device. Benchmark mode's
// autotuning (timed, so unknown in advance) is not part of it. Without a GPU (a plan made on a
// machine that has none) there is no handle to ask: the workspace-free engines.
enum class ConvDir { Forward, BackwardData, BackwardFilter };
// channels_last: the operands are channels-last tensors (NHWC descriptors, no transposes).
// add: the data gradient added into the gradient waiting for a residual join (beta = 1: its own plan).
std::vector<size_t> conv_workspace_candidates(ConvDir dir, const Shape& x, const Shape& w, const Shape& y,
                                              const Conv2dOptions& o, DType dtype, bool channels_last = false,
                                              bool add = false);
// runtime.cu: convolutions run in NHWC (each operand copied to channels-last and back).
bool conv_nhwc();

// batch_norm.cu, batch_norm_backward.cu: the temporaries of one batch-norm pass, plain or fused
// (batch_norm_relu, batch_norm_add_relu), allocated in this order. The forward makes save_mean and
// save_invstd itself when it computes statistics the caller does not keep, then (training) the
// per-block partial sums; the backward, when it sums, the partial sums and the per-channel
// coefficients. The number of blocks per channel comes from the launch geometry (layout, vector
// width, which depends on the operands' addresses, and batch_norm_split), so the operands are
// passed as the kernel receives them.
struct BatchNormScratch {
  bool make_mean = false, make_invstd = false;   // forward: temporaries of `stats` elements
  int64_t stats = 0;
  DType stats_dtype = DType::f32;
  int64_t partials = 0;       // f64 elements (blocks x C x 2); 0: none
  int64_t coefficients = 0;   // backward: f64 elements (C x 2); 0: none
};
BatchNormScratch batch_norm_forward_scratch(const Tensor& x, const Tensor& residual, const Tensor& y, bool training,
                                            bool keeps_mean, bool keeps_invstd);
BatchNormScratch batch_norm_backward_scratch(const Tensor& gy, const Tensor& x, const Tensor& y, const Tensor& gx,
                                             const Tensor& gresidual, bool training, bool wants_gweight,
                                             bool wants_gbias);

// reduce.cu: the partials of a reduction split across blocks (few outputs, many elements each);
// 0 when each output is one block's.
size_t reduce_scratch_bytes(const Tensor& x, const std::vector<int64_t>& dims);

// amp.cu: the chunk table of the fused unscale (bytes; 0 when no gradient has elements). Strided
// gradients are unscaled in contiguous copies besides.
size_t unscale_table_bytes(const std::vector<Tensor>& grads);

// optim_fused.cu: the chunk table of a fused optimizer step, or nullopt when the group does not
// qualify (the optimizer then runs its per-tensor path).
std::optional<size_t> fused_sgd_table_bytes(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                                            const std::vector<Tensor>& momentum_bufs,
                                            const std::vector<uint8_t>& fresh, const SgdHyper& h);
std::optional<size_t> fused_adam_table_bytes(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                                             const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                                             const std::vector<Tensor>& max_exp_avg_sq,
                                             const std::vector<int64_t>& steps, const AdamHyper& h);

// conv_stats.cu: what a conv2d_stats call (core/conv_bn.h) allocates when it runs cuDNN's fused
// graphs: each graph's plan workspaces in the order they are tried until one fits, and the
// backward's scratch. nullopt when the call answers false and the op composes (conv_stats_support.h's
// rule does not hold, or the library refuses a graph at planning). Planned on device 0's handle
// (tensors from the allocator are 16-byte aligned); without a GPU to ask (a plan for a GPU made on
// a machine that has none), the graphs are taken to fuse with workspace-free engines.
std::optional<std::vector<size_t>> conv_stats_forward_workspaces(const Tensor& x, const Tensor& in_scale,
                                                                 const Tensor& in_bias, const Tensor& w,
                                                                 const Conv2dOptions& o, const Tensor& y,
                                                                 const Tensor& sum, const Tensor& sumsq);
struct ConvStatsBackward {
  std::vector<size_t> wgrad;   // the filter gradient's graph (empty: gw not wanted)
  std::vector<size_t> dgrad;   // the data-side graph (empty: none of gx, gscale, gbias wanted)
  bool scratch = false;        // the [7, C] f32 per-channel operands of the data-side graph
  bool makes_dr = false;       // dr, activation-shaped in x's dtype, when gx is not wanted
};
std::optional<ConvStatsBackward> conv_stats_backward_plan(const Tensor& gy, const Tensor& x, const Tensor& in_scale,
                                                          const Tensor& in_bias, const Tensor& w,
                                                          const Conv2dOptions& o, const Tensor& gx,
                                                          const Tensor& gscale, const Tensor& gbias, const Tensor& gw);

// The queries above as one table, which minidl::cuda registers with the backend registry
// (kernels/registry.h, CudaEntry::workspace): the meta device standing for a GPU
// (kernels/meta/cuda_model.cpp) lives in minidl::core, which links no CUDA library.
struct WorkspaceQueries {
  decltype(&cuda::cublas_workspace_bytes) cublas_workspace_bytes;
  decltype(&cuda::matmul_operand_copies) matmul_operand_copies;
  decltype(&cuda::conv_workspace_candidates) conv_workspace_candidates;
  decltype(&cuda::conv_nhwc) conv_nhwc;
  decltype(&cuda::batch_norm_forward_scratch) batch_norm_forward_scratch;
  decltype(&cuda::batch_norm_backward_scratch) batch_norm_backward_scratch;
  decltype(&cuda::reduce_scratch_bytes) reduce_scratch_bytes;
  decltype(&cuda::unscale_table_bytes) unscale_table_bytes;
  decltype(&cuda::fused_sgd_table_bytes) fused_sgd_table_bytes;
  decltype(&cuda::fused_adam_table_bytes) fused_adam_table_bytes;
  decltype(&cuda::conv_stats_forward_workspaces) conv_stats_forward_workspaces;
  decltype(&cuda::conv_stats_backward_plan) conv_stats_backward_plan;
};

}  // namespace minidl::cuda
