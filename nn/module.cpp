// Module bookkeeping: registration, recursive traversal in PyTorch's order, device moves and dtype
// conversions that keep parameter identity, strict state_dict loading with one complete error, and
// the per-layer summary that the memory estimator and recomputation planner read their activation
// sizes from.
#include "nn/module.h"

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "core/allocator.h"
#include "core/autocast.h"
#include "core/autograd.h"
#include "core/ops.h"

namespace minidl::nn {

namespace {

// Set while summary() runs its probe forward; leaf calls append rows to it.
struct SummaryRecorder {
  std::map<const Module*, std::string> names;
  std::vector<SummaryRow>* rows = nullptr;
  Device device = Device::cpu();
};
thread_local SummaryRecorder* g_recorder = nullptr;

// Replaces t's storage with a copy on `device` in `dtype`, keeping the TensorImpl (and so every
// handle to it, its requires_grad and its leaf status). The gradient follows, so an optimizer step
// right after the conversion sees a gradient like its parameter rather than a stale one to drop.
// Both Module::to overloads go through here: a device move passes each tensor's own dtype.
void convert_in_place(const Tensor& t, Device device, DType dtype) {
  TensorImpl& im = t.impl();
  if (im.grad) {
    Tensor g(im.grad);
    if (g.device() != device || g.dtype() != dtype) im.grad = g.detach().to(dtype).to(device).impl_ptr();
  }
  if (t.device() == device && t.dtype() == dtype) return;
  Tensor converted = in_format(t.detach(), prefers_channels_last(t)).to(dtype).to(device);
  im.storage = converted.storage();
  im.strides = converted.strides();
  im.offset = converted.offset();
  im.dtype = dtype;
}

std::string join_name(const std::string& prefix, const std::string& name) {
  return prefix.empty() ? name : prefix + "." + name;
}

// The tensors of a named list, in its order.
std::vector<Tensor> tensors_of(const std::vector<std::pair<std::string, Tensor>>& named) {
  std::vector<Tensor> out;
  out.reserve(named.size());
  for (const auto& [n, t] : named) out.push_back(t);
  return out;
}

}  // namespace

Tensor Module::operator()(const Tensor& x) {
  if (g_recorder == nullptr || !children_.empty()) return forward(x);
  // Probe: the leaf runs on a private copy of its input that requires grad, so whatever its
  // backward node keeps alive after the input and output handles are dropped is exactly what it
  // saved for backward, input included when it saves it. The result goes downstream detached.
  SummaryRecorder& rec = *g_recorder;
  const int64_t base = memory_stats(rec.device).allocated_bytes;
  Tensor input = x.detach().clone();
  if (is_floating(input.dtype())) input.set_requires_grad(true);
  Tensor out = forward(input);
  Tensor result = out.detach().clone();
  std::shared_ptr<Node> graph = out.grad_fn();
  SummaryRow row;
  row.output_shape = out.shape();
  input = Tensor();
  out = Tensor();
  row.saved_bytes_per_sample =
      memory_stats(rec.device).allocated_bytes - base - static_cast<int64_t>(result.nbytes());
  graph.reset();
  auto it = rec.names.find(this);
  row.name = it == rec.names.end() ? "(unregistered)" : it->second;
  row.type = type_name_;
  row.num_parameters = num_parameters();
  rec.rows->push_back(std::move(row));
  return result;
}

void Module::check_new_name(const std::string& name, const char* what) const {
  MINIDL_CHECK(!name.empty() && name.find('.') == std::string::npos, type_name_, ": ", what, " name '", name,
               "' must be non-empty and contain no '.' (dots separate module levels in state_dict keys)");
  auto taken = [&](const auto& list) {
    for (const auto& [n, v] : list) {
      if (n == name) return true;
    }
    return false;
  };
  MINIDL_CHECK(!taken(params_) && !taken(buffers_) && !taken(children_), type_name_, ": cannot register ", what,
               " '", name, "': the name is already used by a parameter, buffer or child; pick another name");
}

Tensor Module::register_parameter(const std::string& name, Tensor t, bool requires_grad) {
  check_new_name(name, "parameter");
  MINIDL_CHECK(t.defined(), type_name_, ": parameter '", name, "' is undefined; skip the registration instead");
  if (!t.is_leaf()) t = t.detach();
  t.set_requires_grad(requires_grad);
  params_.emplace_back(name, t);
  return t;
}

Tensor Module::register_buffer(const std::string& name, Tensor t) {
  check_new_name(name, "buffer");
  MINIDL_CHECK(t.defined(), type_name_, ": buffer '", name, "' is undefined; skip the registration instead");
  if (!t.is_leaf() || t.requires_grad()) t = t.detach();
  buffers_.emplace_back(name, t);
  return t;
}

void Module::add_child(const std::string& name, std::shared_ptr<Module> m) {
  check_new_name(name, "module");
  MINIDL_CHECK(m != nullptr, type_name_, ": child module '", name, "' is null");
  MINIDL_CHECK(m.get() != this, type_name_, ": a module cannot be its own child ('", name, "')");
  children_.emplace_back(name, std::move(m));
}

void Module::collect_state(const std::string& prefix, std::vector<std::pair<std::string, Tensor>>& out,
                           bool params, bool buffers, bool recurse) const {
  if (params) {
    for (const auto& [n, t] : params_) out.emplace_back(join_name(prefix, n), t);
  }
  if (buffers) {
    for (const auto& [n, t] : buffers_) out.emplace_back(join_name(prefix, n), t);
  }
  if (!recurse) return;
  for (const auto& [n, c] : children_) c->collect_state(join_name(prefix, n), out, params, buffers, true);
}

std::vector<std::pair<std::string, Tensor>> Module::named_parameters(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect_state("", out, true, false, recurse);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const { return tensors_of(named_parameters(recurse)); }

std::vector<std::pair<std::string, Tensor>> Module::named_buffers(bool recurse) const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect_state("", out, false, true, recurse);
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const { return tensors_of(named_buffers(recurse)); }

std::vector<std::pair<std::string, Module*>> Module::named_modules(const std::string& prefix) {
  std::vector<std::pair<std::string, Module*>> out{{prefix, this}};
  for (auto& [n, c] : children_) {
    for (auto& entry : c->named_modules(join_name(prefix, n))) out.push_back(std::move(entry));
  }
  return out;
}

std::shared_ptr<Module> Module::child(const std::string& name) const {
  std::string names;
  for (const auto& [n, c] : children_) {
    if (n == name) return c;
    names += (names.empty() ? "" : ", ") + n;
  }
  MINIDL_CHECK(false, type_name_, ": no child module named '", name, "'; children are [", names, "]");
  return nullptr;
}

int64_t Module::num_parameters() const {
  int64_t total = 0;
  for (const Tensor& p : parameters()) total += p.numel();
  return total;
}

int64_t Module::parameter_bytes() const {
  int64_t total = 0;
  for (const Tensor& p : parameters()) total += static_cast<int64_t>(p.nbytes());
  return total;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& [n, c] : children_) c->train(on);
}

void Module::to(Device device) {
  NoGradGuard no_grad;
  for (auto& [n, t] : named_parameters()) convert_in_place(t, device, t.dtype());
  for (auto& [n, t] : named_buffers()) convert_in_place(t, device, t.dtype());
  for (auto& [n, m] : named_modules()) m->moved_to(device);
}

Module& Module::to(DType dtype) {
  MINIDL_CHECK(is_floating(dtype), type_name_, ".to(", dtype_name(dtype),
               "): only floating dtypes (f32, f64, f16) can hold parameters and batch statistics; integer "
               "buffers such as num_batches_tracked keep their dtype anyway");
  NoGradGuard no_grad;
  // Parameters are floating by construction (they require grad); buffers may be counters.
  for (auto& [n, t] : named_parameters()) convert_in_place(t, t.device(), dtype);
  for (auto& [n, t] : named_buffers()) {
    if (is_floating(t.dtype())) convert_in_place(t, t.device(), dtype);
  }
  return *this;
}

int64_t Module::to_channels_last() {
  NoGradGuard no_grad;
  int64_t n = 0;
  for (auto& [name, t] : named_parameters()) {
    if (t.dim() != 4 || is_channels_last(t)) continue;
    TensorImpl& im = t.impl();
    if (im.grad) im.grad = minidl::to_channels_last(Tensor(im.grad).detach()).impl_ptr();
    const Tensor converted = minidl::to_channels_last(t.detach());
    im.storage = converted.storage();
    im.strides = converted.strides();
    im.offset = converted.offset();
    ++n;
  }
  autocast_clear_cache();   // a cached f16 copy was made in the old format
  return n;
}

void Module::zero_grad() {
  for (Tensor& p : parameters()) p.zero_grad();
}

std::vector<std::pair<std::string, Tensor>> Module::ordered_state_dict() const {
  std::vector<std::pair<std::string, Tensor>> out;
  collect_state("", out, true, true, true);
  for (auto& [n, t] : out) t = t.detach();
  return out;
}

std::map<std::string, Tensor> Module::state_dict() const {
  std::map<std::string, Tensor> out;
  for (auto& [n, t] : ordered_state_dict()) out.emplace(n, t);
  return out;
}

std::string StateDictDiff::summary(size_t first) const {
  const auto list = [first](const std::vector<std::string>& v) {
    std::string s;
    for (size_t i = 0; i < v.size() && i < first; ++i) s += (i ? ", " : "") + v[i];
    return "[" + s + (v.size() > first ? ", ..." : "") + "]";
  };
  return std::to_string(missing.size()) + " missing keys " + list(missing) + ", " + std::to_string(unexpected.size()) +
         " unexpected keys " + list(unexpected) + ", " + std::to_string(mismatched.size()) + " shape/dtype mismatches " +
         list(mismatched);
}

StateDictDiff Module::compare_state_dict(const std::map<std::string, Tensor>& state) const {
  std::vector<std::pair<std::string, Tensor>> own;
  collect_state("", own, true, true, true);
  StateDictDiff d;
  std::map<std::string, bool> known;
  for (const auto& [name, target] : own) {
    known[name] = true;
    auto it = state.find(name);
    if (it == state.end()) {
      d.missing.push_back(name);
      continue;
    }
    const Tensor& src = it->second;
    if (!src.defined() || src.shape() != target.shape() || src.dtype() != target.dtype()) {
      d.mismatched.push_back(name + " (expected " + dtype_name(target.dtype()) + shape_str(target.shape()) + ", got " +
                             (src.defined() ? std::string(dtype_name(src.dtype())) + shape_str(src.shape())
                                            : std::string("undefined")) +
                             ")");
    }
  }
  for (const auto& [name, t] : state) {
    if (!known.count(name)) d.unexpected.push_back(name);
  }
  std::sort(d.missing.begin(), d.missing.end());
  std::sort(d.mismatched.begin(), d.mismatched.end());
  return d;
}

void Module::load_state_dict(const std::map<std::string, Tensor>& state, bool strict) {
  const StateDictDiff d = compare_state_dict(state);
  const bool key_problems = strict && (!d.missing.empty() || !d.unexpected.empty());
  MINIDL_CHECK(!key_problems && d.mismatched.empty(), "load_state_dict(", type_name_, ", strict=",
               strict ? "true" : "false", "): ", d.summary(),
               ". Check that the checkpoint is for this architecture and class count (replace or skip the "
               "classifier entries), or call load_state_dict(state, /*strict=*/false) to skip missing and "
               "unexpected keys");
  std::vector<std::pair<std::string, Tensor>> own;
  collect_state("", own, true, true, true);
  NoGradGuard no_grad;
  for (auto& [name, target] : own) {
    auto it = state.find(name);
    if (it != state.end()) target.copy_(it->second);
  }
}

bool Module::summarizing() { return g_recorder != nullptr; }

Summary Module::summary(const Shape& input_shape) {
  MINIDL_CHECK(!input_shape.empty(), type_name_,
               ".summary: input shape is empty; pass [N, C, H, W] (N is replaced by 1)");
  Shape shape = input_shape;
  shape[0] = 1;
  Device device = Device::cpu();
  const auto params = parameters();
  if (!params.empty()) device = params.front().device();
  Summary s;
  s.total_parameters = num_parameters();
  // Two probe forwards would update batch-norm running statistics twice: restore the buffers.
  std::vector<std::pair<Tensor, Tensor>> saved_buffers;
  {
    NoGradGuard no_grad;
    for (const Tensor& b : buffers()) saved_buffers.emplace_back(b, b.clone());
  }
  auto restore = [&] {
    NoGradGuard no_grad;
    for (auto& [b, copy] : saved_buffers) b.copy_(copy);
  };
  const Tensor x = zeros(shape, {DType::f32, device, false});
  SummaryRecorder rec;
  for (auto& [name, m] : named_modules()) rec.names[m] = name.empty() ? type_name_ : name;
  rec.rows = &s.rows;
  rec.device = device;
  g_recorder = &rec;
  try {
    (void)(*this)(x);
    g_recorder = nullptr;
    // The total: an ordinary forward, measured while its graph (and output) is alive.
    const int64_t before = memory_stats(device).allocated_bytes;
    const Tensor out = (*this)(x);
    s.total_saved_bytes_per_sample = memory_stats(device).allocated_bytes - before;
  } catch (...) {
    g_recorder = nullptr;
    restore();
    throw;
  }
  restore();
  return s;
}

std::string Summary::str() const {
  std::ostringstream os;
  char line[256];
  std::snprintf(line, sizeof line, "%-28s %-18s %-22s %12s %16s\n", "layer", "type", "output", "params",
                "saved B/sample");
  os << line;
  for (const SummaryRow& r : rows) {
    std::snprintf(line, sizeof line, "%-28s %-18s %-22s %12lld %16lld\n", r.name.c_str(), r.type.c_str(),
                  shape_str(r.output_shape).c_str(), static_cast<long long>(r.num_parameters),
                  static_cast<long long>(r.saved_bytes_per_sample));
    os << line;
  }
  std::snprintf(line, sizeof line, "total parameters: %lld; saved for backward per sample: %lld bytes\n",
                static_cast<long long>(total_parameters), static_cast<long long>(total_saved_bytes_per_sample));
  os << line;
  return os.str();
}

}  // namespace minidl::nn
