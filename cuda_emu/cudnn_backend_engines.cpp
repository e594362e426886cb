// cuDNN stand-ins for the emulated device, the backend (graph) API, part 3: the engines of a
// finalized operation graph (the legacy algorithm table's, each with FMA math and with tensor
// cores), the heuristics' ranking, engine configs, execution plans and variant packs, the
// attributes they derive, and cudnnBackendExecute, which runs a plan with the legacy call's checks
// and reference convolution after checking every unique id, alignment and the workspace.
#include <algorithm>
#include <cmath>
#include <cstdint>

#include "cuda_emu/call_log.h"
#include "cuda_emu/cudnn_backend_fused.h"
#include "cuda_emu/cudnn_backend_internal.h"

namespace minidl::cuda::emu::detail {
namespace {

cudnnStatus_t graph_supported(const char* what, const ConvGraph& g) {
  if (g.unsupported.empty()) return CUDNN_STATUS_SUCCESS;
  const bool pattern = g.unsupported.rfind("graph pattern", 0) == 0;
  return fail(pattern ? CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN : CUDNN_STATUS_NOT_SUPPORTED,
              cat(kFinalize, ": ", what, ": ", g.unsupported));
}

// The heuristics' ranking: tensor-core engines by fake speed, then FMA ones (modes INSTANT, A, B);
// the fallback list is the FMA engines in index order.
std::vector<int64_t> rank_engines(const ConvGraph& g, cudnnBackendHeurMode_t mode) {
  if (g.fused != nullptr) return {0};   // one fused engine, in every mode
  std::vector<int64_t> out;
  const int n = algo_count(g.dir);
  AlgoInfo info;
  for (const bool tc : {true, false}) {
    if (mode == CUDNN_HEUR_MODE_FALLBACK && tc) continue;
    const Problem p = g.problem(tc);
    std::vector<int> order = ranked_algos(g.dir, p, p.math);
    if (mode == CUDNN_HEUR_MODE_FALLBACK) std::sort(order.begin(), order.end());
    for (const int algo : order) {
      const int64_t e = algo + (tc ? n : 0);
      if (engine_support(g, e, info) == CUDNN_STATUS_SUCCESS) out.push_back(e);
    }
  }
  return out;
}

cudnnStatus_t finalize_heuristics(BackendDesc& d) {
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH);
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_ENGINEHEUR_MODE);
  const BackendDesc* og = desc_of(find_attr(d, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH));
  if (og->type != CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR || og->graph == nullptr)
    return fail(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE, cat(kFinalize, ": ENGINEHEUR: not an OPERATIONGRAPH"));
  if (cudnnStatus_t st = graph_supported("ENGINEHEUR", *og->graph); st != CUDNN_STATUS_SUCCESS) return st;
  const auto mode = scalar<cudnnBackendHeurMode_t>(find_attr(d, CUDNN_ATTR_ENGINEHEUR_MODE), CUDNN_HEUR_MODE_INSTANT);
  if (raw_enum(mode) < 0 || raw_enum(mode) >= CUDNN_HEUR_MODES_COUNT)
    return fail(CUDNN_STATUS_BAD_PARAM, cat(kFinalize, ": ENGINEHEUR: mode ", raw_enum(mode)));
  ++cudnn_query_count();
  d.graph = og->graph;
  d.results = rank_engines(*og->graph, mode);
  return CUDNN_STATUS_SUCCESS;
}

BackendAttr int_attr(int64_t v) {
  BackendAttr a;
  a.type = CUDNN_TYPE_INT64;
  a.count = 1;
  a.bytes.resize(sizeof v);
  std::memcpy(a.bytes.data(), &v, sizeof v);
  return a;
}
BackendAttr desc_attr(std::shared_ptr<const BackendDesc> d) {
  BackendAttr a;
  a.type = CUDNN_TYPE_BACKEND_DESCRIPTOR;
  a.count = 1;
  a.descs.push_back(std::move(d));
  return a;
}

// A finalized engine descriptor of the heuristics' op graph, and an engine config holding it.
std::shared_ptr<const BackendDesc> engine_config(const BackendDesc& heur, int64_t e) {
  BackendDesc eng;
  eng.type = CUDNN_BACKEND_ENGINE_DESCRIPTOR;
  eng.finalized = true;
  eng.graph = heur.graph;
  eng.engine = e;
  eng.attrs[CUDNN_ATTR_ENGINE_OPERATION_GRAPH] = find_attr(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH) != nullptr
                                                     ? *find_attr(heur, CUDNN_ATTR_ENGINEHEUR_OPERATION_GRAPH)
                                                     : BackendAttr{};
  eng.attrs[CUDNN_ATTR_ENGINE_GLOBAL_INDEX] = int_attr(e);
  auto cfg = std::make_shared<BackendDesc>();
  cfg->type = CUDNN_BACKEND_ENGINECFG_DESCRIPTOR;
  cfg->finalized = true;
  cfg->graph = heur.graph;
  cfg->engine = e;
  cfg->attrs[CUDNN_ATTR_ENGINECFG_ENGINE] = desc_attr(std::make_shared<const BackendDesc>(std::move(eng)));
  return cfg;
}

cudnnStatus_t finalize_engine(BackendDesc& d) {
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_ENGINE_OPERATION_GRAPH);
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_ENGINE_GLOBAL_INDEX);
  const BackendDesc* og = desc_of(find_attr(d, CUDNN_ATTR_ENGINE_OPERATION_GRAPH));
  if (og->graph == nullptr)
    return fail(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE, cat(kFinalize, ": ENGINE: not an OPERATIONGRAPH"));
  if (cudnnStatus_t st = graph_supported("ENGINE", *og->graph); st != CUDNN_STATUS_SUCCESS) return st;
  const int64_t e = scalar<int64_t>(find_attr(d, CUDNN_ATTR_ENGINE_GLOBAL_INDEX), -1);
  if (e < 0 || e >= engine_count(*og->graph))
    return fail(CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND, cat(kFinalize, ": ENGINE: global index ", e, " is not in [0, ",
                                                         engine_count(*og->graph), ")"));
  AlgoInfo info;
  if (cudnnStatus_t st = engine_support(*og->graph, e, info); st != CUDNN_STATUS_SUCCESS) return st;
  d.graph = og->graph;
  d.engine = e;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_engine_config(BackendDesc& d) {
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_ENGINECFG_ENGINE);
  const BackendDesc* eng = desc_of(find_attr(d, CUDNN_ATTR_ENGINECFG_ENGINE));
  if (eng->type != CUDNN_BACKEND_ENGINE_DESCRIPTOR || eng->graph == nullptr)
    return fail(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE, cat(kFinalize, ": ENGINECFG: not an ENGINE"));
  if (const BackendAttr* k = find_attr(d, CUDNN_ATTR_ENGINECFG_KNOB_CHOICES); k != nullptr && k->count > 0)
    return fail(CUDNN_STATUS_NOT_SUPPORTED, cat(kFinalize, ": ENGINECFG: engine ", eng->engine,
                                                " has no knobs (the emulated engines have none)"));
  d.graph = eng->graph;
  d.engine = eng->engine;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_plan(BackendDesc& d) {
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG);
  const BackendDesc* cfg = desc_of(find_attr(d, CUDNN_ATTR_EXECUTION_PLAN_ENGINE_CONFIG));
  if (cfg->type != CUDNN_BACKEND_ENGINECFG_DESCRIPTOR || cfg->graph == nullptr)
    return fail(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE, cat(kFinalize, ": EXECUTION_PLAN: not an ENGINECFG"));
  AlgoInfo info;
  if (cudnnStatus_t st = engine_support(*cfg->graph, cfg->engine, info); st != CUDNN_STATUS_SUCCESS) return st;
  d.graph = cfg->graph;
  d.engine = cfg->engine;
  d.workspace = info.workspace;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_variant_pack(BackendDesc& d) {
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS);
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
  std::vector<int64_t> uids = ints(find_attr(d, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS));
  if (static_cast<int64_t>(uids.size()) != find_attr(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS)->count)
    return fail(CUDNN_STATUS_BAD_PARAM, cat(kFinalize, ": VARIANT_PACK: ", uids.size(), " unique ids but ",
                                            find_attr(d, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS)->count, " pointers"));
  std::sort(uids.begin(), uids.end());
  if (std::adjacent_find(uids.begin(), uids.end()) != uids.end())
    return fail(CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES, cat(kFinalize, ": VARIANT_PACK: a unique id appears twice"));
  return CUDNN_STATUS_SUCCESS;
}


}  // namespace

void* bound(const BackendDesc& pack, int64_t uid, bool& found) {
  const std::vector<int64_t> uids = ints(find_attr(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS));
  const BackendAttr* ptrs = find_attr(pack, CUDNN_ATTR_VARIANT_PACK_DATA_POINTERS);
  for (size_t i = 0; i < uids.size(); ++i) {
    if (uids[i] != uid) continue;
    found = true;
    void* p = nullptr;
    std::memcpy(&p, ptrs->bytes.data() + i * sizeof(void*), sizeof p);
    return p;
  }
  found = false;
  return nullptr;
}

cudnnStatus_t plan_workspace(const char* fn, const BackendDesc& plan, const BackendDesc& pack, void*& ws) {
  ws = scalar<void*>(find_attr(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE), nullptr);
  if (plan.workspace > 0 && ws == nullptr)
    return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, cat(fn, ": the plan needs a workspace of ", plan.workspace,
                                                         " bytes and the variant pack gives none"));
  if (!range_ok(ws, plan.workspace)) {
    report_fault(cat(fn, ": workspace [", ws, ", +", plan.workspace,
                     " bytes) is not inside one live device allocation (illegal address)"));
    return CUDNN_STATUS_EXECUTION_FAILED;
  }
  return CUDNN_STATUS_SUCCESS;
}

Problem ConvGraph::problem(bool tensor_cores) const {
  Problem p;
  p.g = {x.n, x.c, x.h, x.w, w.k, w.h, w.w, y.h, y.w, conv.groups, conv.pad_h, conv.pad_w,
         conv.u, conv.v, conv.dil_h, conv.dil_w, conv.mode == CUDNN_CONVOLUTION};
  p.dtype = x.dtype;
  elem_of(x.dtype, p.elem);
  p.math = tensor_cores ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
  p.x = &x;
  p.w = &w;
  p.y = &y;
  return p;
}

int64_t engine_count(const ConvGraph& g) {
  return g.fused != nullptr ? 1 : 2 * static_cast<int64_t>(algo_count(g.dir));
}

cudnnStatus_t engine_support(const ConvGraph& g, int64_t engine, AlgoInfo& info) {
  if (cudnnStatus_t st = graph_supported("engine", g); st != CUDNN_STATUS_SUCCESS) return st;
  if (g.fused != nullptr) {
    info = AlgoInfo{};
    info.name = "fused";
    info.workspace = g.fused->workspace;
    return engine == 0 ? CUDNN_STATUS_SUCCESS
                       : fail(CUDNN_STATUS_BAD_PARAM_OUT_OF_BOUND, cat("engine ", engine, " of a fused graph (one engine)"));
  }
  const int n = algo_count(g.dir);
  const bool tc = engine >= n;
  const Problem p = g.problem(tc);
  info = algo_info(g.dir, static_cast<int>(engine % n), p, p.math);
  if (tc && g.x.dtype == CUDNN_DATA_DOUBLE)
    return fail(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, cat("engine ", engine, " (", info.name,
                                                          " on tensor cores) does not run DOUBLE data"));
  Elem e{};
  const cudnnDataType_t ct = g.conv.compute;
  if (!elem_of(g.x.dtype, e) || e == Elem::I8 || e == Elem::I32 ||
      (g.x.dtype == CUDNN_DATA_DOUBLE) != (ct == CUDNN_DATA_DOUBLE))
    return fail(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, cat("engine ", engine, ": data type ", dtype_name(g.x.dtype),
                                                          " with compute type ", dtype_name(ct), " is not supported"));
  if (info.status != CUDNN_STATUS_SUCCESS)
    return fail(info.status, cat("engine ", engine, " (", info.name, ") does not support this graph: ", info.why));
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_engine_desc(BackendDesc& d) {
  switch (d.type) {
    case CUDNN_BACKEND_ENGINEHEUR_DESCRIPTOR: return finalize_heuristics(d);
    case CUDNN_BACKEND_ENGINE_DESCRIPTOR: return finalize_engine(d);
    case CUDNN_BACKEND_ENGINECFG_DESCRIPTOR: return finalize_engine_config(d);
    case CUDNN_BACKEND_EXECUTION_PLAN_DESCRIPTOR: return finalize_plan(d);
    case CUDNN_BACKEND_VARIANT_PACK_DESCRIPTOR: return finalize_variant_pack(d);
    default: return CUDNN_STATUS_SUCCESS;   // kept as set; a graph using them is refused at the heuristics
  }
}

bool derived_attr(const BackendDesc& d, cudnnBackendAttributeName_t name, BackendAttr& out) {
  switch (static_cast<int>(name)) {
    case CUDNN_ATTR_OPERATIONGRAPH_ENGINE_GLOBAL_COUNT:
      out = int_attr(d.graph != nullptr && d.graph->unsupported.empty() ? engine_count(*d.graph) : 0);
      return true;
    case CUDNN_ATTR_ENGINEHEUR_RESULTS:
      out.type = CUDNN_TYPE_BACKEND_DESCRIPTOR;
      out.count = static_cast<int64_t>(d.results.size());
      for (const int64_t e : d.results) out.descs.push_back(engine_config(d, e));
      return true;
    case CUDNN_ATTR_ENGINE_NUMERICAL_NOTE: {
      // Tensor cores; f32 inputs rounded to TF32 there; atomics (a sum order that varies) for the
      // non-deterministic algorithms.
      std::vector<int> notes;
      if (d.graph->fused != nullptr) {   // f16 / bf16 fusions run on tensor cores, f32 ones exactly (FMA)
        const GraphOp* c = d.graph->fused->conv();
        if (c != nullptr && c->conv->w.dtype != CUDNN_DATA_FLOAT) notes.push_back(CUDNN_NUMERICAL_NOTE_TENSOR_CORE);
        out.type = CUDNN_TYPE_NUMERICAL_NOTE;
        out.count = static_cast<int64_t>(notes.size());
        out.bytes.resize(notes.size() * sizeof(int));
        if (!notes.empty()) std::memcpy(out.bytes.data(), notes.data(), out.bytes.size());
        return true;
      }
      AlgoInfo info;
      const bool tc = d.engine >= algo_count(d.graph->dir);
      engine_support(*d.graph, d.engine, info);
      if (tc) notes.push_back(CUDNN_NUMERICAL_NOTE_TENSOR_CORE);
      if (tc && d.graph->x.dtype == CUDNN_DATA_FLOAT) notes.push_back(CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS);
      if (info.determinism == CUDNN_NON_DETERMINISTIC) notes.push_back(CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC);
      out.type = CUDNN_TYPE_NUMERICAL_NOTE;
      out.count = static_cast<int64_t>(notes.size());
      out.bytes.resize(notes.size() * sizeof(int));
      if (!notes.empty()) std::memcpy(out.bytes.data(), notes.data(), out.bytes.size());
      return true;
    }
    case CUDNN_ATTR_EXECUTION_PLAN_WORKSPACE_SIZE:
      out = int_attr(static_cast<int64_t>(d.workspace));
      return true;
    case CUDNN_ATTR_EXECUTION_PLAN_JSON_REPRESENTATION: {
      const std::string json = cat("{\"emulated_engine\":", d.engine, "}");
      out.type = CUDNN_TYPE_CHAR;
      out.count = static_cast<int64_t>(json.size() + 1);
      out.bytes.assign(json.c_str(), json.c_str() + json.size() + 1);
      return true;
    }
    default: return false;
  }
}

// Every tensor of the graph bound (and nothing else), each pointer aligned as its tensor says, the
// plan's workspace given and inside live memory; then the legacy execution's checks and reference.
cudnnStatus_t execute_plan(cudnnHandle_t h, const BackendDesc& plan, const BackendDesc& pack) {
  const char* fn = "cudnnBackendExecute";
  const ConvGraph& g = *plan.graph;
  if (g.fused != nullptr) return execute_fused(h, plan, pack);
  const std::vector<int64_t> uids = ints(find_attr(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS));
  struct Operand {
    const char* name;
    int64_t uid, align;
    void* ptr = nullptr;
  };
  const bool bwd_data = g.dir == Dir::BwdData, bwd_filter = g.dir == Dir::BwdFilter;
  Operand ops[3] = {{bwd_data ? "dx" : "x", g.uid_x, g.align_x},
                    {bwd_filter ? "dw" : "w", g.uid_w, g.align_w},
                    {g.dir == Dir::Fwd ? "y" : "dy", g.uid_y, g.align_y}};
  for (Operand& o : ops) {
    bool found = false;
    o.ptr = bound(pack, o.uid, found);
    if (!found)
      return fail(CUDNN_STATUS_BAD_PARAM, cat(fn, ": the variant pack binds no pointer to unique id ", o.uid, " (",
                                              o.name, ")"));
    if (reinterpret_cast<uintptr_t>(o.ptr) % static_cast<uintptr_t>(o.align) != 0)
      return fail(CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER,
                  cat(fn, ": ", o.name, " = ", o.ptr, " is not aligned to the ", o.align,
                      " bytes its tensor descriptor promises (CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT)"));
  }
  for (const int64_t u : uids)
    if (u != g.uid_x && u != g.uid_w && u != g.uid_y)
      return fail(CUDNN_STATUS_BAD_PARAM, cat(fn, ": unique id ", u, " of the variant pack is no tensor of the plan's graph"));
  void* ws = nullptr;
  if (cudnnStatus_t st = plan_workspace(fn, plan, pack, ws); st != CUDNN_STATUS_SUCCESS) return st;
  AlgoInfo info;
  if (cudnnStatus_t st = engine_support(g, plan.engine, info); st != CUDNN_STATUS_SUCCESS) return st;
  const bool tc = plan.engine >= algo_count(g.dir);
  const Problem p = g.problem(tc);
  const float a32 = static_cast<float>(g.alpha), b32 = static_cast<float>(g.beta);
  const bool f64 = g.x.dtype == CUDNN_DATA_DOUBLE;
  const void* alpha = f64 ? static_cast<const void*>(&g.alpha) : &a32;
  const void* beta = f64 ? static_cast<const void*>(&g.beta) : &b32;
  const void* in_a = bwd_data ? ops[2].ptr : ops[0].ptr;
  const void* in_b = bwd_filter ? ops[2].ptr : ops[1].ptr;
  void* out = g.dir == Dir::Fwd ? ops[2].ptr : bwd_data ? ops[0].ptr : ops[1].ptr;
  const size_t scratch = plan.workspace;
  const char* name = info.name;
  const bool accumulate = g.beta != 0.0;
  const cudaStream_t stream = h->stream;
  return run_conv(fn, h, g.dir, p, alpha, in_a, in_b, beta, out, [=](const Problem& q) {
    if (call_logging()) log_conv(g.dir, q, name, scratch, accumulate, stream);
    // The engine's scratch is garbage afterwards: a workspace that overlaps live data shows.
    if (scratch > 0) std::fill_n(static_cast<unsigned char*>(ws), scratch, static_cast<unsigned char>(0xA5));
  });
}

}  // namespace minidl::cuda::emu::detail
