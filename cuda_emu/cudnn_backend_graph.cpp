// cuDNN stand-ins for the emulated device, the backend (graph) API, part 2: what finalizing the
// descriptors of an operation graph (tensors, the convolution, its operation, the graph) checks and
// derives; the engines, heuristics, plans and cudnnBackendExecute are cudnn_backend_engines.cpp's. The emulator runs the
// operation graphs minidl builds, one convolution (forward, data gradient or filter gradient) with
// alpha / beta, on the reference convolutions; a graph of several operations goes to
// cudnn_backend_fused_graph.cpp, which accepts the batch-norm fusions and leaves the rest to be
// refused at the heuristics with CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN. The engines are the legacy algorithm table's
// (cudnn_algos.cpp), each with FMA math and with tensor cores, so support rules, workspaces and
// determinism carry over, and a plan's execution runs the same checks as a legacy call.
#include <algorithm>
#include <cmath>

#include "cuda_emu/call_log.h"
#include "cuda_emu/cudnn_backend_fused.h"
#include "cuda_emu/cudnn_backend_internal.h"

namespace minidl::cuda::emu::detail {
namespace {

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
  if (scalar<bool>(find_attr(d, CUDNN_ATTR_TENSOR_IS_VIRTUAL), false) &&
      scalar<bool>(find_attr(d, CUDNN_ATTR_TENSOR_IS_BY_VALUE), false))
    return fail(CUDNN_STATUS_BAD_PARAM, cat(kFinalize, ": TENSOR: a tensor is virtual or by value, not both"));
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

bool is_virtual(const BackendDesc& t) { return scalar<bool>(find_attr(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL), false); }

// The convolution as one operation of a fused graph: its tensors, what it reads and writes.
std::shared_ptr<const GraphOp> conv_op(const BackendDesc& d, const OpAttrs& at, std::shared_ptr<const ConvGraph> g,
                                       const BackendDesc& x, const BackendDesc& w, const BackendDesc& y) {
  auto op = std::make_shared<GraphOp>();
  op->kind = at.dir == Dir::Fwd ? OpKind::ConvFwd : at.dir == Dir::BwdData ? OpKind::ConvBwdData : OpKind::ConvBwdFilter;
  op->type = d.type;
  op->conv = std::move(g);
  op->slot[at.x] = graph_tensor(x);
  op->slot[at.w] = graph_tensor(w);
  op->slot[at.y] = graph_tensor(y);
  const int out = at.dir == Dir::Fwd ? at.y : at.dir == Dir::BwdData ? at.x : at.w;
  op->outputs = {out};
  for (const int a : {static_cast<int>(at.x), static_cast<int>(at.w), static_cast<int>(at.y)})
    if (a != out) op->inputs.push_back(a);
  if (op->conv->beta != 0.0) op->inputs.push_back(out);   // read back: out = alpha * conv + beta * out
  return op;
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
  if (!g->unsupported.empty()) {
    d.op = conv_op(d, at, g, *x, *w, *y);
    return CUDNN_STATUS_SUCCESS;
  }
  // One data type for the three, a compute type that goes with it, y's dims what the convolution gives:
  // the legacy checks (cudnn_algos.cpp), run on the structs.
  // A virtual operand (a fused graph's intermediate) may hold FLOAT instead.
  const bool x_virtual = is_virtual(*x), y_virtual = is_virtual(*y);
  const cudnnDataType_t dt = g->w.dtype;
  if ((g->x.dtype != dt && !(x_virtual && g->x.dtype == CUDNN_DATA_FLOAT)) ||
      (g->y.dtype != dt && !(y_virtual && g->y.dtype == CUDNN_DATA_FLOAT)))
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
  d.op = conv_op(d, at, g, *x, *w, *y);
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
  const bool plain = conv && (op.op == nullptr || std::none_of(op.op->slot.begin(), op.op->slot.end(), [](const auto& s) {
                                return s.second.is_virtual;
                              }));
  if (ops->count != 1 || !plain) {   // a fused graph (cudnn_backend_fused_graph.cpp)
    auto g = std::make_shared<ConvGraph>();
    if (cudnnStatus_t st = finalize_fused_graph(*ops, *g); st != CUDNN_STATUS_SUCCESS) return st;
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

}  // namespace

cudnnStatus_t finalize_desc(BackendDesc& d) {
  switch (d.type) {
    case CUDNN_BACKEND_TENSOR_DESCRIPTOR: return finalize_tensor(d);
    case CUDNN_BACKEND_CONVOLUTION_DESCRIPTOR: return finalize_convolution(d);
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR: return finalize_conv_op(d);
    case CUDNN_BACKEND_OPERATIONGRAPH_DESCRIPTOR: return finalize_operation_graph(d);
    case CUDNN_BACKEND_POINTWISE_DESCRIPTOR: return finalize_pointwise_desc(d);
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_BN_FINALIZE_STATISTICS_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR:
    case CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR: return finalize_fused_op(d);
    default: return finalize_engine_desc(d);   // heuristics, engines, plans, variant packs (cudnn_backend_engines.cpp)
  }
}

}  // namespace minidl::cuda::emu::detail
