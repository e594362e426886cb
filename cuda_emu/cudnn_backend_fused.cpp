// cuDNN stand-ins for the emulated device, the backend (graph) API, part 4: the operations of the
// fused batch-norm graphs (pointwise, gen-stats, bn-finalize, bn-bwd-weights), what finalizing each
// checks, and the operation graph of several operations: its consistency (one descriptor per unique
// id, each tensor written once, virtual tensors written and read, no cycle), its order, and the
// fused patterns the emulator runs. cuDNN accepts such graphs only where an engine fuses them; the
// emulator accepts exactly the ResNet fusions (docs/cuda/emulated_graph_api.md) and refuses the
// rest with CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN at the heuristics.
#include "cuda_emu/cudnn_backend_fused.h"

#include <algorithm>
#include <iterator>
#include <set>

namespace minidl::cuda::emu::detail {

size_t dtype_size(cudnnDataType_t t) {
  switch (t) {
    case CUDNN_DATA_DOUBLE:
    case CUDNN_DATA_INT64: return 8;
    case CUDNN_DATA_HALF:
    case CUDNN_DATA_BFLOAT16: return 2;
    case CUDNN_DATA_INT8:
    case CUDNN_DATA_UINT8:
    case CUDNN_DATA_BOOLEAN: return 1;
    default: return 4;
  }
}

int64_t GraphTensor::count() const {
  int64_t n = 1;
  for (const int64_t d : dims) n *= d;
  return n;
}

size_t GraphTensor::span_bytes() const {
  int64_t last = 0;
  for (size_t i = 0; i < dims.size(); ++i) last += (dims[i] - 1) * strides[i];
  return static_cast<size_t>(last + 1) * dtype_size(dtype);
}

bool GraphTensor::same_as(const GraphTensor& o) const {
  return dtype == o.dtype && dims == o.dims && strides == o.strides && is_virtual == o.is_virtual &&
         by_value == o.by_value;
}

GraphTensor graph_tensor(const BackendDesc& t) {
  GraphTensor g;
  g.uid = scalar<int64_t>(find_attr(t, CUDNN_ATTR_TENSOR_UNIQUE_ID), 0);
  g.dtype = scalar<cudnnDataType_t>(find_attr(t, CUDNN_ATTR_TENSOR_DATA_TYPE), CUDNN_DATA_FLOAT);
  g.dims = ints(find_attr(t, CUDNN_ATTR_TENSOR_DIMENSIONS));
  g.strides = ints(find_attr(t, CUDNN_ATTR_TENSOR_STRIDES));
  g.align = scalar<int64_t>(find_attr(t, CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT), 1);
  g.is_virtual = scalar<bool>(find_attr(t, CUDNN_ATTR_TENSOR_IS_VIRTUAL), false);
  g.by_value = scalar<bool>(find_attr(t, CUDNN_ATTR_TENSOR_IS_BY_VALUE), false);
  return g;
}

const char* op_kind_name(OpKind k) {
  static constexpr const char* kNames[] = {"convolution forward", "convolution data gradient",
                                           "convolution filter gradient", "pointwise", "gen-stats", "bn-finalize",
                                           "bn-bwd-weights", "batch-norm forward", "batch-norm backward"};
  static_assert(std::size(kNames) == static_cast<size_t>(OpKind::NormBwd) + 1, "one name per OpKind, in its order");
  return kNames[static_cast<int>(k)];
}

const GraphOp* FusedGraph::conv() const {
  for (const GraphOp& op : ops)
    if (op.conv != nullptr) return &op;
  return nullptr;
}

namespace {

// One operand of an operation: the attribute, its name for messages, required, written.
struct Slot {
  cudnnBackendAttributeName_t attr;
  const char* name;
  bool required, output;
};

cudnnStatus_t collect(const BackendDesc& d, const std::vector<Slot>& slots, GraphOp& op) {
  for (const Slot& s : slots) {
    const BackendDesc* t = desc_of(find_attr(d, s.attr));
    if (t == nullptr) {
      if (s.required) return missing(d, s.name);
      continue;
    }
    if (t->type != CUDNN_BACKEND_TENSOR_DESCRIPTOR)
      return fail(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE, cat(kFinalize, ": ", descriptor_type_name(d.type), ": ",
                                                              s.name, " must be a TENSOR descriptor"));
    op.slot[s.attr] = graph_tensor(*t);
    (s.output ? op.outputs : op.inputs).push_back(s.attr);
  }
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t shape_mismatch(const BackendDesc& d, const std::string& what) {
  return fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH, cat(kFinalize, ": ", descriptor_type_name(d.type), ": ", what));
}

std::string dims_text(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) s += cat(i ? ", " : "", v[i]);
  return s + "]";
}

// [1, C, 1, ...] of x's rank: the per-channel tensors of a batch norm.
std::vector<int64_t> per_channel_dims(const std::vector<int64_t>& x) {
  std::vector<int64_t> d(x.size(), 1);
  if (d.size() > 1) d[1] = x[1];
  return d;
}

bool binary_mode(cudnnPointwiseMode_t m) {
  return m == CUDNN_POINTWISE_ADD || m == CUDNN_POINTWISE_SUB || m == CUDNN_POINTWISE_MUL || m == CUDNN_POINTWISE_DIV ||
         m == CUDNN_POINTWISE_MAX || m == CUDNN_POINTWISE_MIN;
}
bool backward_mode(cudnnPointwiseMode_t m) { return raw_enum(m) >= 200 && raw_enum(m) < 300; }

// An attribute finalizing needs set, with its name for the message.
struct Required {
  cudnnBackendAttributeName_t attr;
  const char* name;
};
#define MINIDL_REQUIRED(name) Required{CUDNN_ATTR_OPERATION_##name, "CUDNN_ATTR_OPERATION_" #name}

// What finalizing one kind of operation checks, in this order: the attributes it needs; whether the
// emulator runs it as set (if not, it is kept as set with no GraphOp, and a graph of it is refused
// at the heuristics); its settings read into the GraphOp; its tensors (collect); the rules between
// them. Then d.op is the GraphOp.
struct OpRules {
  cudnnBackendDescriptorType_t type;
  OpKind kind;
  std::vector<Required> required;
  bool (*emulated)(const BackendDesc& d);                         // nullptr: always
  cudnnStatus_t (*settings)(const BackendDesc& d, GraphOp& op);   // nullptr: none
  std::vector<Slot> (*slots)(const GraphOp& op);
  cudnnStatus_t (*check)(const BackendDesc& d, const GraphOp& op);
};

// The operands as cuDNN names them, CUDNN_ATTR_OPERATION_<op>_<name>: read, or written.
#define MINIDL_IN(op, name, required) Slot{CUDNN_ATTR_OPERATION_##op##_##name, #name, required, false}
#define MINIDL_OUT(op, name, required) Slot{CUDNN_ATTR_OPERATION_##op##_##name, #name, required, true}

// Pointwise: the pointwise descriptor's mode and the ReLU's clips, the operation's alphas.
cudnnStatus_t pointwise_settings(const BackendDesc& d, GraphOp& op) {
  const BackendDesc* pw = desc_of(find_attr(d, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR));
  if (pw->type != CUDNN_BACKEND_POINTWISE_DESCRIPTOR)
    return fail(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE, cat(kFinalize, ": OPERATION_POINTWISE: the pointwise "
                                                                   "descriptor is a ", descriptor_type_name(pw->type)));
  op.mode = scalar<cudnnPointwiseMode_t>(find_attr(*pw, CUDNN_ATTR_POINTWISE_MODE), CUDNN_POINTWISE_IDENTITY);
  op.lower_clip = scale_of(find_attr(*pw, CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP), 0.0);
  op.upper_clip = scale_of(find_attr(*pw, CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP), op.upper_clip);
  op.slope = scale_of(find_attr(*pw, CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE), 0.0);
  op.alpha1 = scale_of(find_attr(d, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1), 1.0);
  op.alpha2 = scale_of(find_attr(d, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2), 1.0);
  return CUDNN_STATUS_SUCCESS;
}

std::vector<Slot> pointwise_slots(const GraphOp& op) {
  if (backward_mode(op.mode))
    return {MINIDL_IN(POINTWISE, XDESC, true), MINIDL_IN(POINTWISE, DYDESC, true), MINIDL_OUT(POINTWISE, DXDESC, true)};
  return {MINIDL_IN(POINTWISE, XDESC, true), MINIDL_IN(POINTWISE, BDESC, binary_mode(op.mode)),
          MINIDL_OUT(POINTWISE, YDESC, true)};
}

// Each input broadcasts to the output: the same rank, each dimension equal or 1; dy is dx's shape.
cudnnStatus_t check_pointwise(const BackendDesc& d, const GraphOp& op) {
  const GraphTensor& out = op.slot.at(op.outputs[0]);
  for (const int a : op.inputs) {
    const GraphTensor& in = op.slot.at(a);
    bool ok = in.dims.size() == out.dims.size();
    for (size_t i = 0; ok && i < in.dims.size(); ++i) ok = in.dims[i] == out.dims[i] || in.dims[i] == 1;
    if (!ok)
      return shape_mismatch(d, cat("input ", dims_text(in.dims), " does not broadcast to the output ",
                                   dims_text(out.dims)));
  }
  if (backward_mode(op.mode) && op.slot.at(CUDNN_ATTR_OPERATION_POINTWISE_DYDESC).dims != out.dims)
    return shape_mismatch(d, "dy and dx differ in shape");
  return CUDNN_STATUS_SUCCESS;
}

const OpRules kPointwiseRules{CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR, OpKind::Pointwise,
                              {MINIDL_REQUIRED(POINTWISE_PW_DESCRIPTOR)},
                              nullptr, pointwise_settings, pointwise_slots, check_pointwise};

std::vector<Slot> genstats_slots(const GraphOp&) {
  return {MINIDL_IN(GENSTATS, XDESC, true), MINIDL_OUT(GENSTATS, SUMDESC, true), MINIDL_OUT(GENSTATS, SQSUMDESC, true)};
}

cudnnStatus_t check_genstats(const BackendDesc& d, const GraphOp& op) {
  if (scalar<cudnnGenStatsMode_t>(find_attr(d, CUDNN_ATTR_OPERATION_GENSTATS_MODE), CUDNN_GENSTATS_SUM_SQSUM) !=
      CUDNN_GENSTATS_SUM_SQSUM)
    return fail(CUDNN_STATUS_BAD_PARAM, cat(kFinalize, ": OPERATION_GEN_STATS: mode is not CUDNN_GENSTATS_SUM_SQSUM"));
  const std::vector<int64_t> want = per_channel_dims(op.slot.at(CUDNN_ATTR_OPERATION_GENSTATS_XDESC).dims);
  for (const int a : op.outputs)
    if (op.slot.at(a).dims != want)
      return shape_mismatch(d, cat("a sum is ", dims_text(op.slot.at(a).dims), ", the input's channels give ",
                                   dims_text(want)));
  return CUDNN_STATUS_SUCCESS;
}

const OpRules kGenStatsRules{CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR, OpKind::GenStats,
                             {MINIDL_REQUIRED(GENSTATS_MODE), MINIDL_REQUIRED(GENSTATS_MATH_PREC)},
                             nullptr, nullptr, genstats_slots, check_genstats};

cudnnStatus_t bn_finalize_settings(const BackendDesc& d, GraphOp& op) {
  op.bn_mode = scalar<cudnnBnFinalizeStatsMode_t>(find_attr(d, CUDNN_ATTR_OPERATION_BN_FINALIZE_STATS_MODE),
                                                   CUDNN_BN_FINALIZE_STATISTICS_TRAINING);
  return CUDNN_STATUS_SUCCESS;
}

// Training reads the sums and the count; inference the running statistics instead.
std::vector<Slot> bn_finalize_slots(const GraphOp& op) {
  const bool training = op.bn_mode == CUDNN_BN_FINALIZE_STATISTICS_TRAINING;
  return {MINIDL_IN(BN_FINALIZE, Y_SUM_DESC, true), MINIDL_IN(BN_FINALIZE, Y_SQ_SUM_DESC, true),
          MINIDL_IN(BN_FINALIZE, SCALE_DESC, true), MINIDL_IN(BN_FINALIZE, BIAS_DESC, true),
          MINIDL_IN(BN_FINALIZE, PREV_RUNNING_MEAN_DESC, !training),
          MINIDL_IN(BN_FINALIZE, PREV_RUNNING_VAR_DESC, !training), MINIDL_IN(BN_FINALIZE, EPSILON_DESC, true),
          MINIDL_IN(BN_FINALIZE, EXP_AVERATE_FACTOR_DESC, false), MINIDL_IN(BN_FINALIZE, ACCUM_COUNT_DESC, training),
          MINIDL_OUT(BN_FINALIZE, EQ_SCALE_DESC, true), MINIDL_OUT(BN_FINALIZE, EQ_BIAS_DESC, true),
          MINIDL_OUT(BN_FINALIZE, UPDATED_RUNNING_MEAN_DESC, false),
          MINIDL_OUT(BN_FINALIZE, UPDATED_RUNNING_VAR_DESC, false), MINIDL_OUT(BN_FINALIZE, SAVED_MEAN_DESC, false),
          MINIDL_OUT(BN_FINALIZE, SAVED_INV_STD_DESC, false)};
}

// How many of the running statistics' operands op has (all five, or none, are right).
int count_set(const GraphOp& op, const RunningStats& attrs) {
  int n = 0;
  for (const int a : attrs) n += op.has(a);
  return n;
}

// The running statistics and the saved ones all or none; the per-channel tensors share the sums'
// shape, the scalars hold one element.
cudnnStatus_t check_bn_finalize(const BackendDesc& d, const GraphOp& op) {
  const int n = count_set(op, kBnFinalizeRunningStats);
  if (op.bn_mode == CUDNN_BN_FINALIZE_STATISTICS_TRAINING && n != 0 && n != 5)
    return fail(CUDNN_STATUS_BAD_PARAM, cat(kFinalize, ": OPERATION_BN_FINALIZE_STATISTICS: the running statistics "
                                                       "need the previous and updated mean and variance and the "
                                                       "exponential average factor together (", n, " of 5 set)"));
  if (op.has(CUDNN_ATTR_OPERATION_BN_FINALIZE_SAVED_MEAN_DESC) !=
      op.has(CUDNN_ATTR_OPERATION_BN_FINALIZE_SAVED_INV_STD_DESC))
    return fail(CUDNN_STATUS_BAD_PARAM, cat(kFinalize, ": OPERATION_BN_FINALIZE_STATISTICS: the saved mean and "
                                                       "inverse standard deviation go together"));
  const std::vector<int64_t>& c = op.slot.at(CUDNN_ATTR_OPERATION_BN_FINALIZE_Y_SUM_DESC).dims;
  if (c != per_channel_dims(c)) return shape_mismatch(d, cat("the sums are ", dims_text(c), ", not [1, C, 1, 1]"));
  for (const auto& [attr, t] : op.slot) {
    const bool scalar_operand = attr == CUDNN_ATTR_OPERATION_BN_FINALIZE_EPSILON_DESC ||
                                attr == CUDNN_ATTR_OPERATION_BN_FINALIZE_EXP_AVERATE_FACTOR_DESC ||
                                attr == CUDNN_ATTR_OPERATION_BN_FINALIZE_ACCUM_COUNT_DESC;
    if (scalar_operand ? t.count() != 1 : t.dims != c)
      return shape_mismatch(d, cat("operand ", attr, " is ", dims_text(t.dims), ", the sums ", dims_text(c)));
  }
  return CUDNN_STATUS_SUCCESS;
}

const OpRules kBnFinalizeRules{CUDNN_BACKEND_OPERATION_BN_FINALIZE_STATISTICS_DESCRIPTOR, OpKind::BnFinalize,
                               {MINIDL_REQUIRED(BN_FINALIZE_STATS_MODE), MINIDL_REQUIRED(BN_FINALIZE_MATH_PREC)},
                               nullptr, bn_finalize_settings, bn_finalize_slots, check_bn_finalize};

std::vector<Slot> bn_bwd_weights_slots(const GraphOp&) {
  return {MINIDL_IN(BN_BWD_WEIGHTS, X_DESC, true), MINIDL_IN(BN_BWD_WEIGHTS, DY_DESC, true),
          MINIDL_IN(BN_BWD_WEIGHTS, MEAN_DESC, true), MINIDL_IN(BN_BWD_WEIGHTS, INVSTD_DESC, true),
          MINIDL_IN(BN_BWD_WEIGHTS, BN_SCALE_DESC, true), MINIDL_OUT(BN_BWD_WEIGHTS, DBN_SCALE_DESC, true),
          MINIDL_OUT(BN_BWD_WEIGHTS, DBN_BIAS_DESC, true), MINIDL_OUT(BN_BWD_WEIGHTS, EQ_DY_SCALE_DESC, true),
          MINIDL_OUT(BN_BWD_WEIGHTS, EQ_X_SCALE_DESC, true), MINIDL_OUT(BN_BWD_WEIGHTS, EQ_BIAS, true)};
}

cudnnStatus_t check_bn_bwd_weights(const BackendDesc& d, const GraphOp& op) {
  const std::vector<int64_t>& x = op.slot.at(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_X_DESC).dims;
  if (op.slot.at(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DY_DESC).dims != x)
    return shape_mismatch(d, cat("dy ", dims_text(op.slot.at(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DY_DESC).dims),
                                 " and x ", dims_text(x), " differ"));
  const std::vector<int64_t> c = per_channel_dims(x);
  for (const auto& [attr, t] : op.slot)
    if (attr != CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_X_DESC && attr != CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DY_DESC &&
        t.dims != c)
      return shape_mismatch(d, cat("operand ", attr, " is ", dims_text(t.dims), ", x's channels give ", dims_text(c)));
  return CUDNN_STATUS_SUCCESS;
}

const OpRules kBnBwdWeightsRules{CUDNN_BACKEND_OPERATION_BN_BWD_WEIGHTS_DESCRIPTOR, OpKind::BnBwdWeights,
                                 {MINIDL_REQUIRED(BN_BWD_WEIGHTS_MATH_PREC)},
                                 nullptr, nullptr, bn_bwd_weights_slots, check_bn_bwd_weights};

// A batch norm's per-channel operands [1, C, 1, 1] of x's channels, its scalars one element, its
// other data operands x's shape.
cudnnStatus_t check_norm_shapes(const BackendDesc& d, const GraphOp& op, int x_attr, const std::set<int>& full,
                                const std::set<int>& scalars) {
  const std::vector<int64_t>& x = op.slot.at(x_attr).dims;
  const std::vector<int64_t> c = per_channel_dims(x);
  for (const auto& [attr, t] : op.slot) {
    const std::vector<int64_t> want = full.count(attr) ? x : scalars.count(attr) ? std::vector<int64_t>{} : c;
    if (want.empty() ? t.count() != 1 : t.dims != want)
      return shape_mismatch(d, cat("operand ", attr, " is ", dims_text(t.dims), ", x is ", dims_text(x)));
  }
  return CUDNN_STATUS_SUCCESS;
}

bool runs_batch_norm(const BackendDesc& d, int mode_attr, int peer_attr) {
  const auto mode = scalar<cudnnBackendNormMode_t>(find_attr(d, static_cast<cudnnBackendAttributeName_t>(mode_attr)),
                                                   CUDNN_LAYER_NORM);
  const BackendAttr* peers = find_attr(d, static_cast<cudnnBackendAttributeName_t>(peer_attr));
  return mode == CUDNN_BATCH_NORM && (peers == nullptr || peers->count == 0);
}

// Batch norm's training forward: statistics of x, y normalized, scaled and shifted.
bool norm_fwd_emulated(const BackendDesc& d) {
  return scalar<cudnnBackendNormFwdPhase_t>(find_attr(d, CUDNN_ATTR_OPERATION_NORM_FWD_PHASE),
                                            CUDNN_NORM_FWD_INFERENCE) == CUDNN_NORM_FWD_TRAINING &&
         runs_batch_norm(d, CUDNN_ATTR_OPERATION_NORM_FWD_MODE, CUDNN_ATTR_OPERATION_NORM_FWD_PEER_STAT_DESCS);
}

std::vector<Slot> norm_fwd_slots(const GraphOp&) {
  return {MINIDL_IN(NORM_FWD, XDESC, true), MINIDL_IN(NORM_FWD, SCALE_DESC, true),
          MINIDL_IN(NORM_FWD, BIAS_DESC, true), MINIDL_IN(NORM_FWD, EPSILON_DESC, true),
          MINIDL_IN(NORM_FWD, EXP_AVG_FACTOR_DESC, false), MINIDL_IN(NORM_FWD, INPUT_RUNNING_MEAN_DESC, false),
          MINIDL_IN(NORM_FWD, INPUT_RUNNING_VAR_DESC, false), MINIDL_OUT(NORM_FWD, MEAN_DESC, true),
          MINIDL_OUT(NORM_FWD, INV_VARIANCE_DESC, true), MINIDL_OUT(NORM_FWD, OUTPUT_RUNNING_MEAN_DESC, false),
          MINIDL_OUT(NORM_FWD, OUTPUT_RUNNING_VAR_DESC, false), MINIDL_OUT(NORM_FWD, YDESC, true)};
}

// The running statistics' update optional (all five operands or none).
cudnnStatus_t check_norm_fwd(const BackendDesc& d, const GraphOp& op) {
  const int n = count_set(op, kNormFwdRunningStats);
  if (n != 0 && n != 5)
    return fail(CUDNN_STATUS_BAD_PARAM, cat(kFinalize, ": OPERATION_NORM_FORWARD: the running statistics need the "
                                                       "input and output mean and variance and the exponential "
                                                       "average factor together (", n, " of 5 set)"));
  return check_norm_shapes(d, op, CUDNN_ATTR_OPERATION_NORM_FWD_XDESC,
                           {CUDNN_ATTR_OPERATION_NORM_FWD_XDESC, CUDNN_ATTR_OPERATION_NORM_FWD_YDESC},
                           {CUDNN_ATTR_OPERATION_NORM_FWD_EPSILON_DESC,
                            CUDNN_ATTR_OPERATION_NORM_FWD_EXP_AVG_FACTOR_DESC});
}

const OpRules kNormFwdRules{CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR, OpKind::NormFwd,
                            {MINIDL_REQUIRED(NORM_FWD_MODE), MINIDL_REQUIRED(NORM_FWD_PHASE)},
                            norm_fwd_emulated, nullptr, norm_fwd_slots, check_norm_fwd};

bool norm_bwd_emulated(const BackendDesc& d) {
  return runs_batch_norm(d, CUDNN_ATTR_OPERATION_NORM_BWD_MODE, CUDNN_ATTR_OPERATION_NORM_BWD_PEER_STAT_DESCS);
}

std::vector<Slot> norm_bwd_slots(const GraphOp&) {
  return {MINIDL_IN(NORM_BWD, XDESC, true), MINIDL_IN(NORM_BWD, DYDESC, true), MINIDL_IN(NORM_BWD, SCALE_DESC, true),
          MINIDL_IN(NORM_BWD, MEAN_DESC, true), MINIDL_IN(NORM_BWD, INV_VARIANCE_DESC, true),
          MINIDL_IN(NORM_BWD, EPSILON_DESC, false), MINIDL_OUT(NORM_BWD, DSCALE_DESC, true),
          MINIDL_OUT(NORM_BWD, DBIAS_DESC, true), MINIDL_OUT(NORM_BWD, DXDESC, true)};
}

cudnnStatus_t check_norm_bwd(const BackendDesc& d, const GraphOp& op) {
  return check_norm_shapes(d, op, CUDNN_ATTR_OPERATION_NORM_BWD_XDESC,
                           {CUDNN_ATTR_OPERATION_NORM_BWD_XDESC, CUDNN_ATTR_OPERATION_NORM_BWD_DYDESC,
                            CUDNN_ATTR_OPERATION_NORM_BWD_DXDESC},
                           {CUDNN_ATTR_OPERATION_NORM_BWD_EPSILON_DESC});
}

const OpRules kNormBwdRules{CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR, OpKind::NormBwd,
                            {MINIDL_REQUIRED(NORM_BWD_MODE)},
                            norm_bwd_emulated, nullptr, norm_bwd_slots, check_norm_bwd};

#undef MINIDL_IN
#undef MINIDL_OUT
#undef MINIDL_REQUIRED

const OpRules* const kOpRules[] = {&kPointwiseRules, &kGenStatsRules, &kBnFinalizeRules,
                                   &kBnBwdWeightsRules, &kNormFwdRules, &kNormBwdRules};


}  // namespace

cudnnStatus_t finalize_pointwise_desc(BackendDesc& d) {
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_POINTWISE_MODE);
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_POINTWISE_MATH_PREC);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_fused_op(BackendDesc& d) {
  const auto it =
      std::find_if(std::begin(kOpRules), std::end(kOpRules), [&](const OpRules* x) { return x->type == d.type; });
  if (it == std::end(kOpRules)) return CUDNN_STATUS_SUCCESS;   // no operation of a fused graph
  const OpRules* r = *it;
  for (const Required& a : r->required)
    if (find_attr(d, a.attr) == nullptr) return missing(d, a.name);
  if (r->emulated != nullptr && !r->emulated(d)) return CUDNN_STATUS_SUCCESS;   // kept as set: not emulated
  auto op = std::make_shared<GraphOp>();
  op->kind = r->kind;
  op->type = d.type;
  if (r->settings != nullptr)
    if (cudnnStatus_t st = r->settings(d, *op); st != CUDNN_STATUS_SUCCESS) return st;
  if (cudnnStatus_t st = collect(d, r->slots(*op), *op); st != CUDNN_STATUS_SUCCESS) return st;
  if (cudnnStatus_t st = r->check(d, *op); st != CUDNN_STATUS_SUCCESS) return st;
  d.op = op;
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace minidl::cuda::emu::detail
