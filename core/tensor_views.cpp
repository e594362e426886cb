// Views (reshape, slice, permute, expand, ...) and conversions (clone, contiguous, to). Views share
// storage; each records a backward node that maps the gradient back to the base's shape.
#include <algorithm>
#include <numeric>
#include <optional>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops.h"
#include "core/tensor.h"

namespace minidl {
namespace {

int64_t wrap(int64_t d, int64_t ndim, const char* op, const Shape& shape) {
  const int64_t n = std::max<int64_t>(ndim, 1);
  MINIDL_CHECK(d >= -n && d < n, op, ": dim ", d, " is out of range for shape ", shape_str(shape),
               " (expected [", -n, ", ", n - 1, "])");
  return d < 0 ? d + n : d;
}

Tensor make_view(const Tensor& base, Shape shape, Shape strides, int64_t offset) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = base.storage();
  impl->shape = std::move(shape);
  impl->strides = std::move(strides);
  impl->offset = offset;
  impl->dtype = base.dtype();
  return Tensor(std::move(impl));
}

Shape infer_shape(Shape shape, int64_t numel, const char* op, const Shape& from) {
  int64_t infer = -1, known = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    if (shape[i] == -1) {
      MINIDL_CHECK(infer < 0, op, ": only one dimension can be -1 in ", shape_str(shape));
      infer = static_cast<int64_t>(i);
    } else {
      MINIDL_CHECK(shape[i] >= 0, op, ": invalid size ", shape[i], " in ", shape_str(shape));
      known *= shape[i];
    }
  }
  if (infer >= 0) {
    MINIDL_CHECK(known != 0 && numel % known == 0, op, ": shape ", shape_str(shape), " is invalid for input ",
                 shape_str(from), " of ", numel, " elements");
    shape[infer] = numel / known;
  }
  MINIDL_CHECK(numel_of(shape) == numel, op, ": shape ", shape_str(shape), " is invalid for input ",
               shape_str(from), " of ", numel, " elements");
  return shape;
}

// Strides for viewing (old_shape, old_strides) as new_shape without copying, if possible
// (the algorithm of PyTorch's computeStride: chunks of dims that are contiguous among themselves).
std::optional<Shape> view_strides(const Shape& os, const Shape& ost, const Shape& ns) {
  Shape nst(ns.size());
  if (numel_of(os) == 0 || os.empty()) return contiguous_strides(ns);  // empty or 0-dim: any layout works
  int64_t view_d = static_cast<int64_t>(ns.size()) - 1;
  int64_t chunk_base_stride = ost.empty() ? 1 : ost.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t td = static_cast<int64_t>(os.size()) - 1; td >= 0; --td) {
    tensor_numel *= os[td];
    if (td == 0 || (os[td - 1] != 1 && ost[td - 1] != tensor_numel * chunk_base_stride)) {
      while (view_d >= 0 && (view_numel < tensor_numel || ns[view_d] == 1)) {
        nst[view_d] = view_numel * chunk_base_stride;
        view_numel *= ns[view_d];
        --view_d;
      }
      if (view_numel != tensor_numel) return std::nullopt;
      if (td > 0) {
        chunk_base_stride = ost[td - 1];
        tensor_numel = 1;
        view_numel = 1;
      }
    }
  }
  if (view_d != -1) return std::nullopt;
  return nst;
}

}  // namespace

Tensor Tensor::view(const Shape& shape_in) const {
  const Shape ns = infer_shape(shape_in, numel(), "view", shape());
  auto st = view_strides(shape(), strides(), ns);
  MINIDL_CHECK(st.has_value(), "view: cannot view ", meta(), " with strides ", shape_str(strides()), " as ",
               shape_str(ns), " without a copy; use reshape() (which copies) or call contiguous() first");
  Tensor out = make_view(*this, ns, *st, offset());
  const Shape in_shape = shape();
  record("view", {*this}, {out}, [in_shape](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{g[0].reshape(in_shape)};
  });
  return out;
}

Tensor Tensor::reshape(const Shape& shape_in) const {
  const Shape ns = infer_shape(shape_in, numel(), "reshape", shape());
  if (view_strides(shape(), strides(), ns).has_value()) return view(ns);
  return contiguous().view(ns);
}

Tensor Tensor::slice(int64_t d, int64_t start, int64_t end, int64_t step) const {
  MINIDL_CHECK(dim() > 0, "slice: cannot slice a 0-dim tensor ", meta());
  d = wrap(d, dim(), "slice", shape());
  MINIDL_CHECK(step > 0, "slice: step must be positive, got ", step, " for shape ", shape_str(shape()));
  const int64_t n = shape()[d];
  if (start < 0) start += n;
  if (end < 0) end += n;
  MINIDL_CHECK(start >= 0 && start <= n, "slice: start ", start, " is out of range for dim ", d, " of size ", n,
               " in ", shape_str(shape()));
  end = std::clamp<int64_t>(end, start, n);
  Shape ns = shape(), nst = strides();
  ns[d] = (end - start + step - 1) / step;
  nst[d] = strides()[d] * step;
  Tensor out = make_view(*this, ns, nst, offset() + start * strides()[d]);
  const Shape in_shape = shape();
  record("slice", {*this}, {out}, [in_shape, d, start, end, step](const std::vector<Tensor>& g) {
    Tensor gx = zeros(in_shape, g[0].options());
    gx.slice(d, start, end, step).copy_(g[0]);
    return std::vector<Tensor>{gx};
  });
  return out;
}

Tensor Tensor::select(int64_t d, int64_t index) const {
  MINIDL_CHECK(dim() > 0, "select: cannot select from a 0-dim tensor ", meta());
  d = wrap(d, dim(), "select", shape());
  const int64_t n = shape()[d];
  MINIDL_CHECK(index >= -n && index < n, "select: index ", index, " is out of range for dim ", d, " of size ", n,
               " in ", shape_str(shape()));
  if (index < 0) index += n;
  Shape ns = shape(), nst = strides();
  ns.erase(ns.begin() + d);
  nst.erase(nst.begin() + d);
  Tensor out = make_view(*this, ns, nst, offset() + index * strides()[d]);
  const Shape in_shape = shape();
  record("select", {*this}, {out}, [in_shape, d, index](const std::vector<Tensor>& g) {
    Tensor gx = zeros(in_shape, g[0].options());
    gx.select(d, index).copy_(g[0]);
    return std::vector<Tensor>{gx};
  });
  return out;
}

Tensor Tensor::permute(const std::vector<int64_t>& dims_in) const {
  MINIDL_CHECK(static_cast<int64_t>(dims_in.size()) == dim(), "permute: got ", dims_in.size(),
               " dims for a tensor of shape ", shape_str(shape()));
  std::vector<int64_t> dims(dims_in.size());
  std::vector<bool> seen(dims_in.size(), false);
  Shape ns(dims.size()), nst(dims.size());
  for (size_t i = 0; i < dims.size(); ++i) {
    dims[i] = wrap(dims_in[i], dim(), "permute", shape());
    MINIDL_CHECK(!seen[dims[i]], "permute: dim ", dims[i], " repeats in ", shape_str(dims_in), " for shape ",
                 shape_str(shape()));
    seen[dims[i]] = true;
    ns[i] = shape()[dims[i]];
    nst[i] = strides()[dims[i]];
  }
  Tensor out = make_view(*this, ns, nst, offset());
  record("permute", {*this}, {out}, [dims](const std::vector<Tensor>& g) {
    std::vector<int64_t> inv(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) inv[dims[i]] = static_cast<int64_t>(i);
    return std::vector<Tensor>{g[0].permute(inv)};
  });
  return out;
}

Tensor Tensor::transpose(int64_t d0, int64_t d1) const {
  std::vector<int64_t> p(static_cast<size_t>(dim()));
  std::iota(p.begin(), p.end(), 0);
  if (dim() == 0) return permute(p);
  std::swap(p[wrap(d0, dim(), "transpose", shape())], p[wrap(d1, dim(), "transpose", shape())]);
  return permute(p);
}

Tensor Tensor::expand(const Shape& target) const {
  MINIDL_CHECK(static_cast<int64_t>(target.size()) >= dim(), "expand: cannot expand ", shape_str(shape()), " to ",
               shape_str(target), " (fewer dims)");
  const size_t lead = target.size() - shape().size();
  Shape ns(target.size()), nst(target.size());
  for (size_t i = 0; i < target.size(); ++i) {
    if (i < lead) {
      MINIDL_CHECK(target[i] >= 0, "expand: new leading dim ", i, " must be given (not -1) in ", shape_str(target));
      ns[i] = target[i];
      nst[i] = 0;
      continue;
    }
    const int64_t have = shape()[i - lead];
    const int64_t want = target[i] == -1 ? have : target[i];
    MINIDL_CHECK(have == want || have == 1, "expand: cannot expand ", shape_str(shape()), " to ", shape_str(target),
                 ": dim ", i, " has size ", have, " (only size-1 dims can grow)");
    ns[i] = want;
    nst[i] = (have == want) ? strides()[i - lead] : 0;
  }
  if (ns == shape()) return *this;
  Tensor out = make_view(*this, ns, nst, offset());
  const Shape in_shape = shape();
  record("expand", {*this}, {out}, [in_shape](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{sum_to(g[0], in_shape)};
  });
  return out;
}

Tensor Tensor::unsqueeze(int64_t d) const {
  d = wrap(d, dim() + 1, "unsqueeze", shape());
  Shape ns = shape();
  ns.insert(ns.begin() + d, 1);
  return view(ns);
}

Tensor Tensor::squeeze(int64_t d) const {
  d = wrap(d, dim(), "squeeze", shape());
  if (shape()[d] != 1) return *this;
  Shape ns = shape();
  ns.erase(ns.begin() + d);
  return view(ns);
}

Tensor Tensor::flatten(int64_t start_dim, int64_t end_dim) const {
  if (dim() == 0) return reshape({1});
  start_dim = wrap(start_dim, dim(), "flatten", shape());
  end_dim = wrap(end_dim, dim(), "flatten", shape());
  MINIDL_CHECK(start_dim <= end_dim, "flatten: start_dim ", start_dim, " > end_dim ", end_dim, " for shape ",
               shape_str(shape()));
  Shape ns(shape().begin(), shape().begin() + start_dim);
  int64_t m = 1;
  for (int64_t i = start_dim; i <= end_dim; ++i) m *= shape()[i];
  ns.push_back(m);
  ns.insert(ns.end(), shape().begin() + end_dim + 1, shape().end());
  return reshape(ns);
}

namespace {
Tensor copy_into(const Tensor& self, Tensor out) {
  backend(self.device()).copy(self.detach(), out);
  record("clone", {self}, {out}, [](const std::vector<Tensor>& g) { return std::vector<Tensor>{g[0]}; });
  return out;
}
}  // namespace

Tensor Tensor::contiguous() const { return is_contiguous() ? *this : copy_into(*this, empty(shape(), options())); }

// Keeps channels-last, as PyTorch's preserve_format.
Tensor Tensor::clone() const { return copy_into(*this, empty_like(*this)); }

Tensor Tensor::to(DType t) const {
  if (t == dtype()) return *this;
  Tensor out = empty_in_format(shape(), {t, device(), false}, prefers_channels_last(*this));
  backend(device()).copy(detach(), out);
  if (is_floating(t)) {
    const DType from = dtype();
    record("to_dtype", {*this}, {out}, [from](const std::vector<Tensor>& g) {
      return std::vector<Tensor>{g[0].to(from)};
    });
  }
  return out;
}

Tensor Tensor::to(Device d) const {
  if (d == device()) return *this;
  Tensor out = empty_in_format(shape(), {dtype(), d, false}, prefers_channels_last(*this));
  {
    NoGradGuard ng;
    out.copy_(*this);
  }
  const Device from = device();
  record("to_device", {*this}, {out}, [from](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{g[0].to(from)};
  });
  return out;
}

}  // namespace minidl
