// Tensor: a view (shape, strides, offset, dtype) over a shared Storage, plus the autograd fields.
// Copying a Tensor copies a handle; views share storage. Everything a user does with tensors
// starts here; the ops themselves are declared in core/ops.h.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <ostream>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"
#include "core/storage.h"

namespace minidl {

using Shape = std::vector<int64_t>;
class Node;
class Generator;
class Tensor;

std::string shape_str(const Shape& s);  // "[2, 3, 4]"
int64_t numel_of(const Shape& s);
Shape contiguous_strides(const Shape& s);

struct TensorOptions {
  DType dtype = DType::f32;
  Device device = Device::cpu();
  bool requires_grad = false;
};

struct TensorImpl {
  std::shared_ptr<Storage> storage;
  Shape shape;
  Shape strides;  // in elements
  int64_t offset = 0;  // in elements
  DType dtype = DType::f32;
  // Autograd.
  bool requires_grad = false;
  std::shared_ptr<TensorImpl> grad;
  std::shared_ptr<Node> grad_fn;     // set on non-leaf results of differentiable ops
  uint32_t output_nr = 0;
  std::weak_ptr<Node> grad_accumulator;  // leaves only, created lazily
  // Called, in registration order, once a backward pass has accumulated this leaf's gradient for
  // the pass (all of its uses summed): data-parallel training starts a bucket's allreduce there.
  std::vector<std::pair<uint64_t, std::function<void(const Tensor&)>>> post_accumulate_grad_hooks;
};

class Tensor {
 public:
  Tensor() = default;
  explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

  bool defined() const { return impl_ != nullptr; }
  const Shape& shape() const { return impl().shape; }
  const Shape& strides() const { return impl().strides; }
  int64_t offset() const { return impl().offset; }
  int64_t dim() const { return static_cast<int64_t>(impl().shape.size()); }
  int64_t size(int64_t d) const;  // negative d counts from the end
  int64_t stride(int64_t d) const;
  int64_t numel() const { return numel_of(impl().shape); }
  DType dtype() const { return impl().dtype; }
  Device device() const { return impl().storage->device(); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
  // This tensor's dtype and device (requires_grad false): for allocating outputs like it.
  TensorOptions options() const { return {dtype(), device(), false}; }
  bool is_contiguous() const;
  const std::shared_ptr<Storage>& storage() const { return impl().storage; }
  // Pointer to the first element of this view (storage base + offset).
  void* data_ptr() const;
  template <typename T>
  T* data() const { return static_cast<T*>(data_ptr()); }
  std::string str() const;    // values and metadata, PyTorch-like
  std::string meta() const;   // "f32[2, 3] cpu"

  // Views: share storage, differentiable.
  Tensor view(const Shape& shape) const;      // requires compatible strides; -1 infers one dim
  Tensor reshape(const Shape& shape) const;   // a view when possible, else a copy
  Tensor slice(int64_t dim, int64_t start, int64_t end, int64_t step = 1) const;
  Tensor select(int64_t dim, int64_t index) const;  // removes dim
  Tensor permute(const std::vector<int64_t>& dims) const;
  Tensor transpose(int64_t d0, int64_t d1) const;
  Tensor t() const { return transpose(0, 1); }
  Tensor expand(const Shape& shape) const;    // broadcast size-1 dims (stride 0); -1 keeps a dim
  Tensor unsqueeze(int64_t dim) const;
  Tensor squeeze(int64_t dim) const;
  Tensor flatten(int64_t start_dim = 0, int64_t end_dim = -1) const;
  Tensor contiguous() const;                  // self when already contiguous

  // Copies and conversions (differentiable).
  Tensor to(Device device) const;
  Tensor to(DType dtype) const;
  Tensor clone() const;
  // Scalar read of a one-element tensor (any dtype), as double.
  double item() const;
  template <typename T>
  T item() const { return static_cast<T>(item()); }
  std::vector<double> to_vector() const;  // all elements in logical (row-major) order

  // In-place, never recorded by autograd (optimizer updates, gradient accumulation).
  // They refuse a leaf that requires grad while grad mode is on.
  Tensor& copy_(const Tensor& src);   // broadcasts src, converts dtype and device
  Tensor& fill_(double value);
  Tensor& zero_() { return fill_(0.0); }
  Tensor& add_(const Tensor& other, double alpha = 1.0);
  Tensor& mul_(const Tensor& other);
  Tensor& mul_(double value);

  // Autograd.
  bool requires_grad() const { return impl().requires_grad; }
  Tensor& set_requires_grad(bool r);
  bool is_leaf() const { return impl().grad_fn == nullptr; }
  Tensor grad() const { return Tensor(impl().grad); }
  void set_grad(const Tensor& g);
  void zero_grad() { impl().grad.reset(); }
  // PyTorch's register_post_accumulate_grad_hook: `hook(leaf)` runs during backward right after
  // this leaf's .grad holds the pass's whole gradient (once per backward that reaches it; not when
  // no gradient reaches it). Leaves that require grad only. Returns an id for removal.
  uint64_t register_post_accumulate_grad_hook(std::function<void(const Tensor&)> hook);
  void remove_post_accumulate_grad_hook(uint64_t id);  // unknown ids are ignored
  const std::shared_ptr<Node>& grad_fn() const { return impl().grad_fn; }
  uint32_t output_nr() const { return impl().output_nr; }
  // Backpropagates from this tensor: a scalar, or any shape with an explicit gradient.
  // Gradients accumulate into leaves' .grad across calls.
  void backward(const Tensor& gradient = Tensor(), bool retain_graph = false) const;
  Tensor detach() const;  // shares storage, no grad_fn, requires_grad false

  TensorImpl& impl() const {
    MINIDL_CHECK(impl_ != nullptr, "use of an undefined Tensor (default-constructed or moved-from)");
    return *impl_;
  }
  const std::shared_ptr<TensorImpl>& impl_ptr() const { return impl_; }
  bool same(const Tensor& o) const { return impl_ == o.impl_; }

 private:
  std::shared_ptr<TensorImpl> impl_;
};

std::ostream& operator<<(std::ostream& os, const Tensor& t);

// ---- Factories ----
Tensor empty(const Shape& shape, TensorOptions opts = {});
Tensor zeros(const Shape& shape, TensorOptions opts = {});
Tensor ones(const Shape& shape, TensorOptions opts = {});
Tensor full(const Shape& shape, double value, TensorOptions opts = {});
// The *_like factories, clone() and to(DType) keep a channels-last tensor channels-last (as
// PyTorch's preserve_format); everything else comes out contiguous.
Tensor zeros_like(const Tensor& t);
Tensor ones_like(const Tensor& t);
Tensor empty_like(const Tensor& t);

// ---- Memory formats (core/memory_format.cpp) ----
// Channels-last (NHWC) memory of a logical [N, C, H, W] tensor: strides {H*W*C, 1, W*C, C} (size-1
// dims ignored), as PyTorch's torch.channels_last. A tensor with C == 1 or H * W == 1 is both
// channels-last and contiguous: prefers_channels_last says whether t is channels-last *and not*
// plain contiguous, the test the ops use to keep the format of their inputs.
bool is_channels_last(const Tensor& t);
bool prefers_channels_last(const Tensor& t);
// Whether a's and b's elements lie in one memory order (both contiguous or both channels-last),
// so a kernel may walk both as flat arrays of numel() elements.
bool same_memory_order(const Tensor& a, const Tensor& b);
// An uninitialised [N, C, H, W] tensor with channels-last memory (shape must be 4-d), and the
// factory the ops allocate outputs with: channels-last when `channels_last`, else contiguous.
Tensor empty_channels_last(const Shape& shape, TensorOptions opts = {});
Tensor empty_in_format(const Shape& shape, TensorOptions opts, bool channels_last);
Tensor arange(double start, double end, double step = 1.0, TensorOptions opts = {});
Tensor arange(int64_t n, TensorOptions opts = {.dtype = DType::i64});
// From host values, converted to opts.dtype; values.size() must equal numel(shape).
Tensor from_vector(const std::vector<double>& values, const Shape& shape, TensorOptions opts = {});
Tensor scalar_tensor(double value, TensorOptions opts = {});
// Uniform [low, high) and standard normal, from a Generator (the default one when null):
// the same seed gives the same numbers on every device and thread count.
Tensor rand(const Shape& shape, TensorOptions opts = {}, Generator* gen = nullptr);
Tensor uniform(const Shape& shape, double low, double high, TensorOptions opts = {}, Generator* gen = nullptr);
Tensor randn(const Shape& shape, TensorOptions opts = {}, Generator* gen = nullptr);
Tensor normal(const Shape& shape, double mean, double std, TensorOptions opts = {}, Generator* gen = nullptr);

// True when every element of a and b is within atol + rtol * |b| (same shape and dtype class).
bool allclose(const Tensor& a, const Tensor& b, double rtol = 1e-5, double atol = 1e-8);

}  // namespace minidl
