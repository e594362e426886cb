// Tensor basics: metadata, factories, scalar access, printing and the in-place updates that
// optimizers and gradient accumulation use. Views and conversions are in tensor_views.cpp.
#include "core/tensor.h"

#include <atomic>
#include <cmath>
#include <cstring>
#include <iomanip>
#include <sstream>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/generator.h"
#include "core/ops.h"

namespace minidl {

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? ", " : "") << s[i];
  os << ']';
  return os.str();
}

int64_t numel_of(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

Shape contiguous_strides(const Shape& s) {
  Shape st(s.size());
  int64_t acc = 1;
  for (size_t i = s.size(); i-- > 0;) {
    st[i] = acc;
    acc *= std::max<int64_t>(s[i], 1);
  }
  return st;
}

static int64_t wrap_dim(int64_t d, int64_t ndim, const char* op) {
  const int64_t lo = -std::max<int64_t>(ndim, 1), hi = std::max<int64_t>(ndim, 1) - 1;
  MINIDL_CHECK(d >= lo && d <= hi, op, ": dim ", d, " is out of range for a tensor with ", ndim,
               " dims (expected [", lo, ", ", hi, "])");
  return d < 0 ? d + std::max<int64_t>(ndim, 1) : d;
}

int64_t Tensor::size(int64_t d) const { return shape()[wrap_dim(d, dim(), "size")]; }
int64_t Tensor::stride(int64_t d) const { return strides()[wrap_dim(d, dim(), "stride")]; }

bool Tensor::is_contiguous() const {
  if (numel() == 0) return true;  // no element to be out of place (as PyTorch)
  int64_t expected = 1;
  for (int64_t i = dim() - 1; i >= 0; --i) {
    if (shape()[i] == 1) continue;
    if (strides()[i] != expected) return false;
    expected *= shape()[i];
  }
  return true;
}

void* Tensor::data_ptr() const {
  auto* base = static_cast<char*>(storage()->data());
  if (base == nullptr) return nullptr;
  return base + offset() * static_cast<int64_t>(dtype_size(dtype()));
}

std::string Tensor::meta() const {
  return std::string(dtype_name(dtype())) + shape_str(shape()) + " " + device().str();
}

std::string Tensor::str() const {
  std::ostringstream os;
  os << "tensor(";
  const int64_t n = numel();
  if (n > 1000) {
    os << "<" << n << " elements>";
  } else {
    const std::vector<double> v = to_vector();
    const bool integral = !is_floating(dtype());
    const Shape& s = shape();
    // Print nested brackets by walking the row-major index.
    std::vector<int64_t> idx(s.size(), 0);
    for (size_t d = 0; d < s.size(); ++d) os << '[';
    for (int64_t i = 0; i < n; ++i) {
      if (integral) os << static_cast<int64_t>(v[i]);
      else os << std::setprecision(6) << v[i];
      int64_t d = static_cast<int64_t>(s.size()) - 1;
      int closed = 0;
      while (d >= 0 && ++idx[d] == s[d]) { idx[d] = 0; --d; ++closed; }
      if (i + 1 < n) {
        for (int c = 0; c < closed; ++c) os << ']';
        os << (closed ? ",\n " : ", ");
        for (int c = 0; c < closed; ++c) os << '[';
      }
    }
    for (size_t d = 0; d < s.size(); ++d) os << ']';
  }
  os << ", " << meta();
  if (requires_grad()) os << ", requires_grad";
  os << ")";
  return os.str();
}

std::ostream& operator<<(std::ostream& os, const Tensor& t) { return os << t.str(); }

double Tensor::item() const {
  MINIDL_CHECK(numel() == 1, "item: the tensor has ", numel(), " elements ", shape_str(shape()),
               "; item() needs exactly one (reduce it first, e.g. with sum or mean)");
  return to_vector()[0];
}

std::vector<double> Tensor::to_vector() const {
  NoGradGuard ng;
  Tensor host = detach().to(Device::cpu()).to(DType::f64).contiguous();
  const double* p = host.data<double>();
  return std::vector<double>(p, p + host.numel());
}

// ---- Factories ----

Tensor empty(const Shape& shape, TensorOptions opts) {
  for (int64_t d : shape) {
    MINIDL_CHECK(d >= 0, "empty: negative dimension in shape ", shape_str(shape));
  }
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = std::make_shared<Storage>(static_cast<size_t>(numel_of(shape)) * dtype_size(opts.dtype), opts.device);
  impl->shape = shape;
  impl->strides = contiguous_strides(shape);
  impl->dtype = opts.dtype;
  Tensor t(std::move(impl));
  if (opts.requires_grad) t.set_requires_grad(true);
  return t;
}

Tensor full(const Shape& shape, double value, TensorOptions opts) {
  const bool rg = opts.requires_grad;
  opts.requires_grad = false;
  Tensor t = empty(shape, opts);
  t.fill_(value);
  if (rg) t.set_requires_grad(true);
  return t;
}
Tensor zeros(const Shape& shape, TensorOptions opts) { return full(shape, 0.0, opts); }
Tensor ones(const Shape& shape, TensorOptions opts) { return full(shape, 1.0, opts); }
Tensor zeros_like(const Tensor& t) { return empty_like(t).fill_(0.0); }
Tensor ones_like(const Tensor& t) { return empty_like(t).fill_(1.0); }
Tensor empty_like(const Tensor& t) { return empty_in_format(t.shape(), t.options(), prefers_channels_last(t)); }

Tensor from_vector(const std::vector<double>& values, const Shape& shape, TensorOptions opts) {
  MINIDL_CHECK(static_cast<int64_t>(values.size()) == numel_of(shape), "from_vector: ", values.size(),
               " values do not fill shape ", shape_str(shape), " (", numel_of(shape), " elements)");
  Tensor host = empty(shape, {.dtype = DType::f64});
  if (!values.empty()) std::memcpy(host.data_ptr(), values.data(), values.size() * sizeof(double));
  Tensor t = host.to(opts.dtype).to(opts.device);
  if (opts.requires_grad) t.set_requires_grad(true);
  return t;
}

Tensor scalar_tensor(double value, TensorOptions opts) { return full({}, value, opts); }

Tensor arange(double start, double end, double step, TensorOptions opts) {
  MINIDL_CHECK(step != 0.0, "arange: step must be non-zero");
  const double span = (end - start) / step;
  const int64_t n = span > 0 ? static_cast<int64_t>(std::ceil(span)) : 0;
  std::vector<double> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[i] = start + static_cast<double>(i) * step;
  return from_vector(v, {n}, opts);
}
Tensor arange(int64_t n, TensorOptions opts) { return arange(0.0, static_cast<double>(n), 1.0, opts); }

static Tensor random_tensor(RandomKind kind, const Shape& shape, double a, double b, TensorOptions opts,
                            Generator* gen, const char* op) {
  MINIDL_CHECK(is_floating(opts.dtype), op, ": needs a floating dtype, got ", dtype_name(opts.dtype));
  const bool rg = opts.requires_grad;
  opts.requires_grad = false;
  Tensor t = empty(shape, opts);
  Generator& g = gen ? *gen : default_generator();
  const uint64_t seed = g.seed();
  const uint64_t offset = g.reserve(static_cast<uint64_t>(t.numel()));
  backend(t.device()).random(kind, t, seed, offset, a, b);
  if (rg) t.set_requires_grad(true);
  return t;
}

Tensor rand(const Shape& shape, TensorOptions opts, Generator* gen) {
  return random_tensor(RandomKind::Uniform, shape, 0.0, 1.0, opts, gen, "rand");
}
Tensor uniform(const Shape& shape, double low, double high, TensorOptions opts, Generator* gen) {
  MINIDL_CHECK(low <= high, "uniform: low ", low, " > high ", high);
  return random_tensor(RandomKind::Uniform, shape, low, high, opts, gen, "uniform");
}
Tensor randn(const Shape& shape, TensorOptions opts, Generator* gen) {
  return random_tensor(RandomKind::Normal, shape, 0.0, 1.0, opts, gen, "randn");
}
Tensor normal(const Shape& shape, double mean, double std, TensorOptions opts, Generator* gen) {
  MINIDL_CHECK(std >= 0, "normal: std must be >= 0, got ", std);
  return random_tensor(RandomKind::Normal, shape, mean, std, opts, gen, "normal");
}

bool allclose(const Tensor& a, const Tensor& b, double rtol, double atol) {
  if (a.shape() != b.shape()) return false;
  const std::vector<double> va = a.to_vector(), vb = b.to_vector();
  for (size_t i = 0; i < va.size(); ++i) {
    if (std::isnan(va[i]) || std::isnan(vb[i])) return false;
    if (std::abs(va[i] - vb[i]) > atol + rtol * std::abs(vb[i])) return false;
  }
  return true;
}

// ---- In-place updates (never recorded) ----

static void check_inplace(const Tensor& t, const char* op) {
  MINIDL_CHECK(!(grad_enabled() && t.requires_grad()), op, ": in-place update of a tensor that requires grad (",
               t.meta(), ") while grad mode is on; wrap the update in minidl::NoGradGuard, as optimizers do");
}

// An in-place update whose source shares memory with part of the target would read elements it
// has already overwritten (on the GPU in no fixed order, so the result would differ run to run and
// from the CPU). As PyTorch does, refuse a partial overlap of two dense views of one storage;
// the very same view (x.add_(x)) is fine, element for element.
static void check_no_partial_overlap(const Tensor& self, const Tensor& src, const char* op) {
  if (self.storage() != src.storage() || !self.is_contiguous() || !src.is_contiguous()) return;
  const int64_t a0 = self.offset(), a1 = a0 + self.numel();
  const int64_t b0 = src.offset(), b1 = b0 + src.numel();
  if (a0 == b0 && a1 == b1) return;
  MINIDL_CHECK(a1 <= b0 || b1 <= a0, op, ": the source ", src.meta(), " overlaps part of the in-place target ",
               self.meta(), " (one storage), so some elements would be read after being overwritten; pass a "
               "copy of the source (.clone()) or write to a new tensor");
}

static Tensor operand_for(const Tensor& self, const Tensor& other, const char* op) {
  MINIDL_CHECK(self.device() == other.device(), op, ": tensors on different devices: ", self.meta(), " and ",
               other.meta(), "; move one with .to(device)");
  MINIDL_CHECK(self.dtype() == other.dtype(), op, ": dtype mismatch: ", self.meta(), " and ", other.meta(),
               "; convert one with .to(DType::", dtype_name(self.dtype()), ")");
  const Shape b = broadcast_shapes(self.shape(), other.shape(), op);
  MINIDL_CHECK(b == self.shape(), op, ": cannot broadcast ", shape_str(other.shape()), " into the in-place target ",
               shape_str(self.shape()));
  check_no_partial_overlap(self, other, op);
  return other.detach().expand(self.shape());
}

Tensor& Tensor::copy_(const Tensor& src) {
  check_inplace(*this, "copy_");
  const Shape b = broadcast_shapes(shape(), src.shape(), "copy_");
  MINIDL_CHECK(b == shape(), "copy_: cannot broadcast source ", shape_str(src.shape()), " into ", shape_str(shape()));
  check_no_partial_overlap(*this, src, "copy_");
  Tensor s = src.detach().expand(shape());
  if (s.device() == device()) {
    backend(device()).copy(s, *this);
  } else {
    // Cross-device copies are the accelerator backend's job (pinned staging, async stream).
    const Device acc = device().is_cpu() ? s.device() : device();
    backend(acc).copy(s, *this);
  }
  return *this;
}

Tensor& Tensor::fill_(double value) {
  check_inplace(*this, "fill_");
  backend(device()).fill(*this, value);
  return *this;
}

Tensor& Tensor::add_(const Tensor& other, double alpha) {
  check_inplace(*this, "add_");
  backend(device()).binary(BinaryOp::Add, *this, operand_for(*this, other, "add_"), *this, alpha);
  return *this;
}

Tensor& Tensor::mul_(const Tensor& other) {
  check_inplace(*this, "mul_");
  backend(device()).binary(BinaryOp::Mul, *this, operand_for(*this, other, "mul_"), *this, 1.0);
  return *this;
}

Tensor& Tensor::mul_(double value) {
  return mul_(scalar_tensor(value, options()));
}

// ---- Autograd accessors ----

Tensor& Tensor::set_requires_grad(bool r) {
  MINIDL_CHECK(is_leaf(), "set_requires_grad: only leaf tensors can change requires_grad (", meta(),
               " is the result of ", grad_fn()->name(), "); use detach() first");
  MINIDL_CHECK(!r || is_floating(dtype()), "set_requires_grad: only floating tensors can require grad, got ",
               meta());
  impl().requires_grad = r;
  return *this;
}

uint64_t Tensor::register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook) {
  static std::atomic<uint64_t> next_id{1};
  MINIDL_CHECK(is_leaf() && requires_grad(), "register_post_accumulate_grad_hook: ", meta(),
               " is not a leaf that requires grad (register hooks on parameters)");
  MINIDL_CHECK(hook != nullptr, "register_post_accumulate_grad_hook: empty hook");
  const uint64_t id = next_id++;
  impl().post_accumulate_grad_hooks.emplace_back(id, std::move(hook));
  return id;
}

void Tensor::remove_post_accumulate_grad_hook(uint64_t id) {
  auto& hooks = impl().post_accumulate_grad_hooks;
  std::erase_if(hooks, [id](const auto& h) { return h.first == id; });
}

void Tensor::set_grad(const Tensor& g) {
  if (!g.defined()) {
    impl().grad.reset();
    return;
  }
  MINIDL_CHECK(g.shape() == shape() && g.dtype() == dtype() && g.device() == device(),
               "set_grad: gradient ", g.meta(), " does not match tensor ", meta());
  impl().grad = g.impl_ptr();
}

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  Tensor g = gradient;
  if (!g.defined()) {
    MINIDL_CHECK(numel() == 1, "backward: grad can be implicitly created only for scalar outputs; this tensor is ",
                 meta(), ". Pass a gradient of the same shape, or reduce it first (sum or mean)");
    g = ones(shape(), options());
  }
  MINIDL_CHECK(g.shape() == shape(), "backward: gradient shape ", shape_str(g.shape()), " does not match output ",
               shape_str(shape()));
  run_backward({*this}, {g}, retain_graph);
}

Tensor Tensor::detach() const {
  auto impl2 = std::make_shared<TensorImpl>();
  impl2->storage = impl().storage;
  impl2->shape = impl().shape;
  impl2->strides = impl().strides;
  impl2->offset = impl().offset;
  impl2->dtype = impl().dtype;
  return Tensor(std::move(impl2));
}

}  // namespace minidl
