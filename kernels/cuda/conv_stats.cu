// conv2d_stats (core/conv_bn.h) on the GPU: the convolutions that carry batch norm, as cuDNN's
// fused graphs (docs/conv_bn.md), built with cudnn-frontend's operation builders as conv_graph.cu
// builds its single convolutions:
// - forward, scale_bias_relu_conv_genstats: MUL(x, scale) -> ADD(bias) -> RELU_FWD -> conv_fwd(., w)
//   -> y, GEN_STATS(y) -> sum, sumsq (without in_scale: conv_fwd -> y -> GEN_STATS);
// - backward, dgrad_drelu_dbn_weight: conv_dgrad(gy, w), the ReLU's backward against the
//   pre-activation x * scale + bias (as SUB(x, 0) -> MUL(1) -> MUL(scale) -> ADD(bias)) into dr,
//   BN_BWD_WEIGHTS(x, dr, mean 0, inv_std 1, scale) -> gscale = sum(dr * x), gbias = sum(dr); then
//   gx = dr * in_scale per channel (a kernel here);
// - scale_bias_relu_wgrad: the forward's prologue feeding conv_wgrad -> gw.
// Where conv_stats_support.h's rule does not hold (NCHW, f64, groups, no in_scale in the backward)
// or the library refuses a graph at planning, the call answers false and the op composes.
// One plan per graph and shape, cached (in benchmark mode timed once on the first call's operands,
// the fastest first, as the single convolutions are); workspaces from the caching allocator.
#include "core/allocator.h"
#include "kernels/cuda/frontend.h"

#include <algorithm>
#include <array>
#include <initializer_list>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/conv_engines.cuh"
#include "kernels/cuda/conv_internal.cuh"
#include "kernels/cuda/conv_stats_support.h"
#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/device/common.cuh"
#include "kernels/cuda/device/fast_div.h"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/workspace.h"

namespace minidl::cuda {
namespace {

namespace fe = cudnn_frontend;

enum class FusedGraph : int64_t { Forward, ForwardPlain, DgradDreluDbn, Wgrad };
enum Uid : int64_t { X = 1, W, Y, DY, DR, DW, S, B, M, V, SUM, SQ, DS, DB, EQ_DY, EQ_X, EQ_B, T1 = 100, T2, T3, T4, T5 };

using Key = std::array<int64_t, 22>;
Key key_of(FusedGraph g, const ConvShape& cs, int64_t align, int device, bool benchmark) {
  return {static_cast<int64_t>(g), cs.n, cs.c, cs.h, cs.w, cs.k, cs.r, cs.s, cs.oh, cs.ow, cs.o.padding[0],
          cs.o.padding[1], cs.o.stride[0], cs.o.stride[1], cs.o.dilation[0], cs.o.dilation[1],
          static_cast<int64_t>(cs.dtype), align, device, allow_tf32_cudnn(), cudnn_deterministic(), benchmark};
}

const char* graph_name(FusedGraph g) {
  return g == FusedGraph::Forward        ? "scale_bias_relu_conv_genstats"
         : g == FusedGraph::ForwardPlain ? "conv_genstats"
         : g == FusedGraph::DgradDreluDbn ? "dgrad_drelu_dbn_weight"
                                          : "scale_bias_relu_wgrad";
}

// No candidate: the library refused the graph (the call answers false and the op composes).
using FusedPlan = std::shared_ptr<const std::vector<Candidate>>;

PlanCache<Key, FusedPlan>& plans() {
  static auto* m = new PlanCache<Key, FusedPlan>();   // outlives static destruction
  return *m;
}

// The tensors of a graph: data NHWC (filters KRSC), per-channel [1, C, 1, 1] f32, virtual f32
// intermediates.
struct Tensors {
  const ConvShape& cs;
  int64_t align;
  fe::Tensor make(int64_t uid, int64_t d0, int64_t d1, int64_t d2, int64_t d3, cudnnDataType_t dt, bool virt) const {
    const int64_t dims[4] = {d0, d1, d2, d3}, st[4] = {d1 * d2 * d3, 1, d3 * d1, d1};
    return fe::TensorBuilder().setDim(4, dims).setStride(4, st).setId(uid).setAlignment(align).setDataType(dt)
        .setVirtual(virt).build();
  }
  fe::Tensor xs(int64_t uid, bool virt = false) const {
    return make(uid, cs.n, cs.c, cs.h, cs.w, virt ? CUDNN_DATA_FLOAT : cudnn_data_type(cs.dtype), virt);
  }
  fe::Tensor ys(int64_t uid) const { return make(uid, cs.n, cs.k, cs.oh, cs.ow, cudnn_data_type(cs.dtype), false); }
  fe::Tensor ws(int64_t uid) const { return make(uid, cs.k, cs.c, cs.r, cs.s, cudnn_data_type(cs.dtype), false); }
  fe::Tensor channel(int64_t uid, int64_t c) const { return make(uid, 1, c, 1, 1, CUDNN_DATA_FLOAT, false); }
};

fe::Operation pointwise(cudnnPointwiseMode_t mode, const fe::Tensor& x, const fe::Tensor* b, const fe::Tensor& y) {
  fe::OperationBuilder ob(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR);
  ob.setxDesc(x).setyDesc(y).setpwDesc(fe::PointWiseDescBuilder().setMode(mode).setComputeType(CUDNN_DATA_FLOAT).build());
  if (b != nullptr) ob.setbDesc(*b);
  return ob.build();
}

fe::ConvDesc conv_desc(const ConvShape& cs) {
  const int64_t pad[2] = {cs.o.padding[0], cs.o.padding[1]}, stride[2] = {cs.o.stride[0], cs.o.stride[1]};
  const int64_t dil[2] = {cs.o.dilation[0], cs.o.dilation[1]};
  return fe::ConvDescBuilder().setComputeType(CUDNN_DATA_FLOAT).setMathMode(CUDNN_CROSS_CORRELATION)
      .setSpatialDimCount(2).setSpatialStride(2, stride).setPrePadding(2, pad).setPostPadding(2, pad)
      .setDilation(2, dil).build();
}

// The operations of one fused graph, in order.
std::vector<fe::Operation> build_ops(FusedGraph g, const ConvShape& cs, int64_t align) {
  const Tensors t{cs, align};
  std::vector<fe::Operation> ops;
  const fe::Tensor s = t.channel(S, cs.c), b = t.channel(B, cs.c);
  // The prologue relu(x * scale + bias) into the virtual tensor act (forward and wgrad).
  const auto prologue = [&](const fe::Tensor& x, const fe::Tensor& act) {
    const fe::Tensor t1 = t.xs(T1, true), t2 = t.xs(T2, true);
    ops.push_back(pointwise(CUDNN_POINTWISE_MUL, x, &s, t1));
    ops.push_back(pointwise(CUDNN_POINTWISE_ADD, t1, &b, t2));
    ops.push_back(pointwise(CUDNN_POINTWISE_RELU_FWD, t2, nullptr, act));
  };
  const fe::Tensor x = t.xs(X), act = t.xs(T3, true);
  if (g == FusedGraph::Forward || g == FusedGraph::ForwardPlain) {
    const fe::Tensor y = t.ys(Y);
    if (g == FusedGraph::Forward) prologue(x, act);
    ops.push_back(fe::OperationBuilder(CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR)
                      .setxDesc(g == FusedGraph::Forward ? act : x).setwDesc(t.ws(W)).setyDesc(y)
                      .setcDesc(conv_desc(cs)).setAlpha(1.0f).setBeta(0.0f).build());
    ops.push_back(fe::OperationBuilder(CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR)
                      .setxDesc(y).setSumDesc(t.channel(SUM, cs.k)).setSqSumDesc(t.channel(SQ, cs.k))
                      .setGenStatsMode(CUDNN_GENSTATS_SUM_SQSUM).setMathPrecision(CUDNN_DATA_FLOAT).build());
  } else if (g == FusedGraph::Wgrad) {
    prologue(x, act);
    ops.push_back(fe::OperationBuilder(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR)
                      .setxDesc(act).setdwDesc(t.ws(DW)).setdyDesc(t.ys(DY)).setcDesc(conv_desc(cs)).setAlpha(1.0f)
                      .setBeta(0.0f).build());
  } else {
    const fe::Tensor m = t.channel(M, cs.c), v = t.channel(V, cs.c), dgrad = t.xs(T1, true);
    const fe::Tensor t2 = t.xs(T2, true), t3 = t.xs(T3, true), t4 = t.xs(T4, true), pre = t.xs(T5, true);
    const fe::Tensor dr = t.xs(DR);
    ops.push_back(fe::OperationBuilder(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR)
                      .setdxDesc(dgrad).setwDesc(t.ws(W)).setdyDesc(t.ys(DY)).setcDesc(conv_desc(cs)).setAlpha(1.0f)
                      .setBeta(0.0f).build());
    ops.push_back(pointwise(CUDNN_POINTWISE_SUB, x, &m, t2));
    ops.push_back(pointwise(CUDNN_POINTWISE_MUL, t2, &v, t3));
    ops.push_back(pointwise(CUDNN_POINTWISE_MUL, t3, &s, t4));
    ops.push_back(pointwise(CUDNN_POINTWISE_ADD, t4, &b, pre));
    ops.push_back(fe::OperationBuilder(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR)
                      .setdyDesc(dgrad).setxDesc(pre).setdxDesc(dr)
                      .setpwDesc(fe::PointWiseDescBuilder().setMode(CUDNN_POINTWISE_RELU_BWD)
                                     .setComputeType(CUDNN_DATA_FLOAT).build())
                      .build());
    ops.push_back(fe::OperationBuilder(CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR)
                      .setxDesc(x).setdyDesc(dr).setSavedMeanAndInvVar(m, v).setScale(s)
                      .setDScaleAndDBias(t.channel(DS, cs.c), t.channel(DB, cs.c))
                      .setEqScalesAndBias(t.channel(EQ_DY, cs.c), t.channel(EQ_X, cs.c), t.channel(EQ_B, cs.c))
                      .setMathPrecision(CUDNN_DATA_FLOAT).build());
  }
  return ops;
}

// The graph's plans (conv_engines.cuh); none when the library refuses the graph.
std::vector<Candidate> build_plans(cudnnHandle_t h, FusedGraph g, const ConvShape& cs, int64_t align) {
  try {
    const std::vector<fe::Operation> ops = build_ops(g, cs, align);
    std::vector<const fe::Operation*> ptrs;
    for (const fe::Operation& op : ops) ptrs.push_back(&op);
    fe::OperationGraph og = fe::OperationGraphBuilder().setHandle(h).setOperationGraph(ptrs.size(), ptrs.data()).build();
    return engine_plans(h, og, cs.dtype, std::numeric_limits<size_t>::max());
  } catch (fe::cudnnException&) {
    return {};   // the graph itself is refused: the op composes
  }
}

using Binds = std::vector<std::pair<int64_t, void*>>;

cudnnStatus_t execute(cudnnHandle_t h, const Candidate& c, const Binds& binds, void* ws) {
  std::vector<int64_t> uids;
  std::vector<void*> ptrs;
  for (const auto& [u, p] : binds) uids.push_back(u), ptrs.push_back(p);
  return execute_plan(h, c, static_cast<int64_t>(binds.size()), ptrs.data(), uids.data(), ws);
}

// The graph's plans for this shape, built on first use. With `binds` (a call's own operands) in
// benchmark mode, the plans are timed on them once and the fastest goes first (conv_engines.cuh);
// every graph's outputs are written whole (beta 0), so the trials leave nothing the call does not
// overwrite. Without binds (the meta device's workspace questions), the heuristics' order.
FusedPlan plan_for(DeviceContext& ctx, FusedGraph g, const ConvShape& cs, int64_t align, const Binds* binds = nullptr) {
  const bool benchmark = binds != nullptr && cudnn_benchmark();
  const Key key = key_of(g, cs, align, ctx.index(), benchmark);
  if (const auto* kept = plans().find(key)) return *kept;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  MINIDL_CUDA_CHECK(cudaStreamIsCapturing(ctx.stream(), &capturing));
  MINIDL_CHECK(capturing == cudaStreamCaptureStatusNone, "conv2d_stats (cuda): the fused graph ", graph_name(g),
               " for x [", cs.n, ", ", cs.c, ", ", cs.h, ", ", cs.w, "] w [", cs.k, ", ", cs.c, ", ", cs.r, ", ", cs.s,
               "] has no cuDNN plan yet and the stream is capturing a CUDA graph; run the step once before capturing "
               "it (a warm-up step plans every shape)");
  std::vector<Candidate> cands = build_plans(ctx.cudnn(), g, cs, align);
  // A single plan is timed too: once per shape, and on the emulated device the trials are the
  // check that the call's binds run.
  if (benchmark && !cands.empty()) {
    size_t largest = 0;
    for (const Candidate& c : cands) largest = std::max(largest, c.workspace);
    const TuningBuffers tb = tuning_buffers(ctx, 0, largest);
    put_fastest_first(ctx, cands, tb.workspace->get(), tb.workspace_bytes,
                      [&](const Candidate& c, void* ws) { return execute(ctx.cudnn(), c, *binds, ws); });
  }
  // Past 2048 shapes the least recently used leave (plan_cache.h).
  return plans().insert(key, std::make_shared<const std::vector<Candidate>>(std::move(cands)), /*max_keys=*/2048);
}

// The alignment every bound tensor allows (conv_engines.cuh's alignment_of, the smallest).
int64_t alignment_of(const Binds& binds) {
  int64_t a = 16;
  for (const auto& bind : binds) a = std::min(a, cuda::alignment_of(bind.second));
  return a;
}

// Runs graph g on the binds: false when the library refuses the graph (nothing was written).
// A plan whose workspace does not fit gives way to the next; none fitting is an OutOfMemoryError.
bool run_fused(DeviceContext& ctx, FusedGraph g, const ConvShape& cs, const Binds& binds) {
  const FusedPlan p = plan_for(ctx, g, cs, alignment_of(binds), &binds);
  if (p->empty()) return false;
  std::string tried;
  for (const Candidate& c : *p) {
    std::unique_ptr<DeviceBuffer> ws;
    try {
      const TentativeRequests tentative;   // a leaner plan follows
      ws = std::make_unique<DeviceBuffer>(ctx, c.workspace);
    } catch (const OutOfMemoryError&) {
      tried += " " + c.plan->getTag() + " (workspace " + format_bytes(c.workspace) + ")";
      continue;
    }
    const cudnnStatus_t st = execute(ctx.cudnn(), c, binds, ws->get());
    if (st == CUDNN_STATUS_SUCCESS) return true;
    tried += " " + c.plan->getTag() + " (" + cudnnGetErrorString(st) + ")";
  }
  const MemoryStats s = ctx.allocator().stats();
  MINIDL_CHECK(tried.find("workspace") != std::string::npos, "conv2d_stats (cuda): no cuDNN plan of the fused graph ",
               graph_name(g), " ran (tried", tried, ")");
  throw OutOfMemoryError("out of memory on cuda:" + std::to_string(ctx.index()) + ": no plan of the fused graph " +
                             graph_name(g) + " has a workspace that fits (tried" + tried +
                             "). Use a smaller batch, or raise the memory budget.",
                         0, static_cast<size_t>(s.reserved_bytes), static_cast<size_t>(s.budget_bytes));
}

ConvShape shape_of(const Tensor& x, const Tensor& w, const Shape& y, const Conv2dOptions& o) {
  ConvShape cs;
  cs.n = x.size(0), cs.c = x.size(1), cs.h = x.size(2), cs.w = x.size(3);
  cs.k = w.size(0), cs.r = w.size(2), cs.s = w.size(3), cs.oh = y[2], cs.ow = y[3];
  cs.o = o, cs.dtype = x.dtype(), cs.nhwc = true;
  return cs;
}

void* ptr(const Tensor& t) { return const_cast<void*>(static_cast<const void*>(t.data_ptr())); }

// The two channels-last elementwise passes of the backward, V consecutive values a thread: 16-byte
// accesses (V = vec_width<T>()) when the channel count is a multiple of V and every pointer is
// 16-byte aligned, so that the V values share one row of channels base .. base + V - 1; V = 1
// otherwise. Scalar f16 accesses move 2 bytes a thread and issue eight times the requests. (The
// per-channel values are read per element from global memory, where the L1 cache serves them.)
struct VecPlan {
  int v = 1;
  int64_t count = 0;   // accesses: numel / v
};

template <typename T>
VecPlan vec_plan(int64_t n, int64_t c, std::initializer_list<const void*> ptrs) {
  constexpr int kV = vec_width<T>();
  bool ok = c % kV == 0;
  for (const void* p : ptrs) ok = ok && (p == nullptr || aligned16(p));
  return ok ? VecPlan{kV, n / kV} : VecPlan{1, n};
}

// The first channel of access i (V values of one row of c channels): (i * V) % c, with a
// multiply-high instead of a 64-bit remainder (dozens of instructions on a GPU) when every access
// index fits FastDiv's range, as it does below 2^31 accesses.
struct ChannelOf {
  FastDiv rows;       // divides by c / V
  int64_t per_row = 1;
  bool fast = false;
  ChannelOf(int64_t c, int v, int64_t count)
      : rows(std::max<int64_t>(1, c / v)), per_row(std::max<int64_t>(1, c / v)), fast(count < FastDiv::kLimit) {}
  template <int V>
  __device__ __forceinline__ int64_t first(int64_t i) const {
    const int64_t q = fast ? static_cast<int64_t>(rows.div(static_cast<uint32_t>(i))) : i / per_row;
    return (i - q * per_row) * V;
  }
};

// Calls f(T{}) with the C++ type of a chain activation's dtype: f16, bf16 or f32 (conv_stats_fused).
template <class F>
void with_activation_type(DType t, F&& f) {
  if (t == DType::f16) f(__half{});
  else if (t == DType::bf16) f(__nv_bfloat16{});
  else f(float{});
}

// x[i] *= scale[c] in place, in f32 and rounded once to T.
template <typename T, int V>
__global__ void scale_channels_kernel(T* x, const float* __restrict__ scale, ChannelOf ch, int64_t nv) {
  MINIDL_GRID_STRIDE(i, nv) {
    Vec<T, V> a = reinterpret_cast<Vec<T, V>*>(x)[i];
    const int64_t base = ch.first<V>(i);
#pragma unroll
    for (int k = 0; k < V; ++k) a.v[k] = cvt<T>(cvt<float>(a.v[k]) * scale[base + k]);
    reinterpret_cast<Vec<T, V>*>(x)[i] = a;
  }
}

void scale_channels(DeviceContext& ctx, const Tensor& x, const Tensor& scale) {
  const int64_t n = x.numel(), c = x.size(1);
  const float* s = static_cast<const float*>(ptr(scale));
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    T* d = static_cast<T*>(ptr(x));
    const VecPlan p = vec_plan<T>(n, c, {d});
    if (p.v > 1)
      MINIDL_LAUNCH_NOWAIT("conv2d_stats gx = dr * scale", (scale_channels_kernel<T, vec_width<T>()>),
                           grid_for(p.count), kThreads, 0, ctx.stream(), d, s, ChannelOf(c, p.v, p.count), p.count);
    else
      MINIDL_LAUNCH_NOWAIT("conv2d_stats gx = dr * scale", (scale_channels_kernel<T, 1>), grid_for(p.count), kThreads,
                           0, ctx.stream(), d, s, ChannelOf(c, 1, p.count), p.count);
  };
  with_activation_type(x.dtype(), launch);
}

// g = gy + gsum[c] + y * (2 * gsumsq[c]), in f32 and rounded once to T; a null gy, gsum or gsumsq
// is zero (y is read only with gsumsq).
template <typename T, int V>
__global__ void output_grad_kernel(const T* gy, const float* __restrict__ gsum, const float* __restrict__ gsumsq,
                                   const T* y, T* g, ChannelOf ch, int64_t nv) {
  MINIDL_GRID_STRIDE(i, nv) {
    Vec<T, V> a{}, b{}, r;
    if (gy != nullptr) a = reinterpret_cast<const Vec<T, V>*>(gy)[i];
    if (gsumsq != nullptr) b = reinterpret_cast<const Vec<T, V>*>(y)[i];
    const int64_t base = ch.first<V>(i);
#pragma unroll
    for (int k = 0; k < V; ++k) {
      float v = gy != nullptr ? cvt<float>(a.v[k]) : 0.0f;
      if (gsum != nullptr) v += gsum[base + k];
      if (gsumsq != nullptr) v += cvt<float>(b.v[k]) * (gsumsq[base + k] * 2.0f);
      r.v[k] = cvt<T>(v);
    }
    reinterpret_cast<Vec<T, V>*>(g)[i] = r;
  }
}

// The graph a forward call runs, or nullopt when it composes (before any planning).
std::optional<FusedGraph> forward_graph(const Tensor& x, const Tensor& in_scale, const Tensor& in_bias, const Tensor& w,
                                        const Conv2dOptions& o, const Tensor& y, const Tensor& sum,
                                        const Tensor& sumsq) {
  if (!conv_stats_fused(x, in_scale, w, o, /*backward=*/false, {&y}) || y.numel() == 0) return std::nullopt;
  if (sum.dtype() != DType::f32 || sumsq.dtype() != DType::f32) return std::nullopt;
  if (in_bias.defined() && !in_bias.is_contiguous()) return std::nullopt;
  return in_scale.defined() ? FusedGraph::Forward : FusedGraph::ForwardPlain;
}

// What a backward call runs (before any planning), or nullopt when it composes.
struct BackwardCall {
  bool wgrad = false, dgrad = false, makes_dr = false;
};
std::optional<BackwardCall> backward_call(const Tensor& gy, const Tensor& x, const Tensor& in_scale,
                                          const Tensor& in_bias, const Tensor& w, const Conv2dOptions& o,
                                          const Tensor& gx, const Tensor& gscale, const Tensor& gbias,
                                          const Tensor& gw) {
  if (!conv_stats_fused(x, in_scale, w, o, /*backward=*/true, {&gy, &gx}) || gy.numel() == 0) return std::nullopt;
  if (!in_bias.is_contiguous() || (gw.defined() && (gw.dtype() != x.dtype() || !is_channels_last(gw))))
    return std::nullopt;
  for (const Tensor* t : {&gscale, &gbias})
    if (t->defined() && (t->dtype() != DType::f32 || !t->is_contiguous())) return std::nullopt;
  BackwardCall b;
  b.wgrad = gw.defined();
  b.dgrad = gx.defined() || gscale.defined() || gbias.defined();
  b.makes_dr = b.dgrad && !gx.defined();
  return b;
}

// The workspaces of graph g's plans on device 0 (workspace.h), or nullopt when the library refuses it.
std::optional<std::vector<size_t>> planned_workspaces(FusedGraph g, const ConvShape& cs, int64_t align) {
  const FusedPlan p = plan_for(context(0), g, cs, align);
  if (p->empty()) return std::nullopt;
  std::vector<size_t> out;
  for (const Candidate& c : *p) out.push_back(c.workspace);
  return out;
}

}  // namespace

std::optional<std::vector<size_t>> conv_stats_forward_workspaces(const Tensor& x, const Tensor& in_scale,
                                                                 const Tensor& in_bias, const Tensor& w,
                                                                 const Conv2dOptions& o, const Tensor& y,
                                                                 const Tensor& sum, const Tensor& sumsq) {
  const std::optional<FusedGraph> g = forward_graph(x, in_scale, in_bias, w, o, y, sum, sumsq);
  if (!g) return std::nullopt;
  if (device_count() == 0) return std::vector<size_t>{0};
  return planned_workspaces(*g, shape_of(x, w, y.shape(), o), 16);
}

std::optional<ConvStatsBackward> conv_stats_backward_plan(const Tensor& gy, const Tensor& x, const Tensor& in_scale,
                                                          const Tensor& in_bias, const Tensor& w,
                                                          const Conv2dOptions& o, const Tensor& gx,
                                                          const Tensor& gscale, const Tensor& gbias, const Tensor& gw) {
  const std::optional<BackwardCall> b = backward_call(gy, x, in_scale, in_bias, w, o, gx, gscale, gbias, gw);
  if (!b) return std::nullopt;
  ConvStatsBackward out;
  out.scratch = b->dgrad;
  out.makes_dr = b->makes_dr;
  const bool gpu = device_count() > 0;
  const ConvShape cs = shape_of(x, w, gy.shape(), o);
  if (b->wgrad) {
    const auto ws = gpu ? planned_workspaces(FusedGraph::Wgrad, cs, 16) : std::vector<size_t>{0};
    if (!ws) return std::nullopt;
    out.wgrad = *ws;
  }
  if (b->dgrad) {
    // The scratch's rows are views at multiples of C floats into one block.
    const auto ws = gpu ? planned_workspaces(FusedGraph::DgradDreluDbn, cs,
                                                   cuda::alignment_of(static_cast<uintptr_t>(cs.c * 4)))
                        : std::vector<size_t>{0};
    if (!ws) return std::nullopt;
    out.dgrad = *ws;
  }
  return out;
}

size_t conv_stats_plan_count() { return plans().size(); }
void conv_stats_clear_plans() { plans().clear(); }

bool CudaBackend::conv2d_stats_forward(const Tensor& x, const Tensor& in_scale, const Tensor& in_bias, const Tensor& w,
                                       const Conv2dOptions& o, const Tensor& y, const Tensor& sum,
                                       const Tensor& sumsq) {
  check_cuda("conv2d_stats", {&x, &in_scale, &in_bias, &w, &y, &sum, &sumsq});
  const std::optional<FusedGraph> g = forward_graph(x, in_scale, in_bias, w, o, y, sum, sumsq);
  if (!g) return false;
  const ConvShape cs = shape_of(x, w, y.shape(), o);
  Binds binds{{X, ptr(x)}, {W, ptr(w)}, {Y, ptr(y)}, {SUM, ptr(sum)}, {SQ, ptr(sumsq)}};
  if (in_scale.defined()) binds.insert(binds.end(), {{S, ptr(in_scale)}, {B, ptr(in_bias)}});
  return run_fused(context_of(x), *g, cs, binds);
}

bool CudaBackend::conv2d_stats_output_grad(const Tensor& gy, const Tensor& gsum, const Tensor& gsumsq, const Tensor& y,
                                           const Tensor& g) {
  check_cuda("conv2d_stats output gradient", {&gy, &gsum, &gsumsq, &y, &g});
  if (!conv_stats_output_grad_fused(gy, gsum, gsumsq, y, g)) return false;
  const int64_t n = y.numel(), c = y.size(1);
  const auto f32 = [](const Tensor& t) { return t.defined() ? static_cast<const float*>(ptr(t)) : nullptr; };
  auto launch = [&](auto tag) {
    using T = decltype(tag);
    const auto data = [](const Tensor& t) { return t.defined() ? static_cast<T*>(ptr(t)) : nullptr; };
    const VecPlan p = vec_plan<T>(n, c, {data(gy), data(y), data(g)});
    if (p.v > 1)
      MINIDL_LAUNCH_NOWAIT("conv2d_stats g = gy + gsum + 2 y gsumsq", (output_grad_kernel<T, vec_width<T>()>),
                           grid_for(p.count), kThreads, 0, context_of(y).stream(), data(gy), f32(gsum), f32(gsumsq),
                           data(y), data(g), ChannelOf(c, p.v, p.count), p.count);
    else
      MINIDL_LAUNCH_NOWAIT("conv2d_stats g = gy + gsum + 2 y gsumsq", (output_grad_kernel<T, 1>), grid_for(p.count),
                           kThreads, 0, context_of(y).stream(), data(gy), f32(gsum), f32(gsumsq), data(y), data(g),
                           ChannelOf(c, 1, p.count), p.count);
  };
  with_activation_type(y.dtype(), launch);
  return true;
}

bool CudaBackend::conv2d_stats_backward(const Tensor& gy, const Tensor& x, const Tensor& in_scale,
                                        const Tensor& in_bias, const Tensor& w, const Conv2dOptions& o,
                                        const Tensor& gx, const Tensor& gscale, const Tensor& gbias,
                                        const Tensor& gw) {
  check_cuda("conv2d_stats_backward", {&gy, &x, &in_scale, &in_bias, &w, &gx, &gscale, &gbias, &gw});
  const std::optional<BackwardCall> call = backward_call(gy, x, in_scale, in_bias, w, o, gx, gscale, gbias, gw);
  if (!call) return false;
  DeviceContext& ctx = context_of(x);
  const ConvShape cs = shape_of(x, w, gy.shape(), o);
  const bool wants_dgrad = call->dgrad;
  // mean 0 and inv_std 1, so the recomputed pre-activation is x * scale + bias and the weight
  // gradients are sum(dr * x) and sum(dr); the scratch takes what is not wanted.
  const TensorOptions f32{DType::f32, x.device(), false};
  const Tensor per = wants_dgrad ? empty({7, cs.c}, f32) : Tensor();
  const Tensor dr = call->makes_dr ? empty({cs.n, cs.h, cs.w, cs.c}, x.options()).permute({0, 3, 1, 2}) : gx;
  const auto row = [&](int64_t i) { return per.select(0, i); };
  const Binds wb = gw.defined() ? Binds{{X, ptr(x)}, {S, ptr(in_scale)}, {B, ptr(in_bias)}, {DY, ptr(gy)}, {DW, ptr(gw)}}
                                : Binds{};
  const Binds db = wants_dgrad ? Binds{{DY, ptr(gy)}, {W, ptr(w)}, {X, ptr(x)}, {M, ptr(row(0))}, {V, ptr(row(1))},
                                       {S, ptr(in_scale)}, {B, ptr(in_bias)}, {DR, ptr(dr)},
                                       {DS, ptr(gscale.defined() ? gscale : row(2))},
                                       {DB, ptr(gbias.defined() ? gbias : row(3))}, {EQ_DY, ptr(row(4))},
                                       {EQ_X, ptr(row(5))}, {EQ_B, ptr(row(6))}}
                               : Binds{};
  // Both graphs planned before either runs: a refused one leaves nothing written, and the op composes.
  if (gw.defined() && plan_for(ctx, FusedGraph::Wgrad, cs, alignment_of(wb), &wb)->empty()) return false;
  if (wants_dgrad) {
    fill(per, 0.0);   // the constant rows, before a trial of the graph reads them
    fill(row(1), 1.0);
    if (plan_for(ctx, FusedGraph::DgradDreluDbn, cs, alignment_of(db), &db)->empty()) return false;
  }
  if (gw.defined()) run_fused(ctx, FusedGraph::Wgrad, cs, wb);
  if (!wants_dgrad) return true;
  run_fused(ctx, FusedGraph::DgradDreluDbn, cs, db);
  if (gx.defined()) scale_channels(ctx, gx, in_scale);
  return true;
}

}  // namespace minidl::cuda
