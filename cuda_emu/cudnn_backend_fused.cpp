// cuDNN stand-ins for the emulated device, the backend (graph) API, part 4: the operations of the
// fused batch-norm graphs (pointwise, gen-stats, bn-finalize, bn-bwd-weights), what finalizing each
// checks, and the operation graph of several operations: its consistency (one descriptor per unique
// id, each tensor written once, virtual tensors written and read, no cycle), its order, and the
// fused patterns the emulator runs. cuDNN accepts such graphs only where an engine fuses them; the
// emulator accepts exactly the ResNet fusions (docs/cuda/emulated_graph_api.md) and refuses the
// rest with CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN at the heuristics.
#include "cuda_emu/cudnn_backend_fused.h"

#include <algorithm>
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
  switch (k) {
    case OpKind::ConvFwd: return "convolution forward";
    case OpKind::ConvBwdData: return "convolution data gradient";
    case OpKind::ConvBwdFilter: return "convolution filter gradient";
    case OpKind::Pointwise: return "pointwise";
    case OpKind::GenStats: return "gen-stats";
    case OpKind::BnFinalize: return "bn-finalize";
    case OpKind::BnBwdWeights: return "bn-bwd-weights";
    case OpKind::NormFwd: return "batch-norm forward";
    default: return "batch-norm backward";
  }
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

cudnnStatus_t finalize_pointwise_op(BackendDesc& d) {
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR);
  const BackendDesc* pw = desc_of(find_attr(d, CUDNN_ATTR_OPERATION_POINTWISE_PW_DESCRIPTOR));
  if (pw->type != CUDNN_BACKEND_POINTWISE_DESCRIPTOR)
    return fail(CUDNN_STATUS_BAD_PARAM_DESCRIPTOR_TYPE,
                cat(kFinalize, ": OPERATION_POINTWISE: the pointwise descriptor is a ", descriptor_type_name(pw->type)));
  auto op = std::make_shared<GraphOp>();
  op->kind = OpKind::Pointwise;
  op->type = d.type;
  op->mode = scalar<cudnnPointwiseMode_t>(find_attr(*pw, CUDNN_ATTR_POINTWISE_MODE), CUDNN_POINTWISE_IDENTITY);
  op->lower_clip = scale_of(find_attr(*pw, CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP), 0.0);
  op->upper_clip = scale_of(find_attr(*pw, CUDNN_ATTR_POINTWISE_RELU_UPPER_CLIP), op->upper_clip);
  op->slope = scale_of(find_attr(*pw, CUDNN_ATTR_POINTWISE_RELU_LOWER_CLIP_SLOPE), 0.0);
  op->alpha1 = scale_of(find_attr(d, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA1), 1.0);
  op->alpha2 = scale_of(find_attr(d, CUDNN_ATTR_OPERATION_POINTWISE_ALPHA2), 1.0);
  const bool bwd = backward_mode(op->mode);
  const std::vector<Slot> slots =
      bwd ? std::vector<Slot>{{CUDNN_ATTR_OPERATION_POINTWISE_XDESC, "XDESC", true, false},
                              {CUDNN_ATTR_OPERATION_POINTWISE_DYDESC, "DYDESC", true, false},
                              {CUDNN_ATTR_OPERATION_POINTWISE_DXDESC, "DXDESC", true, true}}
          : std::vector<Slot>{{CUDNN_ATTR_OPERATION_POINTWISE_XDESC, "XDESC", true, false},
                              {CUDNN_ATTR_OPERATION_POINTWISE_BDESC, "BDESC", binary_mode(op->mode), false},
                              {CUDNN_ATTR_OPERATION_POINTWISE_YDESC, "YDESC", true, true}};
  if (cudnnStatus_t st = collect(d, slots, *op); st != CUDNN_STATUS_SUCCESS) return st;
  // Each input broadcasts to the output: the same rank, each dimension equal or 1.
  const GraphTensor& out = op->slot.at(op->outputs[0]);
  for (const int a : op->inputs) {
    const GraphTensor& in = op->slot.at(a);
    bool ok = in.dims.size() == out.dims.size();
    for (size_t i = 0; ok && i < in.dims.size(); ++i) ok = in.dims[i] == out.dims[i] || in.dims[i] == 1;
    if (!ok)
      return shape_mismatch(d, cat("input ", dims_text(in.dims), " does not broadcast to the output ",
                                   dims_text(out.dims)));
  }
  if (bwd && op->slot.at(CUDNN_ATTR_OPERATION_POINTWISE_DYDESC).dims != out.dims)
    return shape_mismatch(d, "dy and dx differ in shape");
  d.op = op;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_genstats(BackendDesc& d) {
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_OPERATION_GENSTATS_MODE);
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_OPERATION_GENSTATS_MATH_PREC);
  auto op = std::make_shared<GraphOp>();
  op->kind = OpKind::GenStats;
  op->type = d.type;
  if (cudnnStatus_t st = collect(d, {{CUDNN_ATTR_OPERATION_GENSTATS_XDESC, "XDESC", true, false},
                                     {CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC, "SUMDESC", true, true},
                                     {CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC, "SQSUMDESC", true, true}},
                                 *op);
      st != CUDNN_STATUS_SUCCESS)
    return st;
  if (scalar<cudnnGenStatsMode_t>(find_attr(d, CUDNN_ATTR_OPERATION_GENSTATS_MODE), CUDNN_GENSTATS_SUM_SQSUM) !=
      CUDNN_GENSTATS_SUM_SQSUM)
    return fail(CUDNN_STATUS_BAD_PARAM, cat(kFinalize, ": OPERATION_GEN_STATS: mode is not CUDNN_GENSTATS_SUM_SQSUM"));
  const std::vector<int64_t> want = per_channel_dims(op->slot.at(CUDNN_ATTR_OPERATION_GENSTATS_XDESC).dims);
  for (const int a : op->outputs)
    if (op->slot.at(a).dims != want)
      return shape_mismatch(d, cat("a sum is ", dims_text(op->slot.at(a).dims), ", the input's channels give ",
                                   dims_text(want)));
  d.op = op;
  return CUDNN_STATUS_SUCCESS;
}

// The tensors of a finalize: the per-channel ones share the sums' shape, the scalars hold one element.
cudnnStatus_t check_bn_finalize_shapes(const BackendDesc& d, const GraphOp& op) {
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

cudnnStatus_t finalize_bn_finalize(BackendDesc& d) {
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_OPERATION_BN_FINALIZE_STATS_MODE);
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_OPERATION_BN_FINALIZE_MATH_PREC);
  auto op = std::make_shared<GraphOp>();
  op->kind = OpKind::BnFinalize;
  op->type = d.type;
  op->bn_mode = scalar<cudnnBnFinalizeStatsMode_t>(find_attr(d, CUDNN_ATTR_OPERATION_BN_FINALIZE_STATS_MODE),
                                                    CUDNN_BN_FINALIZE_STATISTICS_TRAINING);
  const bool training = op->bn_mode == CUDNN_BN_FINALIZE_STATISTICS_TRAINING;
  if (cudnnStatus_t st =
          collect(d, {{CUDNN_ATTR_OPERATION_BN_FINALIZE_Y_SUM_DESC, "Y_SUM_DESC", true, false},
                      {CUDNN_ATTR_OPERATION_BN_FINALIZE_Y_SQ_SUM_DESC, "Y_SQ_SUM_DESC", true, false},
                      {CUDNN_ATTR_OPERATION_BN_FINALIZE_SCALE_DESC, "SCALE_DESC", true, false},
                      {CUDNN_ATTR_OPERATION_BN_FINALIZE_BIAS_DESC, "BIAS_DESC", true, false},
                      {CUDNN_ATTR_OPERATION_BN_FINALIZE_PREV_RUNNING_MEAN_DESC, "PREV_RUNNING_MEAN_DESC", !training, false},
                      {CUDNN_ATTR_OPERATION_BN_FINALIZE_PREV_RUNNING_VAR_DESC, "PREV_RUNNING_VAR_DESC", !training, false},
                      {CUDNN_ATTR_OPERATION_BN_FINALIZE_EPSILON_DESC, "EPSILON_DESC", true, false},
                      {CUDNN_ATTR_OPERATION_BN_FINALIZE_EXP_AVERATE_FACTOR_DESC, "EXP_AVERATE_FACTOR_DESC", false, false},
                      {CUDNN_ATTR_OPERATION_BN_FINALIZE_ACCUM_COUNT_DESC, "ACCUM_COUNT_DESC", training, false},
                      {CUDNN_ATTR_OPERATION_BN_FINALIZE_EQ_SCALE_DESC, "EQ_SCALE_DESC", true, true},
                      {CUDNN_ATTR_OPERATION_BN_FINALIZE_EQ_BIAS_DESC, "EQ_BIAS_DESC", true, true},
                      {CUDNN_ATTR_OPERATION_BN_FINALIZE_UPDATED_RUNNING_MEAN_DESC, "UPDATED_RUNNING_MEAN_DESC", false, true},
                      {CUDNN_ATTR_OPERATION_BN_FINALIZE_UPDATED_RUNNING_VAR_DESC, "UPDATED_RUNNING_VAR_DESC", false, true},
                      {CUDNN_ATTR_OPERATION_BN_FINALIZE_SAVED_MEAN_DESC, "SAVED_MEAN_DESC", false, true},
                      {CUDNN_ATTR_OPERATION_BN_FINALIZE_SAVED_INV_STD_DESC, "SAVED_INV_STD_DESC", false, true}},
                  *op);
      st != CUDNN_STATUS_SUCCESS)
    return st;
  if (training) {
    // The running statistics' update needs all five of its operands, or none.
    const int n = op->has(CUDNN_ATTR_OPERATION_BN_FINALIZE_PREV_RUNNING_MEAN_DESC) +
                  op->has(CUDNN_ATTR_OPERATION_BN_FINALIZE_PREV_RUNNING_VAR_DESC) +
                  op->has(CUDNN_ATTR_OPERATION_BN_FINALIZE_UPDATED_RUNNING_MEAN_DESC) +
                  op->has(CUDNN_ATTR_OPERATION_BN_FINALIZE_UPDATED_RUNNING_VAR_DESC) +
                  op->has(CUDNN_ATTR_OPERATION_BN_FINALIZE_EXP_AVERATE_FACTOR_DESC);
    if (n != 0 && n != 5)
      return fail(CUDNN_STATUS_BAD_PARAM, cat(kFinalize, ": OPERATION_BN_FINALIZE_STATISTICS: the running statistics "
                                                         "need the previous and updated mean and variance and the "
                                                         "exponential average factor together (", n, " of 5 set)"));
  }
  if (op->has(CUDNN_ATTR_OPERATION_BN_FINALIZE_SAVED_MEAN_DESC) !=
      op->has(CUDNN_ATTR_OPERATION_BN_FINALIZE_SAVED_INV_STD_DESC))
    return fail(CUDNN_STATUS_BAD_PARAM, cat(kFinalize, ": OPERATION_BN_FINALIZE_STATISTICS: the saved mean and "
                                                       "inverse standard deviation go together"));
  if (cudnnStatus_t st = check_bn_finalize_shapes(d, *op); st != CUDNN_STATUS_SUCCESS) return st;
  d.op = op;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_bn_bwd_weights(BackendDesc& d) {
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MATH_PREC);
  auto op = std::make_shared<GraphOp>();
  op->kind = OpKind::BnBwdWeights;
  op->type = d.type;
  if (cudnnStatus_t st = collect(d, {{CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_X_DESC, "X_DESC", true, false},
                                     {CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DY_DESC, "DY_DESC", true, false},
                                     {CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MEAN_DESC, "MEAN_DESC", true, false},
                                     {CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_INVSTD_DESC, "INVSTD_DESC", true, false},
                                     {CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_BN_SCALE_DESC, "BN_SCALE_DESC", true, false},
                                     {CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_SCALE_DESC, "DBN_SCALE_DESC", true, true},
                                     {CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_BIAS_DESC, "DBN_BIAS_DESC", true, true},
                                     {CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_DY_SCALE_DESC, "EQ_DY_SCALE_DESC", true, true},
                                     {CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_X_SCALE_DESC, "EQ_X_SCALE_DESC", true, true},
                                     {CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_BIAS, "EQ_BIAS", true, true}},
                                 *op);
      st != CUDNN_STATUS_SUCCESS)
    return st;
  const std::vector<int64_t>& x = op->slot.at(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_X_DESC).dims;
  if (op->slot.at(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DY_DESC).dims != x)
    return shape_mismatch(d, cat("dy ", dims_text(op->slot.at(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DY_DESC).dims),
                                 " and x ", dims_text(x), " differ"));
  const std::vector<int64_t> c = per_channel_dims(x);
  for (const auto& [attr, t] : op->slot)
    if (attr != CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_X_DESC && attr != CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DY_DESC &&
        t.dims != c)
      return shape_mismatch(d, cat("operand ", attr, " is ", dims_text(t.dims), ", x's channels give ", dims_text(c)));
  d.op = op;
  return CUDNN_STATUS_SUCCESS;
}

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

// Batch norm's training forward: statistics of x, y normalized, scaled and shifted; the running
// statistics' update optional (all five operands or none).
cudnnStatus_t finalize_norm_fwd(BackendDesc& d) {
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_OPERATION_NORM_FWD_MODE);
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_OPERATION_NORM_FWD_PHASE);
  const bool training = scalar<cudnnBackendNormFwdPhase_t>(find_attr(d, CUDNN_ATTR_OPERATION_NORM_FWD_PHASE),
                                                           CUDNN_NORM_FWD_INFERENCE) == CUDNN_NORM_FWD_TRAINING;
  if (!training || !runs_batch_norm(d, CUDNN_ATTR_OPERATION_NORM_FWD_MODE, CUDNN_ATTR_OPERATION_NORM_FWD_PEER_STAT_DESCS))
    return CUDNN_STATUS_SUCCESS;   // kept as set: not emulated
  auto op = std::make_shared<GraphOp>();
  op->kind = OpKind::NormFwd;
  op->type = d.type;
  if (cudnnStatus_t st =
          collect(d, {{CUDNN_ATTR_OPERATION_NORM_FWD_XDESC, "XDESC", true, false},
                      {CUDNN_ATTR_OPERATION_NORM_FWD_SCALE_DESC, "SCALE_DESC", true, false},
                      {CUDNN_ATTR_OPERATION_NORM_FWD_BIAS_DESC, "BIAS_DESC", true, false},
                      {CUDNN_ATTR_OPERATION_NORM_FWD_EPSILON_DESC, "EPSILON_DESC", true, false},
                      {CUDNN_ATTR_OPERATION_NORM_FWD_EXP_AVG_FACTOR_DESC, "EXP_AVG_FACTOR_DESC", false, false},
                      {CUDNN_ATTR_OPERATION_NORM_FWD_INPUT_RUNNING_MEAN_DESC, "INPUT_RUNNING_MEAN_DESC", false, false},
                      {CUDNN_ATTR_OPERATION_NORM_FWD_INPUT_RUNNING_VAR_DESC, "INPUT_RUNNING_VAR_DESC", false, false},
                      {CUDNN_ATTR_OPERATION_NORM_FWD_MEAN_DESC, "MEAN_DESC", true, true},
                      {CUDNN_ATTR_OPERATION_NORM_FWD_INV_VARIANCE_DESC, "INV_VARIANCE_DESC", true, true},
                      {CUDNN_ATTR_OPERATION_NORM_FWD_OUTPUT_RUNNING_MEAN_DESC, "OUTPUT_RUNNING_MEAN_DESC", false, true},
                      {CUDNN_ATTR_OPERATION_NORM_FWD_OUTPUT_RUNNING_VAR_DESC, "OUTPUT_RUNNING_VAR_DESC", false, true},
                      {CUDNN_ATTR_OPERATION_NORM_FWD_YDESC, "YDESC", true, true}},
                  *op);
      st != CUDNN_STATUS_SUCCESS)
    return st;
  const int n = op->has(CUDNN_ATTR_OPERATION_NORM_FWD_EXP_AVG_FACTOR_DESC) +
                op->has(CUDNN_ATTR_OPERATION_NORM_FWD_INPUT_RUNNING_MEAN_DESC) +
                op->has(CUDNN_ATTR_OPERATION_NORM_FWD_INPUT_RUNNING_VAR_DESC) +
                op->has(CUDNN_ATTR_OPERATION_NORM_FWD_OUTPUT_RUNNING_MEAN_DESC) +
                op->has(CUDNN_ATTR_OPERATION_NORM_FWD_OUTPUT_RUNNING_VAR_DESC);
  if (n != 0 && n != 5)
    return fail(CUDNN_STATUS_BAD_PARAM, cat(kFinalize, ": OPERATION_NORM_FORWARD: the running statistics need the "
                                                       "input and output mean and variance and the exponential "
                                                       "average factor together (", n, " of 5 set)"));
  if (cudnnStatus_t st = check_norm_shapes(d, *op, CUDNN_ATTR_OPERATION_NORM_FWD_XDESC,
                                           {CUDNN_ATTR_OPERATION_NORM_FWD_XDESC, CUDNN_ATTR_OPERATION_NORM_FWD_YDESC},
                                           {CUDNN_ATTR_OPERATION_NORM_FWD_EPSILON_DESC,
                                            CUDNN_ATTR_OPERATION_NORM_FWD_EXP_AVG_FACTOR_DESC});
      st != CUDNN_STATUS_SUCCESS)
    return st;
  d.op = op;
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_norm_bwd(BackendDesc& d) {
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_OPERATION_NORM_BWD_MODE);
  if (!runs_batch_norm(d, CUDNN_ATTR_OPERATION_NORM_BWD_MODE, CUDNN_ATTR_OPERATION_NORM_BWD_PEER_STAT_DESCS))
    return CUDNN_STATUS_SUCCESS;   // kept as set: not emulated
  auto op = std::make_shared<GraphOp>();
  op->kind = OpKind::NormBwd;
  op->type = d.type;
  if (cudnnStatus_t st = collect(d, {{CUDNN_ATTR_OPERATION_NORM_BWD_XDESC, "XDESC", true, false},
                                     {CUDNN_ATTR_OPERATION_NORM_BWD_DYDESC, "DYDESC", true, false},
                                     {CUDNN_ATTR_OPERATION_NORM_BWD_SCALE_DESC, "SCALE_DESC", true, false},
                                     {CUDNN_ATTR_OPERATION_NORM_BWD_MEAN_DESC, "MEAN_DESC", true, false},
                                     {CUDNN_ATTR_OPERATION_NORM_BWD_INV_VARIANCE_DESC, "INV_VARIANCE_DESC", true, false},
                                     {CUDNN_ATTR_OPERATION_NORM_BWD_EPSILON_DESC, "EPSILON_DESC", false, false},
                                     {CUDNN_ATTR_OPERATION_NORM_BWD_DSCALE_DESC, "DSCALE_DESC", true, true},
                                     {CUDNN_ATTR_OPERATION_NORM_BWD_DBIAS_DESC, "DBIAS_DESC", true, true},
                                     {CUDNN_ATTR_OPERATION_NORM_BWD_DXDESC, "DXDESC", true, true}},
                                 *op);
      st != CUDNN_STATUS_SUCCESS)
    return st;
  if (cudnnStatus_t st = check_norm_shapes(d, *op, CUDNN_ATTR_OPERATION_NORM_BWD_XDESC,
                                           {CUDNN_ATTR_OPERATION_NORM_BWD_XDESC, CUDNN_ATTR_OPERATION_NORM_BWD_DYDESC,
                                            CUDNN_ATTR_OPERATION_NORM_BWD_DXDESC},
                                           {CUDNN_ATTR_OPERATION_NORM_BWD_EPSILON_DESC});
      st != CUDNN_STATUS_SUCCESS)
    return st;
  d.op = op;
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace

cudnnStatus_t finalize_pointwise_desc(BackendDesc& d) {
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_POINTWISE_MODE);
  MINIDL_EMU_REQUIRE(d, CUDNN_ATTR_POINTWISE_MATH_PREC);
  return CUDNN_STATUS_SUCCESS;
}

cudnnStatus_t finalize_fused_op(BackendDesc& d) {
  switch (d.type) {
    case CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR: return finalize_pointwise_op(d);
    case CUDNN_BACKEND_OPERATION_GEN_STATS_DESCRIPTOR: return finalize_genstats(d);
    case CUDNN_BACKEND_OPERATION_BN_FINALIZE_STATISTICS_DESCRIPTOR: return finalize_bn_finalize(d);
    case CUDNN_BACKEND_OPERATION_NORM_FORWARD_DESCRIPTOR: return finalize_norm_fwd(d);
    case CUDNN_BACKEND_OPERATION_NORM_BACKWARD_DESCRIPTOR: return finalize_norm_bwd(d);
    default: return finalize_bn_bwd_weights(d);
  }
}

}  // namespace minidl::cuda::emu::detail
