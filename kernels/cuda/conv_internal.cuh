// What the two cuDNN paths of the convolutions share: conv.cu (the tensor entry points) calls the
// path the switch picks, conv_graph.cu (cuDNN's graph API through cudnn-frontend: the default) or
// conv_legacy.cu (the legacy cudnnConvolution* API, kept only to measure one against the other:
// conv_api.h). Both plan once per shape and draw their workspaces from the caching allocator.
#pragma once
#include <cstddef>
#include <vector>

#include "kernels/cuda/conv.cuh"
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

// The convolution's element count of the x-shaped tensor, in bytes (the scratch output that
// autotuning times into when the call adds into its output).
inline size_t x_bytes(const ConvShape& cs) { return static_cast<size_t>(cs.n * cs.c * cs.h * cs.w) * dtype_size(cs.dtype); }

// What the launch timer files a direction under (launch_timer.cuh; the step-time model keys the
// emulated cuDNN's calls the same way).
inline const char* timer_name(ConvDir dir) {
  return dir == ConvDir::Forward       ? "cuDNN conv forward"
         : dir == ConvDir::BackwardData ? "cuDNN conv backward data"
                                        : "cuDNN conv backward filter";
}

}  // namespace minidl::cuda
