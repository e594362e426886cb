// cuDNN stand-ins for the emulated device, the backend (graph) API, part 2: what finalizing each
// descriptor checks and derives, the engines, and cudnnBackendExecute. The emulator runs the
// operation graphs minidl builds, one convolution (forward, data gradient or filter gradient) with
// alpha / beta, on the reference convolutions; any other graph is refused at the heuristics with
// CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN. The engines are the legacy algorithm table's
// (cudnn_algos.cpp), each with FMA math and with tensor cores, so support rules, workspaces and
// determinism carry over, and a plan's execution runs the same checks as a legacy call.
#include <algorithm>
#include <cmath>

#include "cuda_emu/call_log.h"
#include "cuda_emu/cudnn_backend_internal.h"

namespace minidl::cuda::emu::detail {
namespace {

const char* kFinalize = "cudnnBackendFinalize";

std::vector<int64_t> ints(const BackendAttr* a) {
  std::vector<int64_t> v(a == nullptr ? 0 : static_cast<size_t>(a->count));
  if (!v.empty()) std::memcpy(v.data(), a->bytes.data(), v.size() * sizeof(int64_t));
  return v;
}
template <class T>
T scalar(const BackendAttr* a, T fallback) {
  if (a == nullptr || a->count < 1) return fallback;
  T v{};
  std::memcpy(&v, a->bytes.data(), sizeof v);
  return v;
}
// A scale (alpha, beta) set as FLOAT or DOUBLE.
double scale_of(const BackendAttr* a, double fallback) {
  if (a == nullptr || a->count < 1) return fallback;
  return a->type == CUDNN_TYPE_DOUBLE ? scalar<double>(a, fallback) : scalar<float>(a, 0.0f);
}
const BackendDesc* desc_of(const BackendAttr* a) { return a == nullptr || a->descs.empty() ? nullptr : a->descs[0].get(); }

cudnnStatus_t missing(const BackendDesc& d, const char* attr) {
  return fail(CUDNN_STATUS_BAD_PARAM, cat(kFinalize, ": ", descriptor_type_name(d.type), " descriptor: ", attr,
                                          " is not set"));
}
#define MINIDL_EMU_REQUIRE(d, name) \
  if (find_attr(d, name) == nullptr) return missing(d, #name)

cudnnStatus_t finalize_tensor(BackendDesc& d) {
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_TENSOR_DATA_TYPE);
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_TENSOR_DIMENSIONS);
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_TENSOR_STRIDES);
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_TENSOR_UNIQUE_ID);
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT);
  const std::vector<int64_t> dims = ints(find_attr(d, CUDNN_ATTR_TENSOR_DIMENSIONS));
  const std::vector<int64_t> strides = ints(find_attr(d, CUDNN_ATTR_TENSOR_STRIDES));
  if (dims.empty() || dims.size() > CUDNN_DIM_MAX || dims.size() != strides.size())
    return fail(CUDNN_STATUS_BAD_PARAM, cat(kFinalize, ": TENSOR: ", dims.size(), " dimensions and ", strides.size(),
                                            " strides (1 to ", CUDNN_DIM_MAX, ", as many of each)"));
  for (size_t i = 0; i < dims.size(); ++i)
    if (dims[i] <= 0 || strides[i] <= 0)
      return fail(CUDNN_STATUS_BAD_PARAM, cat(kFinalize, ": TENSOR: dimension ", i, " is ", dims[i], " with stride ",
                                              strides[i], " (both must be > 0)"));
  const int64_t align = scalar<int64_t>(find_attr(d, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT), 0);
  if (align <= 0 || (align & (align - 1)) != 0)
    return fail(CUDNN_STATUS_BAD_PARAM, cat(kFinalize, ": TENSOR: byte alignment ", align, " is not a power of two"));
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_convolution(BackendDesc& d) {
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_CONVOLUTION_COMP_TYPE);
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_CONVOLUTION_CONV_MODE);
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS);
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_CONVOLUTION_DILATIONS);
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES);
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS);
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS);
  const int64_t n = scalar<int64_t>(find_attr(d, CUDNN_ATTR_CONVOLUTION_SPATIAL_DIMS), 0);
  if (n < 1 || n > 3) return fail(CUDNN_STATUS_BAD_PARAM, cat(kFinalize, ": CONVOLUTION: ", n, " spatial dimensions"));
  for (const auto a : {CUDNN_ATTR_CONVOLUTION_DILATIONS, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES,
                       CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS}) {
    const std::vector<int64_t> v = ints(find_attr(d, a));
    const int64_t least = a == CUDNN_ATTR_CONVOLUTION_DILATIONS || a == CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES ? 1 : 0;
    if (static_cast<int64_t>(v.size()) != n || std::any_of(v.begin(), v.end(), [&](int64_t x) { return x < least; }))
      return fail(CUDNN_STATUS_BAD_PARAM, cat(kFinalize, ": CONVOLUTION: attribute ", static_cast<int>(a), " needs ", n,
                                              " values >= ", least));
  }
  return CUDNN_STATUS_SUCCESS;
}

// A backend tensor as the legacy struct the reference loads (any strides of a 4-d tensor).
cudnnTensorStruct tensor_struct(const BackendDesc& t) {
  const std::vector<int64_t> dims = ints(find_attr(t, CUDNN_ATTR_TENSOR_DIMENSIONS));
  const std::vector<int64_t> st = ints(find_attr(t, CUDNN_ATTR_TENSOR_STRIDES));
  cudnnTensorStruct s;
  s.set = true;
  s.dtype = scalar<cudnnDataType_t>(find_attr(t, CUDNN_ATTR_TENSOR_DATA_TYPE), CUDNN_DATA_FLOAT);
  s.n = static_cast<int>(dims[0]);
  s.c = static_cast<int>(dims[1]);
  s.h = static_cast<int>(dims[2]);
  s.w = static_cast<int>(dims[3]);
  s.ns = st[0];
  s.cs = st[1];
  s.hs = st[2];
  s.ws = st[3];
  return s;
}

// The filter as the legacy struct: packed KCRS (NCHW) or KRSC (NHWC); other strides leave the
// graph unsupported (the reference loads only those).
bool filter_struct(const BackendDesc& t, cudnnFilterStruct& f) {
  const cudnnTensorStruct s = tensor_struct(t);
  f.set = true;
  f.dtype = s.dtype;
  f.k = s.n;
  f.c = s.c;
  f.h = s.h;
  f.w = s.w;
  const int64_t c = s.c, r = s.h, q = s.w;
  if (s.ns == c * r * q && s.cs == r * q && s.hs == q && s.ws == 1) {
    f.format = CUDNN_TENSOR_NCHW;
    return true;
  }
  f.format = CUDNN_TENSOR_NHWC;
  return s.ns == r * q * c && s.cs == 1 && s.hs == q * c && s.ws == c;
}

// The attributes of each convolution operation: x-shaped, filter, y-shaped, convolution, alpha, beta.
struct OpAttrs {
  Dir dir;
  cudnnBackendAttributeName_t x, w, y, conv, alpha, beta;
};
OpAttrs op_attrs(cudnnBackendDescriptorType_t t) {
  switch (t) {
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR:
      return {Dir::Fwd, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_BETA};
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR:
      return {Dir::BwdData, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_CONV_DESC,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_ALPHA, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_BETA};
    default:
      return {Dir::BwdFilter, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_CONV_DESC, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_ALPHA,
              CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_BETA};
  }
}

// The convolution descriptor's 2-d geometry into the legacy struct; false (unsupported) for other
// spatial ranks and asymmetric padding, which the reference does not run.
bool conv_struct(const BackendDesc& c, cudnnConvolutionStruct& s, std::string& why) {
  const std::vector<int64_t> dil = ints(find_attr(c, CUDNN_ATTR_CONVOLUTION_DILATIONS));
  const std::vector<int64_t> st = ints(find_attr(c, CUDNN_ATTR_CONVOLUTION_FILTER_STRIDES));
  const std::vector<int64_t> pre = ints(find_attr(c, CUDNN_ATTR_CONVOLUTION_PRE_PADDINGS));
  const std::vector<int64_t> post = ints(find_attr(c, CUDNN_ATTR_CONVOLUTION_POST_PADDINGS));
  if (dil.size() != 2) {
    why = cat(dil.size(), "-d convolutions are not emulated (2-d only)");
    return false;
  }
  s.set = true;
  s.pad_h = static_cast<int>(pre[0]);
  s.pad_w = static_cast<int>(pre[1]);
  s.u = static_cast<int>(st[0]);
  s.v = static_cast<int>(st[1]);
  s.dil_h = static_cast<int>(dil[0]);
  s.dil_w = static_cast<int>(dil[1]);
  s.mode = scalar<cudnnConvolutionMode_t>(find_attr(c, CUDNN_ATTR_CONVOLUTION_CONV_MODE), CUDNN_CROSS_CORRELATION);
  s.compute = scalar<cudnnDataType_t>(find_attr(c, CUDNN_ATTR_CONVOLUTION_COMP_TYPE), CUDNN_DATA_FLOAT);
  if (pre != post) why = "asymmetric padding is not emulated";
  return why.empty();
}

// Checks an operation's operands against each other as cuDNN does and builds its graph.
cudnnStatus_t finalize_conv_op(BackendDesc& d) {
  const OpAttrs at = op_attrs(d.type);
  const BackendDesc* x = desc_of(find_attr(d, at.x));
  const BackendDesc* w = desc_of(find_attr(d, at.w));
  const BackendDesc* y = desc_of(find_attr(d, at.y));
  const BackendDesc* c = desc_of(find_attr(d, at.conv));
  if (x == nullptr || w == nullptr || y == nullptr || c == nullptr)
    return missing(d, "an operand or the convolution descriptor");
  for (const BackendDesc* t : {x, w, y})
    if (t->type != CUDNN_BACKEND_TENSOR_DESCRIPTOR || c->type != CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR)
      return fail(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE, cat(kFinalize, ": ", descriptor_type_name(d.type),
                                                              ": operands must be TENSOR descriptors and the "
                                                              "convolution a CONVOLUTION descriptor"));
  auto g = std::make_shared<ConvGraph>();
  g->dir = at.dir;
  g->alpha = scale_of(find_attr(d, at.alpha), 1.0);
  g->beta = scale_of(find_attr(d, at.beta), 0.0);
  g->uid_x = scalar<int64_t>(find_attr(*x, CUDNN_ATTR_TENSOR_UNIQUE_ID), 0);
  g->uid_w = scalar<int64_t>(find_attr(*w, CUDNN_ATTR_TENSOR_UNIQUE_ID), 0);
  g->uid_y = scalar<int64_t>(find_attr(*y, CUDNN_ATTR_TENSOR_UNIQUE_ID), 0);
  g->align_x = scalar<int64_t>(find_attr(*x, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT), 1);
  g->align_w = scalar<int64_t>(find_attr(*w, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT), 1);
  g->align_y = scalar<int64_t>(find_attr(*y, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT), 1);
  const size_t rank = ints(find_attr(*x, CUDNN_ATTR_TENSOR_DIMENSIONS)).size();
  if (rank != 4 || ints(find_attr(*w, CUDNN_ATTR_TENSOR_DIMENSIONS)).size() != 4 ||
      ints(find_attr(*y, CUDNN_ATTR_TENSOR_DIMENSIONS)).size() != 4) {
    g->unsupported = cat(rank, "-d operands are not emulated (4-d only)");
    d.graph = g;
    return CUDNN_STATUS_SUCCESS;
  }
  g->x = tensor_struct(*x);
  g->y = tensor_struct(*y);
  if (!filter_struct(*w, g->w)) g->unsupported = "the filter is neither packed KCRS nor packed KRSC";
  std::string why;
  if (!conv_struct(*c, g->conv, why) && g->unsupported.empty()) g->unsupported = why;
  if (g->w.c <= 0 || g->x.c % g->w.c != 0 || g->w.k % (g->x.c / g->w.c) != 0)
    return fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                cat(kFinalize, ": ", descriptor_type_name(d.type), ": input channels ", g->x.c, " and filter [", g->w.k,
                    ", ", g->w.c, ", ", g->w.h, ", ", g->w.w, "] give no whole group count"));
  g->conv.groups = g->x.c / g->w.c;
  d.graph = g;
  if (!g->unsupported.empty()) return CUDNN_STATUS_SUCCESS;
  // One data type for the three, a compute type that goes with it, y's dims what the convolution gives:
  // the legacy checks (cudnn_algos.cpp), run on the structs.
  Problem p = g->problem(false);
  if (g->x.dtype != g->w.dtype || g->x.dtype != g->y.dtype)
    return fail(CUDNN_STATUS_BAD_PARAM, cat(kFinalize, ": ", descriptor_type_name(d.type), ": data types differ (",
                                            dtype_name(g->x.dtype), ", ", dtype_name(g->w.dtype), ", ",
                                            dtype_name(g->y.dtype), ")"));
  int on = 0, oc = 0, oh = 0, ow = 0;
  if (cudnnStatus_t st = conv_output_dims(kFinalize, g->conv, g->x, g->w, on, oc, oh, ow); st != CUDNN_STATUS_SUCCESS)
    return st;
  if (g->y.n != on || g->y.c != oc || g->y.h != oh || g->y.w != ow)
    return fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                cat(kFinalize, ": ", descriptor_type_name(d.type), ": the y-shaped tensor is ", g->y.n, "x", g->y.c, "x",
                    g->y.h, "x", g->y.w, " but the convolution gives ", on, "x", oc, "x", oh, "x", ow));
  (void)p;
  return CUDNN_STATUS_SUCCESS;
}

// The graph minidl builds: one convolution. Anything else stays unsupported (refused at the heuristics).
cudnnStatus_t finalize_operation_graph(BackendDesc& d) {
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_OPERATIONGRAPH_OPS);
  const BackendAttr* ops = find_attr(d, CUDNN_ATTR_OPERATIONGRAPH_OPS);
  if (ops->count < 1) return fail(CUDNN_STATUS_BAD_PARAM, cat(kFinalize, ": OPERATIONGRAPH: no operations"));
  if (const BackendAttr* h = find_attr(d, CUDNN_ATTR_OPERATIONGRAPH_HANDLE)) {
    if (cudnnStatus_t st = check_handle(kFinalize, scalar<cudnnHandle_t>(h, nullptr)); st != CUDNN_STATUS_SUCCESS)
      return st;
  }
  const BackendDesc& op = *ops->descs[0];
  const bool conv = op.graph != nullptr;
  if (ops->count != 1 || !conv) {
    auto g = std::make_shared<ConvGraph>();
    g->unsupported = cat("graph pattern: ", ops->count, " operation(s), the first a ", descriptor_type_name(op.type),
                         " (the emulator runs one convolution: forward, data or filter gradient)");
    d.graph = g;
    return CUDNN_STATUS_SUCCESS;
  }
  const ConvGraph& g = *op.graph;
  if (g.unsupported.empty() && (g.uid_x == g.uid_w || g.uid_x == g.uid_y || g.uid_w == g.uid_y))
    return fail(CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES,
                cat(kFinalize, ": OPERATIONGRAPH: two different tensors share a unique id (", g.uid_x, ", ", g.uid_w,
                    ", ", g.uid_y, ")"));
  d.graph = op.graph;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t graph_supported(const char* what, const ConvGraph& g) {
  if (g.unsupported.empty()) return CUDNN_STATUS_SUCCESS;
  const bool pattern = g.unsupported.rfind("graph pattern", 0) == 0;
  return fail(pattern ? CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN : CUDNN_STATUS_NOT_SUPPORTED,
              cat(kFinalize, ": ", what, ": ", g.unsupported));
}

// The heuristics' ranking: tensor-core engines by fake speed, then FMA ones (modes INSTANT, A, B);
// the fallback list is the FMA engines in index order.
std::vector<int64_t> rank_engines(const ConvGraph& g, cudnnBackendHeurMode_t mode) {
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

// The pointer bound to `uid` in the pack, or nullptr with *found false.
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

}  // namespace

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

int64_t engine_count(const ConvGraph& g) { return 2 * static_cast<int64_t>(algo_count(g.dir)); }

cudnnStatus_t engine_support(const ConvGraph& g, int64_t engine, AlgoInfo& info) {
  if (cudnnStatus_t st = graph_supported("engine", g); st != CUDNN_STATUS_SUCCESS) return st;
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

cudnnStatus_t finalize_desc(BackendDesc& d) {
  switch (d.type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: return finalize_tensor(d);
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR: return finalize_convolution(d);
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR: return finalize_conv_op(d);
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: return finalize_operation_graph(d);
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
  void* ws = scalar<void*>(find_attr(pack, CUDNN_ATTR_VARIANT_PACK_WORKSPACE), nullptr);
  if (plan.workspace > 0 && ws == nullptr)
    return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, cat(fn, ": the plan needs a workspace of ", plan.workspace,
                                                         " bytes and the variant pack gives none"));
  if (!range_ok(ws, plan.workspace)) {
    report_fault(cat(fn, ": workspace [", ws, ", +", plan.workspace,
                     " bytes) is not inside one live device allocation (illegal address)"));
    return CUDNN_STATUS_EXECUTION_FAILED;
  }
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
