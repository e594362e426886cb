// What both cuDNN graph-API paths do with an operation graph once it is built: ask the heuristics
// (mode A, then the fallback engines) for engine configs, keep those the switches allow, and
// finalize each into an execution plan with its exact workspace. conv_graph.cu plans single
// convolutions with it, conv_stats.cu the fused convolution + batch-norm graphs.
#pragma once
#include "kernels/cuda/frontend.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "kernels/cuda/check.cuh"
#include "kernels/cuda/context.cuh"
#include "kernels/cuda/runtime.h"

#ifdef MINIDL_CUDA_EMU
// The emulated cuDNN's fake times for autotuning (cuda_emu/emu_libs.h).
namespace minidl::cuda::emu {
long long cudnn_autotune_trial();
float cudnn_plan_time_ms(const void* plan, long long trial);
}  // namespace minidl::cuda::emu
#endif

namespace minidl::cuda {

// The largest power of two up to 16 dividing an address, or a byte offset into a 16-byte aligned
// block: the alignment a graph's tensor may promise cuDNN.
inline int64_t alignment_of(uintptr_t v) {
  int64_t a = 16;
  while (a > 1 && v % static_cast<uintptr_t>(a) != 0) a /= 2;
  return a;
}
inline int64_t alignment_of(const void* p) { return alignment_of(reinterpret_cast<uintptr_t>(p)); }

// One runnable plan and its exact workspace.
struct Candidate {
  std::shared_ptr<cudnn_frontend::ExecutionPlan> plan;
  size_t workspace = 0;
};

// Whether the switches allow an engine config: determinism keeps engines without atomics; f32
// without TF32 keeps engines that neither use tensor cores nor round the inputs down.
inline bool engine_allowed(const cudnn_frontend::ManagedOpaqueDescriptor& cfg, DType dtype) {
  namespace fe = cudnn_frontend;
  cudnnBackendDescriptor_t d = cfg->get_backend_descriptor();
  if (cudnn_deterministic() && fe::hasNumericalNote<CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC>(d)) return false;
  return dtype != DType::f32 || allow_tf32_cudnn() ||
         !(fe::hasNumericalNote<CUDNN_NUMERICAL_NOTE_TENSOR_CORE>(d) ||
           fe::hasNumericalNote<CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS>(d));
}

// The graph's plans in the heuristics' order, then the fallback engines', each engine once and at
// most `max_plans`; a mode with nothing for the graph, or a config cuDNN refuses to finalize, is
// skipped, and `refused` (when given) keeps the last refusal's text.
inline std::vector<Candidate> engine_plans(cudnnHandle_t h, cudnn_frontend::OperationGraph& og, DType dtype,
                                           size_t max_plans, std::string* refused = nullptr) {
  namespace fe = cudnn_frontend;
  std::vector<Candidate> out;
  std::vector<std::string> tags;
  for (const cudnnBackendHeurMode_t mode : {CUDNN_HEUR_MODE_A, CUDNN_HEUR_MODE_FALLBACK}) {
    std::vector<fe::ManagedOpaqueDescriptor> cfgs;
    try {
      fe::EngineHeuristics heur = fe::EngineHeuristicsBuilder().setOperationGraph(og).setHeurMode(mode).build();
      cfgs = heur.getEngineConfig(heur.getEngineConfigCount());
    } catch (fe::cudnnException& e) {
      if (refused != nullptr) *refused = e.what();
      continue;
    }
    for (const fe::ManagedOpaqueDescriptor& cfg : cfgs) {
      if (out.size() >= max_plans) break;
      if (!engine_allowed(cfg, dtype)) continue;
      try {
        auto plan = std::make_shared<fe::ExecutionPlan>(
            fe::ExecutionPlanBuilder().setHandle(h).setEngineConfig(cfg, og.getTag()).build());
        if (std::find(tags.begin(), tags.end(), plan->getTag()) != tags.end()) continue;
        tags.push_back(plan->getTag());
        out.push_back({plan, static_cast<size_t>(plan->getWorkspaceSize())});
      } catch (fe::cudnnException& e) {
        if (refused != nullptr) *refused = e.what();
      }
    }
  }
  return out;
}

// The hot path: a variant pack over this call's `n` pointers (tagged with their tensors' uids) and
// the workspace, then an execute. Straight backend calls: cudnn-frontend's VariantPackBuilder
// would add heap allocations and exceptions to every convolution.
inline cudnnStatus_t execute_plan(cudnnHandle_t h, const Candidate& c, int64_t n, void* const* ptrs,
                                  const int64_t* uids, void* ws) {
  cudnnBackendDescriptor_t pack = nullptr;
  cudnnStatus_t st = cudnnBackendCreateDescriptor(CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR, &pack);
  if (st != CUDNN_STATUS_SUCCESS) return st;
  st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS, CUDNN_TYPE_VOID_PTR, n, ptrs);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS, CUDNN_TYPE_INT64, n, uids);
  if (st == CUDNN_STATUS_SUCCESS)
    st = cudnnBackendSetAttribute(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE, CUDNN_TYPE_VOID_PTR, 1, &ws);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendFinalize(pack);
  if (st == CUDNN_STATUS_SUCCESS) st = cudnnBackendExecute(h, c.plan->get_raw_desc(), pack);
  MINIDL_CUDNN_LOG(cudnnBackendDestroyDescriptor(pack));
  return st;
}

// Benchmark mode (torch.backends.cudnn.benchmark) for both paths: each candidate whose workspace
// fits `ws_bytes` runs cudnn_find_trials() times through `run(candidate, ws)` (an engine's first
// run in a process also loads its kernels, so one run may rank it by load time) and keeps its best
// time; the fastest goes first, the others follow in the heuristics' order as fallbacks. Returns
// false, leaving the order as it was, when none ran. The emulated device ranks by the plans' fake
// times (its event clock is the CPU's, which would rank them by noise).
template <class Run>
bool put_fastest_first(DeviceContext& ctx, std::vector<Candidate>& cands, void* ws, size_t ws_bytes, Run&& run) {
  std::vector<float> best(cands.size(), std::numeric_limits<float>::infinity());
  for (int trial = 0; trial < cudnn_find_trials(); ++trial) {
#ifdef MINIDL_CUDA_EMU
    const long long call = emu::cudnn_autotune_trial();
    (void)ctx;
#endif
    for (size_t i = 0; i < cands.size(); ++i) {
      if (cands[i].workspace > ws_bytes) continue;
#ifdef MINIDL_CUDA_EMU
      if (run(cands[i], ws) == CUDNN_STATUS_SUCCESS)
        best[i] = std::min(best[i], emu::cudnn_plan_time_ms(cands[i].plan->get_raw_desc(), call));
#else
      cudaEvent_t start = nullptr, stop = nullptr;
      MINIDL_CUDA_CHECK(cudaEventCreate(&start));
      MINIDL_CUDA_CHECK(cudaEventCreate(&stop));
      MINIDL_CUDA_CHECK(cudaEventRecord(start, ctx.stream()));
      const cudnnStatus_t st = run(cands[i], ws);
      MINIDL_CUDA_CHECK(cudaEventRecord(stop, ctx.stream()));
      MINIDL_CUDA_CHECK(cudaEventSynchronize(stop));
      float ms = 0;
      MINIDL_CUDA_CHECK(cudaEventElapsedTime(&ms, start, stop));
      MINIDL_CUDA_LOG(cudaEventDestroy(start));
      MINIDL_CUDA_LOG(cudaEventDestroy(stop));
      if (st == CUDNN_STATUS_SUCCESS) best[i] = std::min(best[i], ms);
#endif
    }
  }
  const auto fastest = std::min_element(best.begin(), best.end()) - best.begin();
  if (best.empty() || best[static_cast<size_t>(fastest)] == std::numeric_limits<float>::infinity()) return false;
  std::rotate(cands.begin(), cands.begin() + fastest, cands.begin() + fastest + 1);
  return true;
}

}  // namespace minidl::cuda
