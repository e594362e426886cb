// The CUDA convolutions' tensor entry points (forward, data gradient, filter gradient, and the data
// gradient added into the one waiting for a residual join), on NCHW tensors or on channels-last ones
// (NHWC descriptors over the tensors' own memory, filters KRSC: no transposes; see docs/cuda/backend.md
// "Channels-last end to end"). cuDNN runs them through its graph API (conv_graph.cu: one execution
// plan per shape), or through the legacy API when conv_api.h's switch asks for it (conv_legacy.cu),
// kept only to measure the two against each other.
#include <cstdlib>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "kernels/cuda/conv_api.h"
#include "kernels/cuda/conv_internal.cuh"
#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/runtime.h"

namespace minidl::cuda {
namespace {

// The API picked at start-up: MINIDL_CUDNN_API=legacy (conv_api.h), else the graph API.
CudnnApi& api_switch() {
  static CudnnApi api = [] {
    const char* env = std::getenv("MINIDL_CUDNN_API");
    if (env == nullptr || std::string(env).empty() || std::string(env) == "graph") return CudnnApi::Graph;
    MINIDL_CHECK(std::string(env) == "legacy", "MINIDL_CUDNN_API=", env, ": expected graph (the default) or legacy");
    return CudnnApi::Legacy;
  }();
  return api;
}

void run(DeviceContext& ctx, const ConvShape& cs, ConvDir dir, const void* a, const void* b, void* out,
         bool add = false) {
  if (cs.n == 0 || cs.k == 0 || cs.c == 0) return;
  if (cudnn_api() == CudnnApi::Legacy) return legacy_conv_run(ctx, cs, dir, a, b, out, add);
  graph_conv_run(ctx, cs, dir, a, b, out, add);
}

// channels_last: the tensors are channels-last (NHWC descriptors on their own memory, filters
// KRSC); otherwise set_conv_nhwc's transposing mode may still ask for NHWC descriptors.
ConvShape shape_of(const Shape& xshape, DType dtype, const Shape& wshape, const Shape& yshape, const Conv2dOptions& o,
                   bool channels_last) {
  MINIDL_CHECK(xshape.size() == 4 && wshape.size() == 4 && yshape.size() == 4, "conv2d (cuda): expected 4-d x, w, y, got ",
               shape_str(xshape), ", ", shape_str(wshape), ", ", shape_str(yshape));
  ConvShape cs;
  cs.n = xshape[0];
  cs.c = xshape[1];
  cs.h = xshape[2];
  cs.w = xshape[3];
  cs.k = wshape[0];
  cs.r = wshape[2];
  cs.s = wshape[3];
  cs.oh = yshape[2];
  cs.ow = yshape[3];
  cs.o = o;
  cs.dtype = dtype;
  cs.nhwc = channels_last || conv_nhwc();
  return cs;
}
ConvShape shape_of(const Tensor& x, const Shape& wshape, const Shape& yshape, const Conv2dOptions& o,
                   bool channels_last) {
  return shape_of(x.shape(), x.dtype(), wshape, yshape, o, channels_last);
}

// What the copies into and out of channels-last are filed under (device/launch.cuh's LaunchScope):
// the step-time model counts them apart from the other copies.
constexpr const char* kNhwcTranspose = "copy (conv2d NHWC transpose)";

// NCHW (or KCRS) tensor -> a contiguous channels-last copy; and back into an NCHW destination.
Tensor to_nhwc(const Tensor& t) { return t.detach().permute({0, 2, 3, 1}).contiguous(); }
Tensor empty_nhwc(const Shape& nchw, const Tensor& like) {
  return empty({nchw[0], nchw[2], nchw[3], nchw[1]}, {like.dtype(), like.device(), false});
}

}  // namespace

void set_cudnn_api(CudnnApi api) { api_switch() = api; }
CudnnApi cudnn_api() { return api_switch(); }
const char* cudnn_api_name(CudnnApi api) { return api == CudnnApi::Graph ? "graph" : "legacy"; }

void conv_forward_raw(DeviceContext& ctx, const ConvShape& cs, const void* x, const void* w, void* y) {
  run(ctx, cs, ConvDir::Forward, x, w, y);
}
void conv_backward_data_raw(DeviceContext& ctx, const ConvShape& cs, const void* dy, const void* w, void* dx,
                            bool add) {
  run(ctx, cs, ConvDir::BackwardData, dy, w, dx, add);
}
void conv_backward_filter_raw(DeviceContext& ctx, const ConvShape& cs, const void* x, const void* dy, void* dw) {
  run(ctx, cs, ConvDir::BackwardFilter, x, dy, dw);
}

std::vector<size_t> conv_workspace_candidates(ConvDir dir, const Shape& x, const Shape& w, const Shape& y,
                                              const Conv2dOptions& o, DType dtype, bool channels_last, bool add) {
  // No GPU to ask cuDNN on (a plan for a GPU made on a machine without one: minidl-memest --gpu):
  // the workspace-free engines (implicit GEMM in each direction), which every convolution has and
  // to which run() falls back when a faster one's workspace does not fit. So a planned maximum batch
  // is the one where the leanest engines fit, as on the GPU at its limit; docs/memory.md says
  // what a plan assumes.
  if (device_count() == 0) return {0};
  const ConvShape cs = shape_of(x, dtype, w, y, o, channels_last);
  if (cs.n == 0 || cs.k == 0 || cs.c == 0) return {0};   // run() calls no cuDNN
  return cudnn_api() == CudnnApi::Legacy ? legacy_conv_workspaces(cs, dir) : graph_conv_workspaces(cs, dir, add);
}

size_t conv_algo_cache_size() { return graph_conv_plan_count() + legacy_conv_plan_count() + conv_stats_plan_count(); }
void clear_conv_algo_cache() {
  graph_conv_clear_plans();
  legacy_conv_clear_plans();
  conv_stats_clear_plans();
}

void CudaBackend::conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dOptions& o,
                                 const Tensor& y) {
  check_cuda("conv2d", {&x, &w, &bias, &y});
  check_contiguous("conv2d", {&bias});
  const bool cl = check_memory_format("conv2d", {&x, &w, &y});
  MINIDL_CHECK(w.dtype() == x.dtype() && y.dtype() == x.dtype(), "conv2d (cuda): dtypes differ: x ", x.meta(),
               ", w ", w.meta(), ", y ", y.meta());
  DeviceContext& ctx = context_of(x);
  const ConvShape cs = shape_of(x, w.shape(), y.shape(), o, cl);
  if (y.numel() == 0) return;
  if (x.numel() == 0 || w.numel() == 0) {
    fill(y, 0.0);
  } else if (cs.nhwc && !cl) {
    const LaunchScope transposes(kNhwcTranspose);
    const Tensor xn = to_nhwc(x), wn = to_nhwc(w);
    const Tensor yn = empty_nhwc(y.shape(), y);
    conv_forward_raw(ctx, cs, xn.data_ptr(), wn.data_ptr(), yn.data_ptr());
    copy(yn.permute({0, 3, 1, 2}), y);
  } else {
    conv_forward_raw(ctx, cs, x.data_ptr(), w.data_ptr(), y.data_ptr());
  }
  if (bias.defined() && y.numel() > 0) {
    MINIDL_CHECK(bias.dtype() == y.dtype() && bias.numel() == cs.k, "conv2d (cuda): bias ", bias.meta(),
                 " must be [", cs.k, "] of the input's dtype");
    // y += bias[c], broadcast over n, h, w.
    binary(BinaryOp::Add, y, bias.view({1, cs.k, 1, 1}).expand(y.shape()), y, 1.0);
  }
}

void CudaBackend::conv2d_backward_input(const Tensor& gy, const Tensor& w, const Conv2dOptions& o, const Tensor& gx) {
  check_cuda("conv2d_backward_input", {&gy, &w, &gx});
  const bool cl = check_memory_format("conv2d_backward_input", {&gy, &w, &gx});
  DeviceContext& ctx = context_of(gy);
  const ConvShape cs = shape_of(gx, w.shape(), gy.shape(), o, cl);
  if (gy.numel() == 0 || w.numel() == 0) return fill(gx, 0.0);   // nothing flows back
  if (cs.nhwc && !cl) {
    const LaunchScope transposes(kNhwcTranspose);
    const Tensor gyn = to_nhwc(gy), wn = to_nhwc(w);
    const Tensor gxn = empty_nhwc(gx.shape(), gx);
    conv_backward_data_raw(ctx, cs, gyn.data_ptr(), wn.data_ptr(), gxn.data_ptr());
    copy(gxn.permute({0, 3, 1, 2}), gx);
  } else {
    conv_backward_data_raw(ctx, cs, gy.data_ptr(), w.data_ptr(), gx.data_ptr());
  }
}

bool CudaBackend::conv2d_backward_input_add(const Tensor& gy, const Tensor& w, const Conv2dOptions& o,
                                            const Tensor& gx) {
  check_cuda("conv2d_backward_input_add", {&gy, &w, &gx});
  const bool cl = check_memory_format("conv2d_backward_input_add", {&gy, &w, &gx});
  const ConvShape cs = shape_of(gx, w.shape(), gy.shape(), o, cl);
  if (cs.nhwc && !cl) return false;   // set_conv_nhwc's transposes compute into a copy
  if (gy.numel() == 0 || w.numel() == 0) return true;   // nothing flows back: gx stays as it is
  conv_backward_data_raw(context_of(gy), cs, gy.data_ptr(), w.data_ptr(), gx.data_ptr(), /*add=*/true);
  return true;
}

void CudaBackend::conv2d_backward_weight(const Tensor& gy, const Tensor& x, const Conv2dOptions& o, const Tensor& gw) {
  check_cuda("conv2d_backward_weight", {&gy, &x, &gw});
  const bool cl = check_memory_format("conv2d_backward_weight", {&gy, &x, &gw});
  DeviceContext& ctx = context_of(gy);
  const ConvShape cs = shape_of(x, gw.shape(), gy.shape(), o, cl);
  if (gy.numel() == 0 || x.numel() == 0) return fill(gw, 0.0);
  if (cs.nhwc && !cl) {
    const LaunchScope transposes(kNhwcTranspose);
    const Tensor xn = to_nhwc(x), gyn = to_nhwc(gy);
    const Tensor gwn = empty_nhwc(gw.shape(), gw);
    conv_backward_filter_raw(ctx, cs, xn.data_ptr(), gyn.data_ptr(), gwn.data_ptr());
    copy(gwn.permute({0, 3, 1, 2}), gw);
  } else {
    conv_backward_filter_raw(ctx, cs, x.data_ptr(), gy.data_ptr(), gw.data_ptr());
  }
}

TuningBuffers tuning_buffers(DeviceContext& ctx, size_t out_bytes, size_t want) {
  TuningBuffers t;
  if (out_bytes > 0) t.scratch_out = std::make_unique<DeviceBuffer>(ctx, out_bytes);
  const TentativeRequests tentative;   // a smaller workspace is timed instead
  while (true) {
    try {
      t.workspace = std::make_unique<DeviceBuffer>(ctx, want);
      t.workspace_bytes = want;
      return t;
    } catch (const OutOfMemoryError&) {
      if (want == 0) throw;
      want /= 2;   // the budget leaves less: time what fits
    }
  }
}

}  // namespace minidl::cuda
