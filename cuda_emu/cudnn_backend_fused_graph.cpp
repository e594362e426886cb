// cuDNN stand-ins for the emulated device, the backend (graph) API, part 5: an operation graph of
// several operations. Finalizing it checks what cuDNN checks of any graph (one descriptor per
// unique id, each tensor written by one operation, every virtual tensor written and read, no
// cycle), orders the operations, and names the fused pattern it matches: the ResNet batch-norm
// fusions the emulator runs (docs/cuda/emulated_graph_api.md, "Fused graphs"). Any other graph is
// marked unsupported, and the heuristics refuse it with CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN.
#include <algorithm>
#include <set>

#include "cuda_emu/cudnn_backend_fused.h"

namespace minidl::cuda::emu::detail {
namespace {

// Who writes and who reads each tensor.
struct Wiring {
  std::map<int64_t, size_t> producer;
  std::map<int64_t, int> readers;
};

bool per_channel(const GraphTensor& t, int64_t c) {
  if (t.is_virtual || t.dims.size() < 2 || t.dims[1] != c) return false;
  for (size_t i = 0; i < t.dims.size(); ++i)
    if (i != 1 && t.dims[i] != 1) return false;
  return true;
}

// The pointwise operations that load a convolution's (or a ReLU gradient's) input: walking back from
// `uid` through operations of `modes`, each with the running activation as one operand and a
// per-channel tensor (scale, bias, mean, ...) as the other, or unary (ReLU). Marks them used and
// returns the non-virtual tensor the chain starts from.
int64_t walk_prologue(const FusedGraph& g, const Wiring& w, int64_t uid, const std::set<int>& modes,
                      std::vector<bool>& used) {
  for (;;) {
    const auto p = w.producer.find(uid);
    if (p == w.producer.end()) return uid;
    const GraphOp& op = g.ops[p->second];
    if (op.kind != OpKind::Pointwise || modes.count(raw_enum(op.mode)) == 0 || used[p->second] ||
        w.readers.at(uid) != 1)
      return uid;
    const GraphTensor& x = op.slot.at(CUDNN_ATTR_OPERATION_POINTWISE_XDESC);
    const GraphTensor& y = op.slot.at(CUDNN_ATTR_OPERATION_POINTWISE_YDESC);
    int64_t next = x.uid;
    if (op.has(CUDNN_ATTR_OPERATION_POINTWISE_BDESC)) {
      const GraphTensor& b = op.slot.at(CUDNN_ATTR_OPERATION_POINTWISE_BDESC);
      const bool x_main = x.dims == y.dims && per_channel(b, y.dims[1]);
      const bool b_main = b.dims == y.dims && per_channel(x, y.dims[1]) && op.mode != CUDNN_POINTWISE_SUB;
      if (!x_main && !b_main) return uid;
      next = x_main ? x.uid : b.uid;
    } else if (x.dims != y.dims) {
      return uid;
    }
    used[p->second] = true;
    uid = next;
  }
}

// Fused convolutions run channels-last: x and y NHWC, the filter KRSC, in f16, bf16 or f32.
std::string fused_conv_unsupported(const GraphOp& conv) {
  const ConvGraph& c = *conv.conv;
  if (!c.unsupported.empty()) return c.unsupported;
  const auto nhwc = [](const cudnnTensorStruct& t) { return t.cs == 1 && t.ws == t.c && t.hs == t.ws * t.w; };
  if (!nhwc(c.x) || !nhwc(c.y) || c.w.format != CUDNN_TENSOR_NHWC)
    return "a fused convolution needs NHWC activations and a KRSC filter";
  const cudnnDataType_t dt = c.w.dtype;
  if (dt != CUDNN_DATA_HALF && dt != CUDNN_DATA_BFLOAT16 && dt != CUDNN_DATA_FLOAT)
    return cat("a fused convolution runs HALF, BFLOAT16 or FLOAT data, not ", dtype_name(dt));
  return "";
}

const std::set<int> kLoadModes = {CUDNN_POINTWISE_MUL, CUDNN_POINTWISE_ADD, CUDNN_POINTWISE_SUB,
                                  CUDNN_POINTWISE_RELU_FWD};
const std::set<int> kNormalizeModes = {CUDNN_POINTWISE_MUL, CUDNN_POINTWISE_ADD, CUDNN_POINTWISE_SUB};

// The convolution patterns; marks the operations they account for. "" or why the graph is none.
std::string match_conv(const FusedGraph& g, const Wiring& w, size_t ci, std::vector<bool>& used, std::string& name) {
  const GraphOp& conv = g.ops[ci];
  used[ci] = true;
  if (conv.kind == OpKind::ConvFwd) {
    walk_prologue(g, w, conv.uid(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X), kLoadModes, used);
    const GraphTensor& y = conv.slot.at(CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y);
    if (y.is_virtual) return "the convolution's output must be stored (a non-virtual y)";
    for (size_t i = 0; i < g.ops.size(); ++i)
      if (g.ops[i].kind == OpKind::GenStats && g.ops[i].uid(CUDNN_ATTR_OPERATION_GENSTATS_XDESC) == y.uid) used[i] = true;
    name = "scale_bias_relu_conv_genstats";
    return "";
  }
  if (conv.kind == OpKind::ConvBwdFilter) {
    walk_prologue(g, w, conv.uid(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X), kLoadModes, used);
    name = "scale_bias_relu_wgrad";
    return "";
  }
  // The data gradient, its ReLU's backward against the batch-norm output recomputed from the BN's
  // input, and the batch norm's weight gradient of that.
  const int64_t dx = conv.uid(CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX);
  name = "dgrad_drelu_dbn_weight";
  for (size_t i = 0; i < g.ops.size(); ++i) {
    const GraphOp& op = g.ops[i];
    if (op.kind != OpKind::Pointwise || op.mode != CUDNN_POINTWISE_RELU_BWD ||
        op.uid(CUDNN_ATTR_OPERATION_POINTWISE_DYDESC) != dx)
      continue;
    used[i] = true;
    const int64_t src = walk_prologue(g, w, op.uid(CUDNN_ATTR_OPERATION_POINTWISE_XDESC), kNormalizeModes, used);
    const int64_t drelu = op.uid(CUDNN_ATTR_OPERATION_POINTWISE_DXDESC);
    for (size_t j = 0; j < g.ops.size(); ++j) {
      const GraphOp& bw = g.ops[j];
      if (bw.kind == OpKind::BnBwdWeights && bw.uid(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DY_DESC) == drelu &&
          bw.uid(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_X_DESC) == src)
        used[j] = true;
    }
  }
  return "";
}

// The one operation reading `uid`, or g.ops.size() when none or several do.
size_t only_reader(const FusedGraph& g, const Wiring& w, int64_t uid) {
  const auto r = w.readers.find(uid);
  if (r == w.readers.end() || r->second != 1) return g.ops.size();
  for (size_t i = 0; i < g.ops.size(); ++i)
    for (const int a : g.ops[i].inputs)
      if (g.ops[i].uid(a) == uid) return i;
  return g.ops.size();
}

// A block's last batch norm: the normalization, then optionally the residual's ADD (a stored tensor
// of y's shape) and the ReLU. Backward: the ReLU's gradient (RELU_BWD against the stored forward
// output, or MUL by a stored mask) into the batch norm's backward.
void match_norm(const FusedGraph& g, const Wiring& w, size_t ni, std::vector<bool>& used, std::string& name) {
  const GraphOp& norm = g.ops[ni];
  used[ni] = true;
  if (norm.kind == OpKind::NormFwd) {
    name = "bn_add_relu";
    int64_t cur = norm.uid(CUDNN_ATTR_OPERATION_NORM_FWD_YDESC);
    for (int step = 0; step < 2; ++step) {
      const size_t i = only_reader(g, w, cur);
      if (i == g.ops.size() || g.ops[i].kind != OpKind::Pointwise) return;
      const GraphOp& op = g.ops[i];
      const bool add = step == 0 && op.mode == CUDNN_POINTWISE_ADD && op.has(CUDNN_ATTR_OPERATION_POINTWISE_BDESC) &&
                       op.slot.at(CUDNN_ATTR_OPERATION_POINTWISE_BDESC).dims ==
                           op.slot.at(CUDNN_ATTR_OPERATION_POINTWISE_XDESC).dims;
      if (!add && op.mode != CUDNN_POINTWISE_RELU_FWD) return;
      used[i] = true;
      cur = op.uid(CUDNN_ATTR_OPERATION_POINTWISE_YDESC);
      if (!add) return;
    }
    return;
  }
  name = "drelu_dbn";
  const auto p = w.producer.find(norm.uid(CUDNN_ATTR_OPERATION_NORM_BWD_DYDESC));
  if (p == w.producer.end() || g.ops[p->second].kind != OpKind::Pointwise) return;
  const GraphOp& op = g.ops[p->second];
  const bool mask = op.mode == CUDNN_POINTWISE_MUL && op.has(CUDNN_ATTR_OPERATION_POINTWISE_BDESC) &&
                    op.slot.at(CUDNN_ATTR_OPERATION_POINTWISE_BDESC).dims ==
                        op.slot.at(CUDNN_ATTR_OPERATION_POINTWISE_XDESC).dims;
  if (mask || op.mode == CUDNN_POINTWISE_RELU_BWD) used[p->second] = true;
}

// "", or the first operation the matched pattern does not account for.
std::string first_unused(const FusedGraph& g, const std::vector<bool>& used) {
  for (size_t i = 0; i < g.ops.size(); ++i)
    if (!used[i])
      return cat("operation ", i, " (", op_kind_name(g.ops[i].kind),
                 g.ops[i].kind == OpKind::Pointwise ? cat(" mode ", raw_enum(g.ops[i].mode)) : std::string(),
                 ") is not part of the ", g.pattern, " pattern");
  return "";
}

// The pattern g matches, or why none: one bn-finalize alone, a batch norm with its add and ReLU
// (or their gradients), or one convolution with the operations its pattern allows, and nothing else.
std::string classify(FusedGraph& g, const Wiring& w) {
  if (g.ops.size() == 1 && g.ops[0].kind == OpKind::BnFinalize) {
    g.pattern = "bn_finalize";
    return "";
  }
  std::vector<size_t> norms;
  for (size_t i = 0; i < g.ops.size(); ++i)
    if (g.ops[i].kind == OpKind::NormFwd || g.ops[i].kind == OpKind::NormBwd) norms.push_back(i);
  if (!norms.empty()) {
    if (norms.size() != 1) return cat(norms.size(), " batch norms (the fused patterns have one)");
    std::vector<bool> used(g.ops.size(), false);
    match_norm(g, w, norms[0], used, g.pattern);
    return first_unused(g, used);
  }
  std::vector<size_t> convs;
  for (size_t i = 0; i < g.ops.size(); ++i)
    if (g.ops[i].conv != nullptr) convs.push_back(i);
  if (convs.size() != 1)
    return cat(convs.size(), " convolutions among ", g.ops.size(), " operations (the fused patterns have one, or are "
                                                                     "a bn-finalize alone)");
  std::vector<bool> used(g.ops.size(), false);
  if (std::string why = match_conv(g, w, convs[0], used, g.pattern); !why.empty()) return why;
  return first_unused(g, used);
}

// Orders the operations so each runs after the writers of its inputs; false on a cycle.
bool order(FusedGraph& g, const Wiring& w) {
  std::vector<GraphOp> out;
  std::vector<bool> done(g.ops.size(), false);
  std::set<int64_t> ready;
  while (out.size() < g.ops.size()) {
    bool progress = false;
    for (size_t i = 0; i < g.ops.size(); ++i) {
      if (done[i]) continue;
      const GraphOp& op = g.ops[i];
      const bool runnable = std::all_of(op.inputs.begin(), op.inputs.end(), [&](int a) {
        const int64_t u = op.uid(a);   // a convolution with beta reads its own output first
        return w.producer.count(u) == 0 || w.producer.at(u) == i || ready.count(u) != 0;
      });
      if (!runnable) continue;
      for (const int a : op.outputs) ready.insert(op.uid(a));
      out.push_back(op);
      done[i] = progress = true;
    }
    if (!progress) return false;
  }
  g.ops = std::move(out);
  return true;
}

cudnnStatus_t graph_error(cudnnStatus_t st, const std::string& what) {
  return fail(st, cat(kFinalize, ": OPERATIONGRAPH: ", what));
}

// One descriptor per unique id; each tensor written once, never a by-value one; virtual tensors
// written and read.
cudnnStatus_t wire(FusedGraph& g, Wiring& w) {
  for (size_t i = 0; i < g.ops.size(); ++i) {
    for (const auto& [attr, t] : g.ops[i].slot) {
      const auto [it, fresh] = g.tensors.emplace(t.uid, t);
      if (!fresh && !it->second.same_as(t))
        return graph_error(CUDNN_STATUS_BAD_PARAM_DUPLICATED_ENTRIES,
                           cat("two different tensors share the unique id ", t.uid));
    }
    for (const int a : g.ops[i].outputs) {
      const GraphTensor& t = g.ops[i].slot.at(a);
      if (t.by_value) return graph_error(CUDNN_STATUS_BAD_PARAM, cat("tensor ", t.uid, " is by value but written"));
      if (!w.producer.emplace(t.uid, i).second)
        return graph_error(CUDNN_STATUS_BAD_PARAM, cat("tensor ", t.uid, " is written by two operations"));
    }
    for (const int a : g.ops[i].inputs) ++w.readers[g.ops[i].uid(a)];
  }
  for (const auto& [uid, t] : g.tensors) {
    if (t.is_virtual && w.producer.count(uid) == 0)
      return graph_error(CUDNN_STATUS_BAD_PARAM, cat("virtual tensor ", uid, " is read but no operation writes it"));
    if (t.is_virtual && w.readers.count(uid) == 0)
      return graph_error(CUDNN_STATUS_BAD_PARAM, cat("virtual tensor ", uid, " is written but never read"));
  }
  return CUDNN_STATUS_SUCCESS;
}

void cost(FusedGraph& g) {
  bool stats = false;
  int64_t channels = 1;
  for (const GraphOp& op : g.ops) {
    for (const auto& [attr, t] : op.slot) g.flops += static_cast<double>(t.count());
    if (op.kind == OpKind::GenStats || op.kind == OpKind::BnBwdWeights || op.kind == OpKind::NormFwd ||
        op.kind == OpKind::NormBwd) {
      stats = true;
      channels = std::max(channels, op.slot.begin()->second.dims.size() > 1 ? op.slot.begin()->second.dims[1] : 1);
    }
  }
  if (const GraphOp* c = g.conv()) {
    const ConvGeometry q = c->conv->problem(false).g;
    g.flops += 2.0 * static_cast<double>(q.n * q.k * q.oh * q.ow * (q.c / q.groups) * q.r * q.s);
  }
  // Per-channel partial sums of 32 thread blocks, as the real fused kernels reduce them.
  g.workspace = stats ? static_cast<size_t>(32 * 2 * channels) * sizeof(float) : 0;
}

}  // namespace

cudnnStatus_t finalize_fused_graph(const BackendAttr& ops, ConvGraph& g) {
  auto fg = std::make_shared<FusedGraph>();
  for (const auto& d : ops.descs) {
    if (d->op == nullptr) {
      g.unsupported = cat("graph pattern: a ", descriptor_type_name(d->type), " operation among ", ops.count,
                          " (the emulator fuses convolution, pointwise, gen-stats, bn-finalize and bn-bwd-weights "
                          "operations)");
      return CUDNN_STATUS_SUCCESS;
    }
    fg->ops.push_back(*d->op);
  }
  Wiring w;
  if (cudnnStatus_t st = wire(*fg, w); st != CUDNN_STATUS_SUCCESS) return st;
  if (!order(*fg, w)) return graph_error(CUDNN_STATUS_BAD_PARAM, "the operations form a cycle");
  const std::string kinds = [&] {
    std::string s;
    for (const GraphOp& op : fg->ops)
      s += cat(s.empty() ? "" : ", ", descriptor_type_name(op.type),
               op.kind == OpKind::Pointwise ? cat(" (mode ", raw_enum(op.mode), ")") : std::string());
    return s;
  }();
  if (std::string why = classify(*fg, w); !why.empty()) {
    g.unsupported = cat("graph pattern: ", kinds, ": ", why);
    return CUDNN_STATUS_SUCCESS;
  }
  for (const auto& [uid, t] : fg->tensors) {
    Elem e{};
    if (!elem_of(t.dtype, e) && t.dtype != CUDNN_DATA_INT64) {   // BOOLEAN masks are bit-packed: not emulated
      g.unsupported = cat("tensor ", uid, " holds ", static_cast<int>(t.dtype), ", a data type the fused graphs do not "
                          "run (HALF, BFLOAT16, FLOAT, DOUBLE, INT32, INT64)");
      return CUDNN_STATUS_SUCCESS;
    }
  }
  if (const GraphOp* c = fg->conv()) {
    if (std::string why = fused_conv_unsupported(*c); !why.empty()) {
      g.unsupported = why;
      return CUDNN_STATUS_SUCCESS;
    }
  }
  cost(*fg);
  g.fused = fg;
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace minidl::cuda::emu::detail
