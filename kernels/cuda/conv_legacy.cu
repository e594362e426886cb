// Convolutions through cuDNN's legacy API (cudnnConvolution*), kept behind set_cudnn_api(Legacy)
// (conv_api.h) only to measure it against the graph API path (conv_graph.cu), which is the
// default. On NCHW tensors or on channels-last ones (NHWC descriptors over the tensors' own
// memory, filters KRSC). Heuristic mode takes cuDNN's ranked list (cudnnGet*Algorithm_v7) and the
// first algorithm whose workspace the allocator can give within the budget; benchmark mode times
// them once per shape with cudnnFind*AlgorithmEx over a workspace drawn from the allocator, and
// caches the winner, like torch.backends.cudnn.benchmark.
#include <map>
#include <memory>
#include <mutex>
#include <sstream>
#include <vector>

#include "core/allocator.h"
#include "kernels/cuda/conv_internal.cuh"
#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/runtime.h"

namespace minidl::cuda {
namespace {

enum class Dir { Fwd, BwdData, BwdFilter };

int to_int(int64_t v) {
  MINIDL_CHECK(v >= 0 && v <= std::numeric_limits<int>::max(), "conv2d (cuda): size ", v, " exceeds cuDNN's int range");
  return static_cast<int>(v);
}

// The four descriptors of one convolution (RAII: destroyed, with logging, in any case).
struct Descriptors {
  cudnnTensorDescriptor_t x = nullptr, y = nullptr;
  cudnnFilterDescriptor_t w = nullptr;
  cudnnConvolutionDescriptor_t conv = nullptr;
  cudnnMathType_t default_math = CUDNN_DEFAULT_MATH;

  // A check that throws half-way must not leak what was created: a constructor that throws runs
  // no destructor, so the constructor releases and rethrows itself.
  explicit Descriptors(const ConvShape& cs) {
    try {
      init(cs);
    } catch (...) {
      release();
      throw;
    }
  }
  ~Descriptors() { release(); }
  Descriptors(const Descriptors&) = delete;
  Descriptors& operator=(const Descriptors&) = delete;

 private:
  void init(const ConvShape& cs) {
    const cudnnDataType_t dt = cudnn_data_type(cs.dtype);
    const cudnnTensorFormat_t fmt = cs.nhwc ? CUDNN_TENSOR_NHWC : CUDNN_TENSOR_NCHW;
    MINIDL_CUDNN_CHECK(cudnnCreateTensorDescriptor(&x));
    MINIDL_CUDNN_CHECK(cudnnCreateTensorDescriptor(&y));
    MINIDL_CUDNN_CHECK(cudnnCreateFilterDescriptor(&w));
    MINIDL_CUDNN_CHECK(cudnnCreateConvolutionDescriptor(&conv));
    MINIDL_CUDNN_CHECK(cudnnSetTensor4dDescriptor(x, fmt, dt, to_int(cs.n), to_int(cs.c), to_int(cs.h), to_int(cs.w)));
    MINIDL_CUDNN_CHECK(cudnnSetTensor4dDescriptor(y, fmt, dt, to_int(cs.n), to_int(cs.k), to_int(cs.oh), to_int(cs.ow)));
    MINIDL_CUDNN_CHECK(cudnnSetFilter4dDescriptor(w, dt, fmt, to_int(cs.k), to_int(cs.c / cs.o.groups), to_int(cs.r),
                                                  to_int(cs.s)));
    const cudnnDataType_t compute = cs.dtype == DType::f64 ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
    MINIDL_CUDNN_CHECK(cudnnSetConvolution2dDescriptor(
        conv, to_int(cs.o.padding[0]), to_int(cs.o.padding[1]), to_int(cs.o.stride[0]), to_int(cs.o.stride[1]),
        to_int(cs.o.dilation[0]), to_int(cs.o.dilation[1]), CUDNN_CROSS_CORRELATION, compute));
    MINIDL_CUDNN_CHECK(cudnnSetConvolutionGroupCount(conv, to_int(cs.o.groups)));
    // f32 without TF32 must not use tensor cores (CUDNN_FMA_MATH); f16 and bf16 should (TENSOR_OP).
    if (cs.dtype == DType::f16 || cs.dtype == DType::bf16) default_math = CUDNN_TENSOR_OP_MATH;
    else if (cs.dtype == DType::f32 && !allow_tf32_cudnn()) default_math = CUDNN_FMA_MATH;
    MINIDL_CUDNN_CHECK(cudnnSetConvolutionMathType(conv, default_math));
    int on, oc, ooh, oow;
    MINIDL_CUDNN_CHECK(cudnnGetConvolution2dForwardOutputDim(conv, x, w, &on, &oc, &ooh, &oow));
    MINIDL_CHECK(on == cs.n && oc == cs.k && ooh == cs.oh && oow == cs.ow, "conv2d (cuda): cuDNN computes output [",
                 on, ", ", oc, ", ", ooh, ", ", oow, "], the front-end [", cs.n, ", ", cs.k, ", ", cs.oh, ", ", cs.ow, "]");
  }
  void release() noexcept {
    if (conv != nullptr) MINIDL_CUDNN_LOG(cudnnDestroyConvolutionDescriptor(conv));
    if (w != nullptr) MINIDL_CUDNN_LOG(cudnnDestroyFilterDescriptor(w));
    if (y != nullptr) MINIDL_CUDNN_LOG(cudnnDestroyTensorDescriptor(y));
    if (x != nullptr) MINIDL_CUDNN_LOG(cudnnDestroyTensorDescriptor(x));
    conv = nullptr;
    w = nullptr;
    x = y = nullptr;
  }
};

// One candidate algorithm, whatever the direction.
struct Candidate {
  int algo = 0;
  size_t memory = 0;   // what the query reported; a plan's candidates hold the exact workspace
  cudnnMathType_t math = CUDNN_DEFAULT_MATH;
  cudnnDeterminism_t determinism = CUDNN_DETERMINISTIC;
};

std::string cache_key(const ConvShape& cs, Dir dir) {
  std::ostringstream os;
  os << static_cast<int>(dir) << ':' << cs.n << ',' << cs.c << ',' << cs.h << ',' << cs.w << ':' << cs.k << ','
     << cs.r << ',' << cs.s << ':' << cs.o.padding[0] << ',' << cs.o.padding[1] << ',' << cs.o.stride[0] << ','
     << cs.o.stride[1] << ',' << cs.o.dilation[0] << ',' << cs.o.dilation[1] << ',' << cs.o.groups << ':'
     << dtype_name(cs.dtype) << (cs.nhwc ? ":nhwc" : ":nchw") << (allow_tf32_cudnn() ? ":tf32" : "");
  return os.str();
}

// One shape's plan: the algorithms run() tries, in order, each with its exact workspace. Built on
// the shape's first call and kept: cuDNN's queries (heuristics, workspace sizes) cost host time on
// every call otherwise, milliseconds each for f16 (a ResNet-50 AMP step spent over a second in
// them on an H100, lab/results/bench/gpu_check_2026-11-26_bbe331e.md), and they cannot run inside a
// CUDA graph capture. Keyed by the shape and every switch the plan depends on.
struct Plan {
  std::vector<Candidate> order;
};
PlanCache<std::string, Plan>& algo_cache() {
  static auto* m = new PlanCache<std::string, Plan>();
  return *m;
}

// Without TF32, f32 convolutions keep FMA math whatever math type cuDNN reports for an algorithm.
void pin_math(const Descriptors& d, std::vector<Candidate>& cs) {
  if (d.default_math != CUDNN_FMA_MATH) return;
  for (Candidate& c : cs) c.math = CUDNN_FMA_MATH;
}

template <class Perf>
Candidate candidate_of(const Perf& p) {
  return {static_cast<int>(p.algo), p.memory, p.mathType, p.determinism};
}

// Deterministic mode (set_cudnn_deterministic) keeps only the algorithms cuDNN reports as
// deterministic (no atomics: the same bits on every run).
void keep_deterministic(std::vector<Candidate>& cs) {
  if (!cudnn_deterministic()) return;
  std::erase_if(cs, [](const Candidate& c) { return c.determinism != CUDNN_DETERMINISTIC; });
}

// cuDNN's heuristic ranking, successful entries only.
std::vector<Candidate> heuristic(cudnnHandle_t h, const Descriptors& d, Dir dir) {
  std::vector<Candidate> out;
  int n = 0;
  if (dir == Dir::Fwd) {
    cudnnConvolutionFwdAlgoPerf_t p[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    MINIDL_CUDNN_CHECK(cudnnGetConvolutionForwardAlgorithm_v7(h, d.x, d.w, d.conv, d.y, CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, p));
    for (int i = 0; i < n; ++i)
      if (p[i].status == CUDNN_STATUS_SUCCESS) out.push_back(candidate_of(p[i]));
  } else if (dir == Dir::BwdData) {
    cudnnConvolutionBwdDataAlgoPerf_t p[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    MINIDL_CUDNN_CHECK(cudnnGetConvolutionBackwardDataAlgorithm_v7(h, d.w, d.y, d.conv, d.x, CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, p));
    for (int i = 0; i < n; ++i)
      if (p[i].status == CUDNN_STATUS_SUCCESS) out.push_back(candidate_of(p[i]));
  } else {
    cudnnConvolutionBwdFilterAlgoPerf_t p[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    MINIDL_CUDNN_CHECK(cudnnGetConvolutionBackwardFilterAlgorithm_v7(h, d.x, d.y, d.conv, d.w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, p));
    for (int i = 0; i < n; ++i)
      if (p[i].status == CUDNN_STATUS_SUCCESS) out.push_back(candidate_of(p[i]));
  }
  pin_math(d, out);
  keep_deterministic(out);
  return out;
}

// The exact workspace of one algorithm under one math type.
size_t workspace_size(cudnnHandle_t h, const Descriptors& d, Dir dir, const Candidate& c) {
  MINIDL_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, c.math));
  size_t ws = 0;
  cudnnStatus_t st;
  if (dir == Dir::Fwd) {
    st = cudnnGetConvolutionForwardWorkspaceSize(h, d.x, d.w, d.conv, d.y, static_cast<cudnnConvolutionFwdAlgo_t>(c.algo), &ws);
  } else if (dir == Dir::BwdData) {
    st = cudnnGetConvolutionBackwardDataWorkspaceSize(h, d.w, d.y, d.conv, d.x, static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo), &ws);
  } else {
    st = cudnnGetConvolutionBackwardFilterWorkspaceSize(h, d.x, d.y, d.conv, d.w, static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo), &ws);
  }
  return st == CUDNN_STATUS_SUCCESS ? ws : SIZE_MAX;
}

// Times the candidates (benchmark mode) with the largest workspace the allocator can give, up to
// what the hungriest candidate wants. a/b are the direction's inputs, out its output (scratch).
// cuDNN's Find runs each algorithm once; an algorithm's first run in a process also loads its
// kernels (CUDA's lazy module loading), so one trial ranks by load time as much as by speed: the
// same graphed step ran at 5237 images/s in one process on an H200 and 6020-6031 in seven others
// (lab/results/bench/gpu_check_2026-11-26_5fe0802.md, lab/results/bench/gpu_check_2026-11-26_ab67ceb.md,
// lab/results/bench/gpu_repeat_2026-11-26_ab67ceb.md).
// Find runs cudnn_find_trials() times (runtime.h; default 1: two changed nothing measurable in six
// processes) and each algorithm keeps its fastest time.
// out_bytes > 0: out holds data the call adds to (beta = 1), so Find, which writes its trials'
// results, times them into a scratch output of that size instead.
Candidate autotune(DeviceContext& ctx, const Descriptors& d, Dir dir, const std::vector<Candidate>& cands,
                   const void* a, const void* b, void* out, size_t out_bytes) {
  size_t largest = 0;
  for (const Candidate& c : cands) largest = std::max(largest, c.memory);
  const TuningBuffers tb = tuning_buffers(ctx, out_bytes, largest);
  if (tb.scratch_out) out = tb.scratch_out->get();
  DeviceBuffer* const ws = tb.workspace.get();
  const size_t want = tb.workspace_bytes;
  cudnnHandle_t h = ctx.cudnn();
  MINIDL_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, d.default_math));
  struct Timed {
    Candidate c;
    float ms;
  };
  std::vector<Timed> timed;   // in first-found order; each algorithm and math type once, its best time
  auto keep = [&](const auto* p, int n) {
    for (int i = 0; i < n; ++i) {
      if (p[i].status != CUDNN_STATUS_SUCCESS || p[i].memory > want) continue;
      const Candidate c = candidate_of(p[i]);
      auto it = std::find_if(timed.begin(), timed.end(),
                             [&](const Timed& t) { return t.c.algo == c.algo && t.c.math == c.math; });
      if (it == timed.end()) timed.push_back({c, p[i].time});
      else it->ms = std::min(it->ms, p[i].time);
    }
  };
  for (int trial = 0; trial < cudnn_find_trials(); ++trial) {
    int n = 0;
    if (dir == Dir::Fwd) {
      cudnnConvolutionFwdAlgoPerf_t p[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
      MINIDL_CUDNN_CHECK(cudnnFindConvolutionForwardAlgorithmEx(h, d.x, a, d.w, b, d.conv, d.y, out,
                                                                CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &n, p, ws->get(), want));
      keep(p, n);
    } else if (dir == Dir::BwdData) {
      cudnnConvolutionBwdDataAlgoPerf_t p[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
      MINIDL_CUDNN_CHECK(cudnnFindConvolutionBackwardDataAlgorithmEx(h, d.w, b, d.y, a, d.conv, d.x, out,
                                                                     CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &n, p,
                                                                     ws->get(), want));
      keep(p, n);
    } else {
      cudnnConvolutionBwdFilterAlgoPerf_t p[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
      MINIDL_CUDNN_CHECK(cudnnFindConvolutionBackwardFilterAlgorithmEx(h, d.x, a, d.y, b, d.conv, d.w, out,
                                                                       CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &n, p,
                                                                       ws->get(), want));
      keep(p, n);
    }
  }
  std::stable_sort(timed.begin(), timed.end(), [](const Timed& x, const Timed& y) { return x.ms < y.ms; });
  std::vector<Candidate> found;
  for (const Timed& t : timed) found.push_back(t.c);
  pin_math(d, found);
  keep_deterministic(found);
  MINIDL_CHECK(!found.empty(), "conv2d (cuda): cuDNN found no working", cudnn_deterministic() ? " deterministic" : "",
               " algorithm within a workspace of ", format_bytes(want),
               cudnn_deterministic() ? " (set_cudnn_deterministic(false) allows the others)" : "");
  return found.front();   // the fastest
}

// The plan's key: the shape's (cache_key) and the switches the plan depends on.
std::string plan_key(const std::string& shape_key, bool benchmark) {
  return shape_key + (benchmark ? ":benchmark" : ":heuristic") + (cudnn_deterministic() ? ":deterministic" : "");
}

// The plan kept under `key`, made by build() on the key's first call.
template <class Build>
const Plan& cached_plan(const std::string& key, Build&& build) {
  if (const Plan* kept = algo_cache().find(key)) return *kept;
  return algo_cache().insert(key, build());
}

// The candidates, in order, each with its exact workspace under its math type; those whose
// workspace query fails are left out.
std::vector<Candidate> sized(cudnnHandle_t h, const Descriptors& d, Dir dir, std::vector<Candidate> cands) {
  std::vector<Candidate> out;
  for (Candidate c : cands) {
    c.memory = workspace_size(h, d, dir, c);   // also sets the math type
    if (c.memory != SIZE_MAX) out.push_back(c);
  }
  MINIDL_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, d.default_math));
  return out;
}

// The shape's plan, built on its first call: heuristic mode, cuDNN's ranking; benchmark mode, the
// autotuned winner first, then the ranking as fallbacks.
const Plan& plan(DeviceContext& ctx, const Descriptors& d, const std::string& shape_key, Dir dir, const void* a,
                 const void* b, void* out, size_t out_bytes) {
  const bool benchmark = cudnn_benchmark();
  return cached_plan(plan_key(shape_key, benchmark), [&] {
    cudnnHandle_t h = ctx.cudnn();
    MINIDL_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, d.default_math));
    const std::vector<Candidate> ranked = heuristic(h, d, dir);
    std::vector<Candidate> cands;
    if (benchmark) cands.push_back(autotune(ctx, d, dir, ranked, a, b, out, out_bytes));
    cands.insert(cands.end(), ranked.begin(), ranked.end());
    return Plan{sized(h, d, dir, std::move(cands))};
  });
}

// The descriptors of a shape, made on this thread's first call with it and kept (creating and
// setting four descriptors cost host time on every convolution of every step); per thread, so the
// math type run() sets on them before each call never races another thread's. Keyed by the call's
// cache_key (the direction, shape, dtype, layout and TF32 switch), which run() builds once.
const Descriptors& descriptors_for(const ConvShape& cs, const std::string& shape_key) {
  constexpr size_t kMaxShapes = 4096;   // a long search over batch sizes: start again past this
  thread_local std::map<std::string, std::unique_ptr<Descriptors>> cache;
  if (cache.size() >= kMaxShapes) cache.clear();
  std::unique_ptr<Descriptors>& slot = cache[shape_key];
  if (!slot) slot = std::make_unique<Descriptors>(cs);
  return *slot;
}

// Runs one direction: picks the algorithm, draws its workspace from the allocator and calls cuDNN.
// a, b: (x, w) forward, (dy, w) backward-data, (x, dy) backward-filter.
// beta 1 adds into out (the data gradient into one already waiting: conv2d_backward_input_add).
void run(DeviceContext& ctx, const ConvShape& cs, Dir dir, const void* a, const void* b, void* out, bool add = false) {
  if (cs.n == 0 || cs.k == 0 || cs.c == 0) return;
  const std::string shape_key = cache_key(cs, dir);
  const Descriptors& d = descriptors_for(cs, shape_key);
  cudnnHandle_t h = ctx.cudnn();
  // Adding into out: autotuning must not write its trials there (a scratch output of dx's size).
  const size_t keep_out = add ? x_bytes(cs) : 0;
  const std::vector<Candidate>& order = plan(ctx, d, shape_key, dir, a, b, out, keep_out).order;
  const float one32 = 1.0f, beta32 = add ? 1.0f : 0.0f;
  const double one64 = 1.0, beta64 = add ? 1.0 : 0.0;
  const void* alpha = cs.dtype == DType::f64 ? static_cast<const void*>(&one64) : &one32;
  const void* beta = cs.dtype == DType::f64 ? static_cast<const void*>(&beta64) : &beta32;
  std::string tried;
  for (const Candidate& c : order) {
    const size_t wsz = c.memory;
    MINIDL_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, c.math));
    std::unique_ptr<DeviceBuffer> ws;
    try {
      const TentativeRequests tentative;   // a leaner algorithm follows
      ws = std::make_unique<DeviceBuffer>(ctx, wsz);
    } catch (const OutOfMemoryError&) {
      tried += " algo " + std::to_string(c.algo) + " (workspace " + format_bytes(wsz) + ")";
      continue;   // a leaner algorithm may fit
    }
    cudnnStatus_t st;
    // Keyed as the step-time model keys the emulated cuDNN's calls (launch_timer.cuh).
    const ScopedLaunchTimer timer(timer_name(dir == Dir::Fwd       ? ConvDir::Forward
                                             : dir == Dir::BwdData ? ConvDir::BackwardData
                                                                   : ConvDir::BackwardFilter),
                                  "", ctx.stream());
    if (dir == Dir::Fwd) {
      st = cudnnConvolutionForward(h, alpha, d.x, a, d.w, b, d.conv, static_cast<cudnnConvolutionFwdAlgo_t>(c.algo),
                                   ws->get(), wsz, beta, d.y, out);
    } else if (dir == Dir::BwdData) {
      st = cudnnConvolutionBackwardData(h, alpha, d.w, b, d.y, a, d.conv,
                                        static_cast<cudnnConvolutionBwdDataAlgo_t>(c.algo), ws->get(), wsz, beta, d.x, out);
    } else {
      st = cudnnConvolutionBackwardFilter(h, alpha, d.x, a, d.y, b, d.conv,
                                          static_cast<cudnnConvolutionBwdFilterAlgo_t>(c.algo), ws->get(), wsz, beta, d.w,
                                          out);
    }
    if (st == CUDNN_STATUS_SUCCESS) return;
    // An algorithm the heuristics ranked may still refuse this configuration (e.g. f64, or a view
    // whose pointer is not 16-byte aligned): next. cuDNN 9 returns fine-grained codes (3002
    // NOT_SUPPORTED_SHAPE, 2003 BAD_PARAM_MISALIGNED_POINTER, ...), so compare categories.
    const int category = CUDNN_STATUS_CATEGORY(static_cast<int>(st));
    MINIDL_CHECK(category == static_cast<int>(CUDNN_STATUS_NOT_SUPPORTED) ||
                     category == static_cast<int>(CUDNN_STATUS_BAD_PARAM),
                 "conv2d (cuda): cuDNN algorithm ", c.algo, " failed: ", cudnnGetErrorString(st));
    tried += " algo " + std::to_string(c.algo) + " (" + cudnnGetErrorString(st) + ")";
  }
  const MemoryStats s = ctx.allocator().stats();
  MINIDL_CHECK(tried.find("workspace") != std::string::npos, "conv2d (cuda): no cuDNN algorithm ran (tried", tried,
               ") for ", shape_key);
  throw OutOfMemoryError("out of memory on cuda:" + std::to_string(ctx.index()) +
                             ": no cuDNN convolution algorithm's workspace fits (tried" + tried +
                             "). Use a smaller batch, or raise the memory budget.",
                         0, static_cast<size_t>(s.reserved_bytes), static_cast<size_t>(s.budget_bytes));
}

Dir to_dir(ConvDir d) {
  return d == ConvDir::Forward ? Dir::Fwd : d == ConvDir::BackwardData ? Dir::BwdData : Dir::BwdFilter;
}

}  // namespace

void legacy_conv_run(DeviceContext& ctx, const ConvShape& cs, ConvDir dir, const void* a, const void* b, void* out,
                     bool add) {
  run(ctx, cs, to_dir(dir), a, b, out, add);
}

std::vector<size_t> legacy_conv_workspaces(const ConvShape& cs, ConvDir dir) {
  const Dir dd = to_dir(dir);
  // run()'s fallback order, from the heuristic-mode plan it shares: a dry run asks cuDNN once per
  // shape too, not at every trial's every convolution.
  const Plan& p = cached_plan(plan_key(cache_key(cs, dd), /*benchmark=*/false), [&] {
    const Descriptors d(cs);
    cudnnHandle_t h = context(0).cudnn();
    MINIDL_CUDNN_CHECK(cudnnSetConvolutionMathType(d.conv, d.default_math));
    return Plan{sized(h, d, dd, heuristic(h, d, dd))};
  });
  std::vector<size_t> out;
  for (const Candidate& c : p.order) out.push_back(c.memory);
  return out;
}

size_t legacy_conv_plan_count() { return algo_cache().size(); }
void legacy_conv_clear_plans() { algo_cache().clear(); }

}  // namespace minidl::cuda
