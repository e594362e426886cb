// Front-ends of the reductions (sum, mean, max, min, argmax, argmin) over any set of dims.
// Kernels always produce the keepdim shape; squeezing is a view here.
#include <algorithm>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops.h"

namespace minidl {
namespace {

std::vector<int64_t> normalize_dims(const Tensor& a, const std::vector<int64_t>& dims, const char* op) {
  std::vector<int64_t> out;
  if (dims.empty()) {
    for (int64_t i = 0; i < a.dim(); ++i) out.push_back(i);
    return out;
  }
  for (int64_t d : dims) {
    const int64_t n = a.dim();
    MINIDL_CHECK(d >= -n && d < n, op, ": dim ", d, " is out of range for shape ", shape_str(a.shape()));
    const int64_t w = d < 0 ? d + n : d;
    MINIDL_CHECK(std::find(out.begin(), out.end(), w) == out.end(), op, ": dim ", w, " repeats in ",
                 shape_str(dims));
    out.push_back(w);
  }
  std::sort(out.begin(), out.end());
  return out;
}

Shape keep_shape(const Shape& s, const std::vector<int64_t>& dims) {
  Shape k = s;
  for (int64_t d : dims) k[d] = 1;
  return k;
}

Shape squeezed_shape(const Shape& s, const std::vector<int64_t>& dims) {
  Shape out;
  for (int64_t i = 0; i < static_cast<int64_t>(s.size()); ++i) {
    if (std::find(dims.begin(), dims.end(), i) == dims.end()) out.push_back(s[i]);
  }
  return out;
}

// Runs the kernel and returns the keepdim-shaped result (not recorded).
Tensor reduce_keep(ReduceOp op, const Tensor& a, const std::vector<int64_t>& dims, DType out_dtype) {
  Tensor out = empty(keep_shape(a.shape(), dims), {out_dtype, a.device(), false});
  backend(a.device()).reduce(op, a.detach(), dims, out);
  return out;
}

Tensor finish(const Tensor& keep, const Shape& in_shape, const std::vector<int64_t>& dims, bool keepdim) {
  return keepdim ? keep : keep.view(squeezed_shape(in_shape, dims));
}

int64_t count_of(const Shape& s, const std::vector<int64_t>& dims) {
  int64_t c = 1;
  for (int64_t d : dims) c *= s[d];
  return c;
}

Tensor sum_or_mean(ReduceOp op, const Tensor& a_in, const std::vector<int64_t>& dims_in, bool keepdim) {
  const char* name = op == ReduceOp::Sum ? "sum" : "mean";
  MINIDL_CHECK(a_in.defined(), name, ": undefined tensor");
  const Tensor a = op == ReduceOp::Sum ? autocast_to_f32(a_in) : a_in;  // autocast: sums in f32, as PyTorch
  const auto dims = normalize_dims(a, dims_in, name);
  if (op == ReduceOp::Mean) {
    MINIDL_CHECK(is_floating(a.dtype()), "mean: needs a floating tensor, got ", a.meta(),
                 "; convert with .to(DType::f32)");
  }
  Tensor keep = reduce_keep(op, a, dims, a.dtype());
  Tensor out = finish(keep, a.shape(), dims, keepdim);
  const double scale = op == ReduceOp::Mean ? 1.0 / static_cast<double>(std::max<int64_t>(count_of(a.shape(), dims), 1)) : 1.0;
  record(name, {a}, {out}, [in_shape = a.shape(), dims, scale](const std::vector<Tensor>& g) {
    Tensor gk = g[0].reshape(keep_shape(in_shape, dims));
    if (scale != 1.0) gk = gk * scale;
    return std::vector<Tensor>{gk.expand(in_shape)};
  });
  return out;
}

Tensor min_or_max(ReduceOp op, const Tensor& a, const std::vector<int64_t>& dims_in, bool keepdim) {
  const char* name = op == ReduceOp::Max ? "max" : "min";
  MINIDL_CHECK(a.defined(), name, ": undefined tensor");
  const auto dims = normalize_dims(a, dims_in, name);
  MINIDL_CHECK(count_of(a.shape(), dims) > 0, name, ": cannot reduce over an empty dimension of ",
               shape_str(a.shape()));
  Tensor keep = reduce_keep(op, a, dims, a.dtype());
  Tensor out = finish(keep, a.shape(), dims, keepdim);
  record(name, {a}, {out}, [x = a.detach(), keep, dims](const std::vector<Tensor>& g) {
    // Split the gradient evenly among the elements equal to the extreme value.
    Tensor mask = eq(x, keep.expand(x.shape())).to(x.dtype());
    Tensor count = sum(mask, dims, true);
    Tensor gk = g[0].reshape(keep.shape());
    return std::vector<Tensor>{mul(mask, div(gk, count).expand(x.shape()))};
  });
  return out;
}

Tensor arg_reduce(ReduceOp op, const Tensor& a, int64_t dim, bool keepdim) {
  const char* name = op == ReduceOp::ArgMax ? "argmax" : "argmin";
  MINIDL_CHECK(a.defined(), name, ": undefined tensor");
  MINIDL_CHECK(a.dim() > 0, name, ": needs at least one dim, got ", a.meta());
  const auto dims = normalize_dims(a, {dim}, name);
  MINIDL_CHECK(a.shape()[dims[0]] > 0, name, ": cannot reduce over an empty dimension of ", shape_str(a.shape()));
  return finish(reduce_keep(op, a, dims, DType::i64), a.shape(), dims, keepdim);
}

}  // namespace

Tensor sum(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return sum_or_mean(ReduceOp::Sum, a, dims, keepdim);
}
Tensor mean(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return sum_or_mean(ReduceOp::Mean, a, dims, keepdim);
}
Tensor max(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return min_or_max(ReduceOp::Max, a, dims, keepdim);
}
Tensor min(const Tensor& a, const std::vector<int64_t>& dims, bool keepdim) {
  return min_or_max(ReduceOp::Min, a, dims, keepdim);
}
Tensor argmax(const Tensor& a, int64_t dim, bool keepdim) { return arg_reduce(ReduceOp::ArgMax, a, dim, keepdim); }
Tensor argmin(const Tensor& a, int64_t dim, bool keepdim) { return arg_reduce(ReduceOp::ArgMin, a, dim, keepdim); }

}  // namespace minidl
