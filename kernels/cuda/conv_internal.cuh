// What the two cuDNN paths of the convolutions share: conv.cu (the tensor entry points) calls the
// path the switch picks, conv_graph.cu (cuDNN's graph API through cudnn-frontend: the default) or
// conv_legacy.cu (the legacy cudnnConvolution* API, kept only to measure one against the other:
// conv_api.h). Both plan once per shape and draw their workspaces from the caching allocator.
#pragma once
#include <cstddef>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include "kernels/cuda/conv.cuh"
#include "kernels/cuda/plan_cache.h"
#include "kernels/cuda/workspace.h"

namespace minidl::cuda {

// Runs one direction through the graph API: a, b are (x, w) forward, (dy, w) data gradient,
// (x, dy) filter gradient; add: out += the result (beta = 1) instead of out = it.
void graph_conv_run(DeviceContext& ctx, const ConvShape& cs, ConvDir dir, const void* a, const void* b, void* out,
                    bool add);
// The workspaces graph_conv_run tries, in order, for the heuristic-mode plan of the shape.
std::vector<size_t> graph_conv_workspaces(const ConvShape& cs, ConvDir dir, bool add);
size_t graph_conv_plan_count();
void graph_conv_clear_plans();

// The same through the legacy API (conv_legacy.cu).
void legacy_conv_run(DeviceContext& ctx, const ConvShape& cs, ConvDir dir, const void* a, const void* b, void* out,
                     bool add);
std::vector<size_t> legacy_conv_workspaces(const ConvShape& cs, ConvDir dir);
size_t legacy_conv_plan_count();
void legacy_conv_clear_plans();

// The fused convolution + batch-norm graphs' plans (conv_stats.cu), one entry per graph and shape.
size_t conv_stats_plan_count();
void conv_stats_clear_plans();

// cuDNN's data type of a convolution's tensors, for both paths.
inline cudnnDataType_t cudnn_data_type(DType t) {
  switch (t) {
    case DType::f32: return CUDNN_DATA_FLOAT;
    case DType::f64: return CUDNN_DATA_DOUBLE;
    case DType::f16: return CUDNN_DATA_HALF;
    case DType::bf16: return CUDNN_DATA_BFLOAT16;
    default: MINIDL_FAIL("conv2d (cuda): dtype ", dtype_name(t), " is not supported (f32, f64, f16, bf16)");
  }
}

// The convolution's element count of the x-shaped tensor, in bytes (the scratch output that
// autotuning times into when the call adds into its output).
inline size_t x_bytes(const ConvShape& cs) { return static_cast<size_t>(cs.n * cs.c * cs.h * cs.w) * dtype_size(cs.dtype); }

// Autotuning's device buffers, for both paths: with out_bytes > 0 a scratch output of that size
// (the call adds into its output, and the trials write their results), and the largest workspace of
// at most `want` bytes that the memory budget allows, halving until one fits (conv.cu).
struct TuningBuffers {
  std::unique_ptr<DeviceBuffer> scratch_out, workspace;
  size_t workspace_bytes = 0;
};
TuningBuffers tuning_buffers(DeviceContext& ctx, size_t out_bytes, size_t want);

// What the launch timer files a direction under (launch_timer.cuh; the step-time model keys the
// emulated cuDNN's calls the same way).
inline const char* timer_name(ConvDir dir) {
  return dir == ConvDir::Forward       ? "cuDNN conv forward"
         : dir == ConvDir::BackwardData ? "cuDNN conv backward data"
                                        : "cuDNN conv backward filter";
}

}  // namespace minidl::cuda
