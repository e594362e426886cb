// Convolutions through cuDNN's graph API, by way of cudnn-frontend (its v0.x builders over the
// backend descriptors): a shape's first call builds its operation graph (one convolution: forward,
// data gradient, or filter gradient with beta = 1 when it adds into a waiting gradient), asks the
// heuristics (mode A, then the fallback engines), keeps the engine configs the switches allow
// (deterministic: no atomics; f32 without TF32: no tensor cores), builds their execution plans and
// keeps them in order with their exact workspaces; benchmark mode times them once and puts the
// fastest first (torch.backends.cudnn.benchmark). Every later call of the shape is a variant pack
// and an execute: the legacy API's per-call descriptor setting and queries were most of an eager
// ResNet-50 step's host time. Workspaces come from the caching allocator; a plan whose workspace
// does not fit the budget gives way to the next, leaner one.
#include "core/allocator.h"
#include "kernels/cuda/frontend.h"

#include <algorithm>
#include <array>
#include <limits>
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda/conv_engines.cuh"
#include "kernels/cuda/conv_internal.cuh"
#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/runtime.h"

namespace minidl::cuda {
namespace {

namespace fe = cudnn_frontend;

// The unique ids of the three tensors of every graph.
constexpr int64_t kUidX = 'x', kUidW = 'w', kUidY = 'y';
constexpr size_t kMaxPlans = 8;   // plans built per shape: the heuristics' best, then fallbacks

// Everything a plan depends on: the shape, dtype, layout, direction, beta, the pointers'
// alignment, the device and the switches (TF32, autotuning, determinism).
using Key = std::array<int64_t, 27>;
Key key_of(const ConvShape& cs, ConvDir dir, bool add, const std::array<int64_t, 3>& align, int device,
           bool benchmark) {
  return {static_cast<int64_t>(dir), cs.n, cs.c, cs.h, cs.w, cs.k, cs.r, cs.s, cs.oh, cs.ow,
          cs.o.padding[0], cs.o.padding[1], cs.o.stride[0], cs.o.stride[1], cs.o.dilation[0], cs.o.dilation[1],
          cs.o.groups, static_cast<int64_t>(cs.dtype), cs.nhwc, add, align[0], align[1], align[2], device,
          allow_tf32_cudnn(), benchmark, cudnn_deterministic()};
}

std::string describe(const ConvShape& cs, ConvDir dir) {
  std::ostringstream os;
  os << timer_name(dir) << " x [" << cs.n << ", " << cs.c << ", " << cs.h << ", " << cs.w << "] w [" << cs.k << ", "
     << cs.c / cs.o.groups << ", " << cs.r << ", " << cs.s << "] y [" << cs.n << ", " << cs.k << ", " << cs.oh << ", "
     << cs.ow << "] " << dtype_name(cs.dtype) << (cs.nhwc ? " NHWC" : " NCHW") << " stride " << cs.o.stride[0]
     << " padding " << cs.o.padding[0] << " dilation " << cs.o.dilation[0] << " groups " << cs.o.groups;
  return os.str();
}

struct GraphPlan {
  std::vector<Candidate> order;   // tried in order until one's workspace fits
};

PlanCache<Key, std::shared_ptr<const GraphPlan>>& plans() {
  static auto* m = new PlanCache<Key, std::shared_ptr<const GraphPlan>>();   // outlives static destruction
  return *m;
}

fe::Tensor tensor(int64_t uid, int64_t d0, int64_t d1, int64_t d2, int64_t d3, bool nhwc, int64_t align,
                  cudnnDataType_t dt) {
  const int64_t dims[4] = {d0, d1, d2, d3};
  const int64_t nchw[4] = {d1 * d2 * d3, d2 * d3, d3, 1}, nhwc_st[4] = {d1 * d2 * d3, 1, d3 * d1, d1};
  return fe::TensorBuilder()
      .setDim(4, dims)
      .setStride(4, nhwc ? nhwc_st : nchw)
      .setId(uid)
      .setAlignment(align)
      .setDataType(dt)
      .build();
}

// The operation graph of one direction: x-shaped, filter and y-shaped tensors and the convolution.
fe::OperationGraph build_graph(cudnnHandle_t h, const ConvShape& cs, ConvDir dir, bool add,
                               const std::array<int64_t, 3>& align) {
  const cudnnDataType_t dt = cudnn_data_type(cs.dtype);
  const fe::Tensor x = tensor(kUidX, cs.n, cs.c, cs.h, cs.w, cs.nhwc, align[0], dt);
  const fe::Tensor w = tensor(kUidW, cs.k, cs.c / cs.o.groups, cs.r, cs.s, cs.nhwc, align[1], dt);
  const fe::Tensor y = tensor(kUidY, cs.n, cs.k, cs.oh, cs.ow, cs.nhwc, align[2], dt);
  const int64_t pad[2] = {cs.o.padding[0], cs.o.padding[1]}, stride[2] = {cs.o.stride[0], cs.o.stride[1]};
  const int64_t dil[2] = {cs.o.dilation[0], cs.o.dilation[1]};
  const fe::ConvDesc conv = fe::ConvDescBuilder()
                                .setComputeType(cs.dtype == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT)
                                .setMathMode(CUDNN_CROSS_CORRELATION)
                                .setSpatialDimCount(2)
                                .setSpatialStride(2, stride)
                                .setPrePadding(2, pad)
                                .setPostPadding(2, pad)
                                .setDilation(2, dil)
                                .build();
  fe::OperationBuilder ob(dir == ConvDir::Forward        ? CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR
                          : dir == ConvDir::BackwardData ? CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR
                                                         : CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR);
  if (dir == ConvDir::Forward) ob.setxDesc(x).setwDesc(w).setyDesc(y);
  else if (dir == ConvDir::BackwardData) ob.setdxDesc(x).setwDesc(w).setdyDesc(y);
  else ob.setxDesc(x).setdwDesc(w).setdyDesc(y);
  ob.setcDesc(conv);
  if (cs.dtype == DType::f64) ob.setAlpha(1.0).setBeta(add ? 1.0 : 0.0);
  else ob.setAlpha(1.0f).setBeta(add ? 1.0f : 0.0f);
  const fe::Operation op = ob.build();
  const fe::Operation* ops[] = {&op};
  return fe::OperationGraphBuilder().setHandle(h).setOperationGraph(1, ops).build();
}

// The plans of a graph (conv_engines.cuh); none is an error naming the shape and the last refusal.
std::vector<Candidate> build_plans(cudnnHandle_t h, fe::OperationGraph& og, const ConvShape& cs, ConvDir dir) {
  std::string refused;
  std::vector<Candidate> out = engine_plans(h, og, cs.dtype, kMaxPlans, &refused);
  MINIDL_CHECK(!out.empty(), "conv2d (cuda): cuDNN has no engine for ", describe(cs, dir),
               cudnn_deterministic() ? " that is deterministic (set_cudnn_deterministic(false) allows the others)" : "",
               refused.empty() ? "" : "; last refusal: ", refused);
  return out;
}

// The three pointers in unique-id order (x-shaped, filter, y-shaped).
std::array<void*, 3> pointers(ConvDir dir, const void* a, const void* b, void* out) {
  auto* pa = const_cast<void*>(a);
  auto* pb = const_cast<void*>(b);
  if (dir == ConvDir::Forward) return {pa, pb, out};
  if (dir == ConvDir::BackwardData) return {out, pb, pa};
  return {pa, out, pb};
}

cudnnStatus_t execute(cudnnHandle_t h, const Candidate& c, std::array<void*, 3> ptrs, void* ws) {
  static constexpr int64_t kUids[3] = {kUidX, kUidW, kUidY};
  return execute_plan(h, c, 3, ptrs.data(), kUids, ws);
}

// Benchmark mode: the fastest plan first (conv_engines.cuh). When the call adds into its output,
// the trials write into a scratch output of that size instead.
std::vector<Candidate> autotune(DeviceContext& ctx, ConvDir dir, const ConvShape& cs, std::vector<Candidate> cands,
                                const void* a, const void* b, void* out, bool add) {
  size_t largest = 0;
  for (const Candidate& c : cands) largest = std::max(largest, c.workspace);
  const TuningBuffers tb = tuning_buffers(ctx, add ? x_bytes(cs) : 0, largest);
  if (tb.scratch_out) out = tb.scratch_out->get();
  const std::array<void*, 3> ptrs = pointers(dir, a, b, out);
  const bool ran = put_fastest_first(ctx, cands, tb.workspace->get(), tb.workspace_bytes,
                                     [&](const Candidate& c, void* ws) { return execute(ctx.cudnn(), c, ptrs, ws); });
  MINIDL_CHECK(ran, "conv2d (cuda): no cuDNN plan ran for ", describe(cs, dir), " within a workspace of ",
               format_bytes(tb.workspace_bytes), " while autotuning");
  return cands;
}

// The shape's plan under `key`, built on its first call (and, in benchmark mode, autotuned on the
// call's own operands).
std::shared_ptr<const GraphPlan> plan_for(const Key& key, DeviceContext& ctx, const ConvShape& cs, ConvDir dir,
                                          bool add, const std::array<int64_t, 3>& align, bool benchmark,
                                          const void* a, const void* b, void* out) {
  if (const auto* kept = plans().find(key)) return *kept;
  // Building a plan asks cuDNN (heuristics, plan finalize, autotuning's runs), which must not
  // happen inside a CUDA graph capture: a captured step runs by plans made in its warm-up.
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  MINIDL_CUDA_CHECK(cudaStreamIsCapturing(ctx.stream(), &capturing));
  MINIDL_CHECK(capturing == cudaStreamCaptureStatusNone, "conv2d (cuda): ", describe(cs, dir),
               " has no cuDNN plan yet and the stream is capturing a CUDA graph; run the step once before capturing "
               "it (a warm-up step plans every shape)");
  auto p = std::make_shared<GraphPlan>();
  try {
    cudnnHandle_t h = ctx.cudnn();
    fe::OperationGraph og = build_graph(h, cs, dir, add, align);
    p->order = build_plans(h, og, cs, dir);
    if (benchmark) p->order = autotune(ctx, dir, cs, std::move(p->order), a, b, out, add);
  } catch (fe::cudnnException& e) {
    MINIDL_FAIL("conv2d (cuda): cuDNN refused the graph of ", describe(cs, dir), ": ", e.what(), " (",
                cudnnGetErrorString(e.getCudnnStatus()), ")");
  }
  // A long search over batch sizes plans every layer at every size: past this many shapes the
  // least recently used leave (plan_cache.h; each holds up to kMaxPlans cuDNN plans; a call in
  // flight keeps its own by shared_ptr).
  constexpr size_t kMaxShapes = 2048;
  return plans().insert(key, std::move(p), kMaxShapes);
}

}  // namespace

void graph_conv_run(DeviceContext& ctx, const ConvShape& cs, ConvDir dir, const void* a, const void* b, void* out,
                    bool add) {
  const std::array<void*, 3> ptrs = pointers(dir, a, b, out);
  const std::array<int64_t, 3> align{alignment_of(ptrs[0]), alignment_of(ptrs[1]), alignment_of(ptrs[2])};
  const bool benchmark = cudnn_benchmark();
  const Key key = key_of(cs, dir, add, align, ctx.index(), benchmark);
  const std::shared_ptr<const GraphPlan> p = plan_for(key, ctx, cs, dir, add, align, benchmark, a, b, out);
  cudnnHandle_t h = ctx.cudnn();
  std::string tried;
  for (const Candidate& c : p->order) {
    std::unique_ptr<DeviceBuffer> ws;
    try {
      const TentativeRequests tentative;   // a leaner plan follows
      ws = std::make_unique<DeviceBuffer>(ctx, c.workspace);
    } catch (const OutOfMemoryError&) {
      tried += " " + c.plan->getTag() + " (workspace " + format_bytes(c.workspace) + ")";
      continue;   // a leaner plan may fit
    }
    cudnnStatus_t st;
    {
      const ScopedLaunchTimer timer(timer_name(dir), "", ctx.stream());
      st = execute(h, c, ptrs, ws->get());
    }
    if (st == CUDNN_STATUS_SUCCESS) return;
    // A plan may still refuse this call's configuration: the next one. cuDNN 9 returns fine-grained
    // codes (3002 NOT_SUPPORTED_SHAPE, 2003 BAD_PARAM_MISALIGNED_POINTER, ...): compare categories.
    const int category = CUDNN_STATUS_CATEGORY(static_cast<int>(st));
    MINIDL_CHECK(category == static_cast<int>(CUDNN_STATUS_NOT_SUPPORTED) ||
                     category == static_cast<int>(CUDNN_STATUS_BAD_PARAM),
                 "conv2d (cuda): cuDNN's plan ", c.plan->getTag(), " failed for ", describe(cs, dir), ": ",
                 cudnnGetErrorString(st));
    tried += " " + c.plan->getTag() + " (" + cudnnGetErrorString(st) + ")";
  }
  MINIDL_CHECK(tried.find("workspace") != std::string::npos, "conv2d (cuda): no cuDNN plan ran (tried", tried,
               ") for ", describe(cs, dir));
  const MemoryStats s = ctx.allocator().stats();
  throw OutOfMemoryError("out of memory on cuda:" + std::to_string(ctx.index()) +
                             ": no cuDNN execution plan's workspace fits for " + describe(cs, dir) + " (tried" +
                             tried + "). Use a smaller batch, or raise the memory budget.",
                         0, static_cast<size_t>(s.reserved_bytes), static_cast<size_t>(s.budget_bytes));
}

std::vector<size_t> graph_conv_workspaces(const ConvShape& cs, ConvDir dir, bool add) {
  // The heuristic-mode plan the convolution runs by (tensors from the allocator are 16-byte aligned).
  const std::array<int64_t, 3> align{16, 16, 16};
  const Key key = key_of(cs, dir, add, align, 0, /*benchmark=*/false);
  const std::shared_ptr<const GraphPlan> p =
      plan_for(key, context(0), cs, dir, add, align, /*benchmark=*/false, nullptr, nullptr, nullptr);
  std::vector<size_t> out;
  for (const Candidate& c : p->order) out.push_back(c.workspace);
  return out;
}

size_t graph_conv_plan_count() { return plans().size(); }
void graph_conv_clear_plans() { plans().clear(); }

}  // namespace minidl::cuda
