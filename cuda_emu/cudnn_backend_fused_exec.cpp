// cuDNN stand-ins for the emulated device, the backend (graph) API, part 6: cudnnBackendExecute of a
// fused graph. After the checks every execute makes (each non-virtual tensor bound and nothing
// else, pointers aligned as promised, the workspace, the stream, every operand inside live memory),
// the operations run in dependency order on host reference kernels: the reference convolutions of
// conv_reference.cpp, per-channel pointwise arithmetic with broadcasting, the statistics as sums in
// f64, the batch-norm finalize and weight-gradient formulas. Virtual tensors live as temporaries
// rounded to their data type (FLOAT, the fused kernels' intermediate precision); stored outputs are
// rounded to theirs (f16 data, f32 statistics), while later operations read the unrounded value,
// as a fused kernel keeps it in registers.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <stdexcept>
#include <utility>

#include "cuda_emu/call_log.h"
#include "cuda_emu/cudnn_backend_fused.h"

namespace minidl::cuda::emu::detail {
namespace {

using Values = std::map<int64_t, std::vector<double>>;

// What the call bound: a pointer per stored tensor; by-value scalars copied at the call (cuDNN reads
// them then, from host memory).
struct Bindings {
  std::map<int64_t, void*> ptr;
  std::map<int64_t, std::vector<unsigned char>> by_value;
};

double read_any(const void* p, cudnnDataType_t dt, int64_t off) {
  const auto* b = static_cast<const unsigned char*>(p);
  if (dt == CUDNN_DATA_INT64) {
    int64_t v = 0;
    std::memcpy(&v, b + 8 * off, 8);
    return static_cast<double>(v);
  }
  if (dt == CUDNN_DATA_INT32) {
    int32_t v = 0;
    std::memcpy(&v, b + 4 * off, 4);
    return v;
  }
  Elem e{};
  elem_of(dt, e);
  return read_elem(p, e, off, InputRounding::None);
}

double round_to(cudnnDataType_t dt, double v) {
  switch (dt) {
    case CUDNN_DATA_FLOAT: return static_cast<float>(v);
    case CUDNN_DATA_HALF: return half_bits_to_float(float_to_half_bits(static_cast<float>(v)));
    case CUDNN_DATA_BFLOAT16: return bf16_bits_to_float(float_to_bf16_bits(static_cast<float>(v)));
    default: return v;
  }
}

// Calls f(logical index, element offset) over a tensor in row-major order of its dimensions.
template <class F>
void each_elem(const GraphTensor& t, F&& f) {
  std::vector<int64_t> idx(t.dims.size(), 0);
  const int64_t n = t.count();
  for (int64_t i = 0; i < n; ++i) {
    int64_t off = 0;
    for (size_t d = 0; d < idx.size(); ++d) off += idx[d] * t.strides[d];
    f(i, off);
    for (size_t d = idx.size(); d-- > 0;) {
      if (++idx[d] < t.dims[d]) break;
      idx[d] = 0;
    }
  }
}

// v (of dims `from`, each equal to `to`'s or 1) repeated to `to`.
std::vector<double> expand(const std::vector<double>& v, const std::vector<int64_t>& from,
                           const std::vector<int64_t>& to) {
  if (from == to) return v;
  int64_t n = 1;
  for (const int64_t d : to) n *= d;
  std::vector<double> out(static_cast<size_t>(n));
  std::vector<int64_t> idx(to.size(), 0);
  for (int64_t i = 0; i < n; ++i) {
    int64_t src = 0;
    for (size_t d = 0; d < to.size(); ++d) src = src * from[d] + (from[d] == 1 ? 0 : idx[d]);
    out[static_cast<size_t>(i)] = v[static_cast<size_t>(src)];
    for (size_t d = idx.size(); d-- > 0;) {
      if (++idx[d] < to[d]) break;
      idx[d] = 0;
    }
  }
  return out;
}

// Per-channel sums of f(element index, channel) over a tensor of dims d (NCHW-ordered values).
template <class F>
std::vector<double> channel_sums(const std::vector<int64_t>& d, F&& f) {
  int64_t n = 1;
  for (const int64_t v : d) n *= v;
  const int64_t c = d[1], inner = n / (d[0] * c);
  std::vector<double> s(static_cast<size_t>(c), 0.0);
  for (int64_t i = 0; i < n; ++i) {
    const auto ch = static_cast<size_t>((i / inner) % c);
    s[ch] += f(static_cast<size_t>(i), ch);
  }
  return s;
}

// One run of a fused graph: the values of its tensors as they are computed. The operations
// (below) read their operands from it and write their results to it.
class Run {
 public:
  Run(const FusedGraph& g, const Bindings& b) : g_(g), b_(b) {}

  const std::vector<double>& in(const GraphOp& op, int attr) {
    const GraphTensor& t = op.slot.at(attr);
    auto it = vals_.find(t.uid);
    if (it != vals_.end()) return it->second;
    std::vector<double> v(static_cast<size_t>(t.count()));
    const auto bv = b_.by_value.find(t.uid);
    const void* p = bv != b_.by_value.end() ? static_cast<const void*>(bv->second.data()) : b_.ptr.at(t.uid);
    each_elem(t, [&](int64_t i, int64_t off) { v[static_cast<size_t>(i)] = read_any(p, t.dtype, off); });
    return vals_[t.uid] = std::move(v);
  }
  double in_scalar(const GraphOp& op, int attr) { return in(op, attr)[0]; }
  // Copies of several operands, in the order of attrs.
  template <size_t N>
  std::array<std::vector<double>, N> ins(const GraphOp& op, const int (&attrs)[N]) {
    std::array<std::vector<double>, N> v;
    for (size_t i = 0; i < N; ++i) v[i] = in(op, attrs[i]);
    return v;
  }

  void out(const GraphOp& op, int attr, std::vector<double> v) {
    const GraphTensor& t = op.slot.at(attr);
    if (!t.is_virtual) {
      Elem e{};
      elem_of(t.dtype, e);
      void* p = b_.ptr.at(t.uid);
      each_elem(t, [&](int64_t i, int64_t off) { write_elem(p, e, off, v[static_cast<size_t>(i)]); });
    }
    for (double& x : v) x = round_to(t.is_virtual ? t.dtype : CUDNN_DATA_FLOAT, x);
    vals_[t.uid] = std::move(v);
  }
  // Several results, written in order.
  void outs(const GraphOp& op, std::vector<std::pair<int, std::vector<double>>> results) {
    for (auto& [attr, v] : results) out(op, attr, std::move(v));
  }

  // The running statistics move by the factor toward the batch's mean and unbiased variance (M
  // values a channel), as the unfused batch norm moves them. attrs: factor, previous mean and
  // variance, updated mean and variance.
  void running_update(const GraphOp& op, const std::vector<double>& mean, const std::vector<double>& var, double m,
                      const RunningStats& attrs) {
    const double f = in_scalar(op, attrs[0]);
    const double unbias = m > 1.0 ? m / (m - 1.0) : 1.0;
    std::vector<double> rm = in(op, attrs[1]), rv = in(op, attrs[2]);
    for (size_t c = 0; c < rm.size(); ++c) {
      rm[c] = (1.0 - f) * rm[c] + f * mean[c];
      rv[c] = (1.0 - f) * rv[c] + f * var[c] * unbias;
    }
    outs(op, {{attrs[3], std::move(rm)}, {attrs[4], std::move(rv)}});
  }

 private:
  const FusedGraph& g_;
  const Bindings& b_;
  Values vals_;
};

void run_convolution(Run& r, const GraphOp& op) {
  const ConvGraph& c = *op.conv;
  const ConvGeometry q = c.problem(false).g;
  std::vector<double> res;
  int out_attr = 0;
  if (op.kind == OpKind::ConvFwd) {
    res = conv_forward_ref(q, r.in(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_X),
                           r.in(op, CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_W));
    out_attr = CUDNN_ATTR_OPERATION_CONVOLUTION_FORWARD_Y;
  } else if (op.kind == OpKind::ConvBwdData) {
    res = conv_backward_data_ref(q, r.in(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DY),
                                 r.in(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_W));
    out_attr = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_DATA_DX;
  } else {
    res = conv_backward_filter_ref(q, r.in(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_X),
                                   r.in(op, CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DY));
    out_attr = CUDNN_ATTR_OPERATION_CONVOLUTION_BWD_FILTER_DW;
  }
  for (double& v : res) v *= c.alpha;
  if (c.beta != 0.0) {   // out = alpha * conv + beta * out; out not read when beta is 0
    const std::vector<double>& old = r.in(op, out_attr);
    for (size_t i = 0; i < res.size(); ++i) res[i] += c.beta * old[i];
  }
  r.out(op, out_attr, std::move(res));
}

void run_pointwise(Run& r, const GraphOp& op) {
  const int out_attr = op.outputs[0];
  const std::vector<int64_t>& od = op.slot.at(out_attr).dims;
  const auto operand = [&](int attr) { return expand(r.in(op, attr), op.slot.at(attr).dims, od); };
  std::vector<double> a = operand(CUDNN_ATTR_OPERATION_POINTWISE_XDESC);
  if (op.mode == CUDNN_POINTWISE_RELU_BWD) {   // dx = dy where lower < x < upper, slope * dy below
    const std::vector<double> dy = operand(CUDNN_ATTR_OPERATION_POINTWISE_DYDESC);
    for (size_t i = 0; i < a.size(); ++i)
      a[i] = a[i] <= op.lower_clip ? op.slope * dy[i] : a[i] < op.upper_clip ? dy[i] : 0.0;
    return r.out(op, out_attr, std::move(a));
  }
  for (double& v : a) v *= op.alpha1;
  std::vector<double> b;
  if (op.has(CUDNN_ATTR_OPERATION_POINTWISE_BDESC)) {
    b = operand(CUDNN_ATTR_OPERATION_POINTWISE_BDESC);
    for (double& v : b) v *= op.alpha2;
  }
  for (size_t i = 0; i < a.size(); ++i) {
    switch (op.mode) {
      case CUDNN_POINTWISE_ADD: a[i] += b[i]; break;
      case CUDNN_POINTWISE_SUB: a[i] -= b[i]; break;
      case CUDNN_POINTWISE_MUL: a[i] *= b[i]; break;
      case CUDNN_POINTWISE_RELU_FWD:
        a[i] = a[i] <= op.lower_clip ? op.lower_clip + op.slope * (a[i] - op.lower_clip) : std::min(a[i], op.upper_clip);
        break;
      default: throw std::logic_error(cat("pointwise mode ", raw_enum(op.mode), " in a fused pattern"));
    }
  }
  r.out(op, out_attr, std::move(a));
}

// Per-channel sum and sum of squares over every other dimension, in f64.
void run_genstats(Run& r, const GraphOp& op) {
  const std::vector<int64_t>& d = op.slot.at(CUDNN_ATTR_OPERATION_GENSTATS_XDESC).dims;
  const std::vector<double>& v = r.in(op, CUDNN_ATTR_OPERATION_GENSTATS_XDESC);
  r.out(op, CUDNN_ATTR_OPERATION_GENSTATS_SUMDESC, channel_sums(d, [&](size_t i, size_t) { return v[i]; }));
  r.out(op, CUDNN_ATTR_OPERATION_GENSTATS_SQSUMDESC, channel_sums(d, [&](size_t i, size_t) { return v[i] * v[i]; }));
}

// Sums -> mean and biased variance (training) or the running statistics (inference); the
// equivalent scale and bias that normalize, scale and shift in one multiply-add; the running
// statistics' update with the unbiased variance; the saved mean and inverse standard deviation.
void run_bn_finalize(Run& r, const GraphOp& op) {
  const auto [sum, sq, scale, bias] =
      r.ins(op, {CUDNN_ATTR_OPERATION_BN_FINALIZE_Y_SUM_DESC, CUDNN_ATTR_OPERATION_BN_FINALIZE_Y_SQ_SUM_DESC,
                 CUDNN_ATTR_OPERATION_BN_FINALIZE_SCALE_DESC, CUDNN_ATTR_OPERATION_BN_FINALIZE_BIAS_DESC});
  const double eps = r.in_scalar(op, CUDNN_ATTR_OPERATION_BN_FINALIZE_EPSILON_DESC);
  const bool training = op.bn_mode == CUDNN_BN_FINALIZE_STATISTICS_TRAINING;
  const double m = training ? r.in_scalar(op, CUDNN_ATTR_OPERATION_BN_FINALIZE_ACCUM_COUNT_DESC) : 1.0;
  const size_t c = sum.size();
  std::vector<double> mean(c), var(c), inv(c), eq_scale(c), eq_bias(c);
  for (size_t i = 0; i < c; ++i) {
    mean[i] = training ? sum[i] / m : r.in(op, CUDNN_ATTR_OPERATION_BN_FINALIZE_PREV_RUNNING_MEAN_DESC)[i];
    var[i] = training ? std::max(0.0, sq[i] / m - mean[i] * mean[i])
                      : r.in(op, CUDNN_ATTR_OPERATION_BN_FINALIZE_PREV_RUNNING_VAR_DESC)[i];
    inv[i] = 1.0 / std::sqrt(var[i] + eps);
    eq_scale[i] = scale[i] * inv[i];
    eq_bias[i] = bias[i] - mean[i] * eq_scale[i];
  }
  if (training && op.has(CUDNN_ATTR_OPERATION_BN_FINALIZE_UPDATED_RUNNING_MEAN_DESC)) {
    r.running_update(op, mean, var, m, kBnFinalizeRunningStats);
  }
  if (op.has(CUDNN_ATTR_OPERATION_BN_FINALIZE_SAVED_MEAN_DESC)) {
    r.outs(op, {{CUDNN_ATTR_OPERATION_BN_FINALIZE_SAVED_MEAN_DESC, std::move(mean)},
                {CUDNN_ATTR_OPERATION_BN_FINALIZE_SAVED_INV_STD_DESC, std::move(inv)}});
  }
  r.outs(op, {{CUDNN_ATTR_OPERATION_BN_FINALIZE_EQ_SCALE_DESC, std::move(eq_scale)},
              {CUDNN_ATTR_OPERATION_BN_FINALIZE_EQ_BIAS_DESC, std::move(eq_bias)}});
}

// dbias = sum dy, dscale = sum dy * x_hat; and the coefficients of the data gradient
// dx = eq_dy * dy + eq_x * x + eq_bias = scale * inv_std * (dy - dbias / M - x_hat * dscale / M).
void run_bn_bwd_weights(Run& r, const GraphOp& op) {
  const GraphTensor& xt = op.slot.at(CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_X_DESC);
  const auto [x, dy, mean, inv, scale] =
      r.ins(op, {CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_X_DESC, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DY_DESC,
                 CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_MEAN_DESC, CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_INVSTD_DESC,
                 CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_BN_SCALE_DESC});
  const auto cs = static_cast<size_t>(xt.dims[1]);
  std::vector<double> dbias = channel_sums(xt.dims, [&](size_t i, size_t) { return dy[i]; });
  std::vector<double> dscale = channel_sums(xt.dims, [&](size_t i, size_t c) { return dy[i] * (x[i] - mean[c]) * inv[c]; });
  std::vector<double> eq_dy(cs), eq_x(cs), eq_bias(cs);
  const double m = static_cast<double>(xt.count()) / static_cast<double>(cs);
  for (size_t i = 0; i < cs; ++i) {
    eq_dy[i] = scale[i] * inv[i];
    eq_x[i] = -eq_dy[i] * inv[i] * dscale[i] / m;
    eq_bias[i] = -eq_dy[i] * dbias[i] / m - eq_x[i] * mean[i];
  }
  r.outs(op, {{CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_SCALE_DESC, std::move(dscale)},
              {CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_DBN_BIAS_DESC, std::move(dbias)},
              {CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_DY_SCALE_DESC, std::move(eq_dy)},
              {CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_X_SCALE_DESC, std::move(eq_x)},
              {CUDNN_ATTR_OPERATION_BN_BWD_WEIGHTS_EQ_BIAS, std::move(eq_bias)}});
}

// Batch norm in training: the batch's mean and biased variance per channel, y = x_hat * scale +
// bias, the running statistics' update with the unbiased variance as bn-finalize does it.
void run_norm_fwd(Run& r, const GraphOp& op) {
  const std::vector<int64_t>& d = op.slot.at(CUDNN_ATTR_OPERATION_NORM_FWD_XDESC).dims;
  const auto [x, scale, bias] = r.ins(op, {CUDNN_ATTR_OPERATION_NORM_FWD_XDESC, CUDNN_ATTR_OPERATION_NORM_FWD_SCALE_DESC,
                                            CUDNN_ATTR_OPERATION_NORM_FWD_BIAS_DESC});
  const double eps = r.in_scalar(op, CUDNN_ATTR_OPERATION_NORM_FWD_EPSILON_DESC);
  const double m = static_cast<double>(x.size()) / static_cast<double>(d[1]);
  std::vector<double> mean = channel_sums(d, [&](size_t i, size_t) { return x[i]; });
  for (double& v : mean) v /= m;
  std::vector<double> var = channel_sums(d, [&](size_t i, size_t c) { return (x[i] - mean[c]) * (x[i] - mean[c]); });
  std::vector<double> inv(var.size());
  for (size_t c = 0; c < var.size(); ++c) {
    var[c] /= m;
    inv[c] = 1.0 / std::sqrt(var[c] + eps);
  }
  std::vector<double> y(x.size());
  channel_sums(d, [&](size_t i, size_t c) { return y[i] = (x[i] - mean[c]) * inv[c] * scale[c] + bias[c]; });
  if (op.has(CUDNN_ATTR_OPERATION_NORM_FWD_OUTPUT_RUNNING_MEAN_DESC)) {
    r.running_update(op, mean, var, m, kNormFwdRunningStats);
  }
  r.outs(op, {{CUDNN_ATTR_OPERATION_NORM_FWD_MEAN_DESC, std::move(mean)},
              {CUDNN_ATTR_OPERATION_NORM_FWD_INV_VARIANCE_DESC, std::move(inv)},
              {CUDNN_ATTR_OPERATION_NORM_FWD_YDESC, std::move(y)}});
}

// dscale = sum dy * x_hat, dbias = sum dy, dx = scale * inv_std * (dy - dbias / M - x_hat * dscale / M).
void run_norm_bwd(Run& r, const GraphOp& op) {
  const std::vector<int64_t>& d = op.slot.at(CUDNN_ATTR_OPERATION_NORM_BWD_XDESC).dims;
  const auto [x, dy, scale, mean, inv] =
      r.ins(op, {CUDNN_ATTR_OPERATION_NORM_BWD_XDESC, CUDNN_ATTR_OPERATION_NORM_BWD_DYDESC,
                 CUDNN_ATTR_OPERATION_NORM_BWD_SCALE_DESC, CUDNN_ATTR_OPERATION_NORM_BWD_MEAN_DESC,
                 CUDNN_ATTR_OPERATION_NORM_BWD_INV_VARIANCE_DESC});
  const double m = static_cast<double>(x.size()) / static_cast<double>(d[1]);
  const auto xhat = [&](size_t i, size_t c) { return (x[i] - mean[c]) * inv[c]; };
  std::vector<double> dbias = channel_sums(d, [&](size_t i, size_t) { return dy[i]; });
  std::vector<double> dscale = channel_sums(d, [&](size_t i, size_t c) { return dy[i] * xhat(i, c); });
  std::vector<double> dx(x.size());
  channel_sums(d, [&](size_t i, size_t c) {
    return dx[i] = scale[c] * inv[c] * (dy[i] - dbias[c] / m - xhat(i, c) * dscale[c] / m);
  });
  r.outs(op, {{CUDNN_ATTR_OPERATION_NORM_BWD_DSCALE_DESC, std::move(dscale)},
              {CUDNN_ATTR_OPERATION_NORM_BWD_DBIAS_DESC, std::move(dbias)},
              {CUDNN_ATTR_OPERATION_NORM_BWD_DXDESC, std::move(dx)}});
}

void run_op(Run& r, const GraphOp& op) {
  switch (op.kind) {
    case OpKind::ConvFwd:
    case OpKind::ConvBwdData:
    case OpKind::ConvBwdFilter: return run_convolution(r, op);
    case OpKind::Pointwise: return run_pointwise(r, op);
    case OpKind::GenStats: return run_genstats(r, op);
    case OpKind::BnFinalize: return run_bn_finalize(r, op);
    case OpKind::BnBwdWeights: return run_bn_bwd_weights(r, op);
    case OpKind::NormFwd: return run_norm_fwd(r, op);
    case OpKind::NormBwd: return run_norm_bwd(r, op);
  }
}

// Every stored tensor bound, aligned as promised, by-value ones copied; no other unique id.
cudnnStatus_t bind(const char* fn, const FusedGraph& g, const BackendDesc& pack, Bindings& b) {
  for (const auto& [uid, t] : g.tensors) {
    if (t.is_virtual) continue;
    bool found = false;
    void* p = bound(pack, uid, found);
    if (!found)
      return fail(CUDNN_STATUS_BAD_PARAM, cat(fn, ": the variant pack binds no pointer to unique id ", uid));
    if (p == nullptr) return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, cat(fn, ": unique id ", uid, " is bound to NULL"));
    if (reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(t.align) != 0)
      return fail(CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER,
                  cat(fn, ": unique id ", uid, " = ", p, " is not aligned to the ", t.align,
                      " bytes its tensor descriptor promises (CUDNN_ATTR_TENSOR_BYTE_ALIGNMENT)"));
    if (t.by_value) {
      const auto* bytes = static_cast<const unsigned char*>(p);
      b.by_value[uid].assign(bytes, bytes + t.count() * static_cast<int64_t>(dtype_size(t.dtype)));
    } else {
      b.ptr[uid] = p;
    }
  }
  for (const int64_t u : ints(find_attr(pack, CUDNN_ATTR_VARIANT_PACK_UNIQUE_IDS))) {
    const auto it = g.tensors.find(u);
    if (it == g.tensors.end() || it->second.is_virtual)
      return fail(CUDNN_STATUS_BAD_PARAM, cat(fn, ": unique id ", u, " of the variant pack is no stored tensor of the "
                                                  "plan's graph"));
  }
  return CUDNN_STATUS_SUCCESS;
}

// The first bound tensor outside live memory, or "".
std::string out_of_range(const FusedGraph& g, const Bindings& b) {
  for (const auto& [uid, p] : b.ptr) {
    const GraphTensor& t = g.tensors.at(uid);
    if (!range_ok(p, t.span_bytes()))
      return cat("unique id ", uid, " = [", p, ", +", t.span_bytes(), " bytes) is not inside one live device "
                 "allocation (illegal address)");
  }
  return "";
}

// A fused graph in the call log, as its convolution: the convolution's FLOPs, at the stored data's
// type (the filter's: the convolution's other operand may be a virtual FLOAT tensor, the
// scale-bias-ReLU's output it loads or the data gradient the ReLU's backward takes), and the bytes
// of every stored tensor once. Virtual tensors never reach memory; that is the fusion's saving.
LibCall fused_conv_call(const FusedGraph& fg, size_t scratch, cudaStream_t stream) {
  const GraphOp& c = *fg.conv();
  const Dir d = c.kind == OpKind::ConvFwd ? Dir::Fwd : c.kind == OpKind::ConvBwdData ? Dir::BwdData : Dir::BwdFilter;
  Problem p = c.conv->problem(c.conv->w.dtype != CUDNN_DATA_FLOAT);
  p.dtype = c.conv->w.dtype;
  elem_of(p.dtype, p.elem);
  LibCall call = conv_call(d, p, fg.pattern.c_str(), scratch, c.conv->beta != 0.0, stream);
  double stored = 0;
  for (const auto& [uid, t] : fg.tensors)
    if (!t.is_virtual && !t.by_value) stored += static_cast<double>(t.count()) * static_cast<double>(dtype_size(t.dtype));
  call.min_bytes = stored;
  return call;
}

}  // namespace

cudnnStatus_t execute_fused(cudnnHandle_t h, const BackendDesc& plan, const BackendDesc& pack) {
  const char* fn = "cudnnBackendExecute";
  const std::shared_ptr<const ConvGraph> graph = plan.graph;
  const FusedGraph& g = *graph->fused;
  Bindings b;
  if (cudnnStatus_t st = bind(fn, g, pack, b); st != CUDNN_STATUS_SUCCESS) return st;
  void* ws = nullptr;
  if (cudnnStatus_t st = plan_workspace(fn, plan, pack, ws); st != CUDNN_STATUS_SUCCESS) return st;
  if (!stream_ok(h->stream)) {
    report_fault(cat(fn, ": the handle's stream ", static_cast<const void*>(h->stream),
                     " is not a live stream (destroyed since cudnnSetStream?)"));
    return CUDNN_STATUS_EXECUTION_FAILED;
  }
  if (std::string bad = out_of_range(g, b); !bad.empty()) {
    report_fault(cat(fn, ": ", bad));
    return CUDNN_STATUS_EXECUTION_FAILED;
  }
  const size_t scratch = plan.workspace;
  const cudaStream_t stream = h->stream;
  const auto compute = [graph, b, ws, scratch, stream] {
    const FusedGraph& fg = *graph->fused;
    Run run(fg, b);
    for (const GraphOp& op : fg.ops) run_op(run, op);
    if (fg.conv() != nullptr && call_logging()) log_call(fused_conv_call(fg, scratch, stream));
    // The engine's scratch is garbage afterwards: a workspace that overlaps live data shows.
    if (scratch > 0) std::fill_n(static_cast<unsigned char*>(ws), scratch, static_cast<unsigned char>(0xA5));
  };
  const auto replay = [graph, b, compute] {
    if (std::string bad = out_of_range(*graph->fused, b); !bad.empty())
      throw std::runtime_error(cat("cudnnBackendExecute (replayed from a graph): ", bad, "; freed since the graph "
                                   "captured the call?"));
    compute();
  };
  if (record_if_capturing(h->stream, replay, fn)) return CUDNN_STATUS_SUCCESS;
  flush_stream(h->stream);   // the work queued before this call has run (deferred streams)
  compute();
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace minidl::cuda::emu::detail
