// The shared host-side checks and geometry of kernels/common/checks.h: one definition for both
// backends, so the CPU reference and the CUDA kernels refuse and describe the same inputs.
#include "kernels/common/checks.h"

#include "core/error.h"
#include "core/ops.h"

namespace minidl::common {

void check_contiguous(const char* backend, const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    MINIDL_CHECK(t->is_contiguous(), op, " (", backend, "): kernel expects contiguous tensors, got ", t->meta(),
                 " with strides ", shape_str(t->strides()));
  }
}

void check_class_target(const char* backend, const Tensor& target, int64_t N, const char* op) {
  MINIDL_CHECK(target.dtype() == DType::i64 && target.dim() == 1 && target.size(0) == N, op, " (", backend,
               "): target must be i64 of shape [", N, "], got ", target.meta());
}

void check_logits(const char* backend, const Tensor& logits, const char* op) {
  MINIDL_CHECK(logits.dim() == 2 && logits.is_contiguous(), op, " (", backend,
               "): logits must be a contiguous [N, C], got ", logits.meta());
}

int64_t check_nll_forward(const char* backend, const Tensor& log_probs, const Tensor& target, const Tensor& losses) {
  MINIDL_CHECK(log_probs.dim() == 2 && log_probs.is_contiguous(), "nll_loss (", backend,
               "): log_probs must be a contiguous [N, C], got ", log_probs.meta());
  const int64_t N = log_probs.size(0);
  check_class_target(backend, target, N, "nll_loss");
  MINIDL_CHECK(losses.dtype() == log_probs.dtype() && losses.dim() == 1 && losses.size(0) == N, "nll_loss (",
               backend, "): losses must be [", N, "] of the input's dtype, got ", losses.meta());
  return N;
}

int64_t check_nll_backward(const char* backend, const Tensor& g, const Tensor& target, const Tensor& glogp) {
  MINIDL_CHECK(glogp.dim() == 2 && glogp.is_contiguous(), "nll_loss_backward (", backend,
               "): glogp must be a contiguous [N, C], got ", glogp.meta());
  const int64_t N = glogp.size(0);
  check_class_target(backend, target, N, "nll_loss_backward");
  MINIDL_CHECK(g.dtype() == glogp.dtype() && g.numel() == N && g.dim() <= 1, "nll_loss_backward (", backend,
               "): g must be [", N, "] of dtype ", dtype_name(glogp.dtype()), ", got ", g.meta());
  return N;
}

void check_cross_entropy_forward(const char* backend, const Tensor& logits, const Tensor& target, const Tensor& losses,
                                 const Tensor& lse) {
  const char* op = "cross_entropy";
  check_logits(backend, logits, op);
  const int64_t N = logits.size(0);
  check_class_target(backend, target, N, op);
  MINIDL_CHECK(losses.dtype() == logits.dtype() && losses.dim() == 1 && losses.size(0) == N, op, " (", backend,
               "): losses must be [", N, "] of the logits' dtype, got ", losses.meta());
  MINIDL_CHECK(lse.dtype() == DType::f64 && lse.dim() == 1 && lse.size(0) == N && lse.is_contiguous(), op, " (",
               backend, "): lse must be a contiguous f64 [", N, "], got ", lse.meta());
}

void check_cross_entropy_backward(const char* backend, const Tensor& g, const Tensor& logits, const Tensor& target,
                                  const Tensor& lse, const Tensor& glogits) {
  const char* op = "cross_entropy_backward";
  check_logits(backend, logits, op);
  const int64_t N = logits.size(0);
  check_class_target(backend, target, N, op);
  MINIDL_CHECK(g.dtype() == logits.dtype() && g.numel() == N && g.dim() <= 1, op, " (", backend, "): g must be [", N,
               "] of dtype ", dtype_name(logits.dtype()), ", got ", g.meta());
  MINIDL_CHECK(lse.dtype() == DType::f64 && lse.numel() == N && lse.is_contiguous(), op, " (", backend,
               "): lse must be the forward's contiguous f64 [", N, "], got ", lse.meta());
  MINIDL_CHECK(glogits.dtype() == logits.dtype() && glogits.shape() == logits.shape() && glogits.is_contiguous(), op,
               " (", backend, "): glogits ", glogits.meta(), " must be contiguous with the logits' shape and dtype ",
               logits.meta());
}

std::pair<Tensor, Tensor> gemm_operands(const Tensor& a, const Tensor& b, std::pair<bool, bool> copies) {
  return {copies.first ? a.contiguous() : a, copies.second ? b.contiguous() : b};
}

int64_t grad_step(const char* backend, const Tensor& g, const char* op) {
  if (g.is_contiguous()) return 1;
  for (int64_t s : g.strides()) {
    MINIDL_CHECK(s == 0, op, " (", backend, "): the gradient must be contiguous or a broadcast scalar, got ",
                 g.meta(), " strides ", shape_str(g.strides()));
  }
  return 0;
}

SoftmaxLayout softmax_layout(const char* backend, const Tensor& x, int64_t dim, const char* op) {
  MINIDL_CHECK(x.is_contiguous(), op, " (", backend, "): input must be contiguous, got ", x.meta(), " strides ",
               shape_str(x.strides()));
  const int64_t nd = x.dim();
  if (nd == 0) {
    MINIDL_CHECK(dim == 0 || dim == -1, op, " (", backend, "): dim ", dim, " out of range for a 0-d tensor");
    return {1, 1, 1};
  }
  const int64_t d = dim < 0 ? dim + nd : dim;
  MINIDL_CHECK(d >= 0 && d < nd, op, " (", backend, "): dim ", dim, " out of range for ", x.meta());
  SoftmaxLayout L{1, x.size(d), 1};
  for (int64_t i = 0; i < d; ++i) L.outer *= x.size(i);
  for (int64_t i = d + 1; i < nd; ++i) L.inner *= x.size(i);
  return L;
}

ChannelLayout channel_layout(const char* backend, const Tensor& x, const char* op, const char* what,
                             bool allow_channels_last) {
  MINIDL_CHECK(x.dim() >= 2, op, " (", backend, "): ", what, " must be [N, C, ...], got ", x.meta());
  const bool cl = allow_channels_last && !x.is_contiguous() && is_channels_last(x);
  MINIDL_CHECK(x.is_contiguous() || cl, op, " (", backend, "): ", what, " ", x.meta(), " must be contiguous (NCHW)",
               allow_channels_last ? " or channels-last (NHWC)" : "", ", got strides ", shape_str(x.strides()));
  int64_t S = 1;
  for (int64_t d = 2; d < x.dim(); ++d) S *= x.size(d);
  return {x.size(0), x.size(1), S, cl};
}

PoolGeom pool_geom(const char* backend, const Shape& in, const Shape& out, const Pool2dOptions& o, const char* op,
                   bool nhwc) {
  MINIDL_CHECK(in.size() == 4 && out.size() == 4 && in[0] == out[0] && in[1] == out[1], op, " (", backend,
               "): inconsistent shapes: input ", shape_str(in), ", output ", shape_str(out));
  MINIDL_CHECK(o.stride[0] > 0 && o.stride[1] > 0, op, " (", backend,
               "): stride must be resolved (non-zero) by the caller");
  return {in[0] * in[1], in[2], in[3], out[2], out[3], o.kernel[0], o.kernel[1], o.stride[0], o.stride[1],
          o.padding[0], o.padding[1], o.count_include_pad, in[1], nhwc};
}

}  // namespace minidl::common
