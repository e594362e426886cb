// The shared optimizer machinery: group bookkeeping and validation, the step loop and the
// state_dict format (documented in optimizer.h), kept here so every optimizer saves and resumes
// the same way and a checkpoint written by one run loads bit-exactly into the next.
#include "optim/optimizer.h"

#include <cmath>
#include <set>
#include <sstream>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/backend.h"

namespace minidl::optim {

std::vector<ParamGroup> Optimizer::single_group(std::vector<Tensor> params) {
  std::vector<ParamGroup> groups;
  if (!params.empty()) groups.push_back(ParamGroup{.params = std::move(params)});
  return groups;
}

double ParamGroup::option(const std::string& name) const {
  const auto it = options.find(name);
  MINIDL_CHECK(it != options.end(), "ParamGroup: no option '", name, "'; add it to ParamGroup::options");
  return it->second;
}

Optimizer::Optimizer(std::string name, std::map<std::string, double> defaults)
    : name_(std::move(name)), defaults_(std::move(defaults)) {}

void Optimizer::init_groups(std::vector<ParamGroup> groups) {
  MINIDL_CHECK(!groups.empty(), name_, ": got an empty parameter list; pass at least one parameter");
  for (auto& g : groups) add_param_group(std::move(g));
}

void Optimizer::validate_hyper_parameters(const ParamGroup& group) const {
  MINIDL_CHECK(std::isfinite(group.lr) && group.lr >= 0, name_, ": invalid learning rate ", group.lr,
               "; lr must be a finite number >= 0");
  MINIDL_CHECK(std::isfinite(group.weight_decay) && group.weight_decay >= 0, name_, ": invalid weight_decay ",
               group.weight_decay, "; weight_decay must be a finite number >= 0 (0 disables it)");
}

void Optimizer::check_group(const ParamGroup& group, size_t group_index) const {
  MINIDL_CHECK(!group.params.empty(), name_, ": parameter group ", group_index,
               " has no parameters; pass at least one tensor");
  for (size_t i = 0; i < group.params.size(); ++i) {
    const Tensor& p = group.params[i];
    MINIDL_CHECK(p.defined(), name_, ": parameter ", i, " of group ", group_index, " is an undefined Tensor");
    MINIDL_CHECK(is_floating(p.dtype()), name_, ": parameter ", i, " of group ", group_index, " (", p.meta(),
                 ") is not floating; only floating tensors can be optimized");
    MINIDL_CHECK(p.requires_grad(), name_, ": parameter ", i, " of group ", group_index, " (", p.meta(),
                 ") does not require grad; call set_requires_grad(true) on it or leave it out");
    MINIDL_CHECK(p.is_leaf(), name_, ": parameter ", i, " of group ", group_index, " (", p.meta(),
                 ") is not a leaf (it is the result of ", p.grad_fn()->name(),
                 "); optimize the leaf tensors it was computed from");
  }
  // A parameter listed twice would be updated twice per step.
  std::set<const TensorImpl*> seen;
  for (const auto& g : groups_)
    for (const auto& p : g.params) seen.insert(p.impl_ptr().get());
  for (size_t i = 0; i < group.params.size(); ++i) {
    const bool fresh = seen.insert(group.params[i].impl_ptr().get()).second;
    MINIDL_CHECK(fresh, name_, ": parameter ", i, " of group ", group_index, " (", group.params[i].meta(),
                 ") appears more than once (in this group or an earlier one); list each parameter once");
  }
}

void Optimizer::add_param_group(ParamGroup group) {
  MINIDL_CHECK(!device_state(), name_, ".add_param_group: the optimizer is in its device state (CUDA graphs); call ",
               "to_host_state() first, add the group, then to_device_state() again");
  if (std::isnan(group.lr)) group.lr = defaults_.at("lr");
  if (std::isnan(group.weight_decay)) group.weight_decay = defaults_.at("weight_decay");
  for (const auto& [k, v] : group.options) {
    (void)v;
    MINIDL_CHECK(k != "lr" && k != "weight_decay" && defaults_.count(k), name_, ": unknown option '", k,
                 "' in a parameter group; set lr and weight_decay as ParamGroup fields, and use only this "
                 "optimizer's options");
  }
  for (const auto& [k, v] : defaults_)
    if (k != "lr" && k != "weight_decay" && !group.options.count(k)) group.options[k] = v;
  check_group(group, groups_.size());
  validate_hyper_parameters(group);
  state_.emplace_back(group.params.size());
  groups_.push_back(std::move(group));
}

void Optimizer::set_step_count(int64_t n) {
  MINIDL_CHECK(n >= 0, name_, ".set_step_count: a step count cannot be negative, got ", n);
  step_count_ = n;
}

void Optimizer::zero_grad() {
  for (auto& g : groups_) {
    for (auto& p : g.params) {
      Tensor grad = p.grad();
      if (grads_to_none_ || !grad.defined()) {
        p.zero_grad();
      } else {
        NoGradGuard no_grad;
        grad.zero_();
      }
    }
  }
  // A new step (or window) starts: autocast's f16 weight copies live only between zero_grad() and
  // step(), so weights changed in between steps (a loaded checkpoint) are never served stale.
  autocast_clear_cache();
}

void Optimizer::step() {
  NoGradGuard no_grad;
  upload_lrs();
  for (size_t g = 0; g < groups_.size(); ++g) {
    if (fused_group_step(g)) continue;
    MINIDL_CHECK(!skip_flag_.defined() && !device_state(), name_, ".step: parameter group ", g, " cannot take the "
                 "fused CUDA path (every parameter and gradient a contiguous f32 tensor on one CUDA device), which ",
                 skip_flag_.defined() ? "the gradient scaler's device state (CUDA graphs) needs to skip a step "
                                        "without a host sync"
                                      : "the optimizer's device state (CUDA graphs) needs to read its rates and step "
                                        "counts on the device",
                 "; run without --cuda-graphs, or keep the parameters f32 on one CUDA device");
    for (size_t i = 0; i < groups_[g].params.size(); ++i) {
      Tensor& p = groups_[g].params[i];
      const Tensor grad = p.grad();
      if (!grad.defined()) continue;
      update(groups_[g], p, grad, state_[g][i]);
    }
  }
  ++step_count_;
  autocast_clear_cache();  // the f16 weight copies of autocast are stale now (core/autocast.h)
}

const float* Optimizer::skip_flag() const {
  return skip_flag_.defined() ? static_cast<const float*>(skip_flag_.data_ptr()) : nullptr;
}

const double* Optimizer::lr_device(size_t g) const {
  return device_state() ? static_cast<const double*>(dev_lrs_.data_ptr()) + g : nullptr;
}

int64_t* Optimizer::step_device(size_t g, size_t i) const {
  if (!dev_steps_.defined()) return nullptr;
  return static_cast<int64_t*>(dev_steps_.data_ptr()) + step_offsets_[g] + i;
}

void Optimizer::to_device_state(Device device) {
  MINIDL_CHECK(device.target() == DeviceType::CUDA, name_, ".to_device_state: the device state is for CUDA graphs; ",
               "got ", device.str());
  MINIDL_CHECK(!backend(device).capturing(device.index), name_, ".to_device_state: called during a capture; move ",
               "the optimizer to its device state between steps, before capturing");
  if (device_state()) to_host_state();
  NoGradGuard no_grad;
  const TensorOptions on{DType::f64, device, false};
  dev_lrs_ = zeros({static_cast<int64_t>(groups_.size())}, on);
  uploaded_lrs_.clear();
  upload_lrs();
  if (!keeps_param_step()) return;
  step_offsets_.clear();
  size_t total = 0;
  for (const ParamGroup& g : groups_) {
    step_offsets_.push_back(total);
    total += g.params.size();
  }
  dev_steps_ = zeros({static_cast<int64_t>(total)}, {DType::i64, device, false});
  push_steps();
}

void Optimizer::to_host_state() {
  if (!device_state()) return;
  pull_steps();
  dev_lrs_ = dev_steps_ = Tensor();
  uploaded_lrs_.clear();
  step_offsets_.clear();
}

void Optimizer::upload_lrs() {
  if (!device_state() || backend(dev_lrs_.device()).capturing(dev_lrs_.device().index)) return;
  std::vector<double> lrs;
  for (const ParamGroup& g : groups_) lrs.push_back(g.lr);
  if (lrs == uploaded_lrs_) return;
  NoGradGuard no_grad;
  dev_lrs_.copy_(from_vector(lrs, {static_cast<int64_t>(lrs.size())}, {.dtype = DType::f64}));
  uploaded_lrs_ = std::move(lrs);
}

void Optimizer::pull_steps() const {
  // The meta device has no values: its counts stay the host's (a dry run never reads them).
  if (!dev_steps_.defined() || dev_steps_.device().is_meta()) return;
  const Tensor host = dev_steps_.to(Device::cpu());
  const int64_t* s = host.data<int64_t>();
  for (size_t g = 0; g < state_.size(); ++g)
    for (size_t i = 0; i < state_[g].size(); ++i) state_[g][i].step = s[step_offsets_[g] + i];
}

void Optimizer::push_steps() {
  if (!dev_steps_.defined()) return;
  std::vector<double> steps;
  for (const auto& group : state_)
    for (const ParamState& st : group) steps.push_back(static_cast<double>(st.step));
  NoGradGuard no_grad;
  dev_steps_.copy_(from_vector(steps, {static_cast<int64_t>(steps.size())}, {.dtype = DType::i64}));
}

bool Optimizer::group_on_one_cuda_device(size_t g, std::vector<size_t>& with_grad) const {
  with_grad.clear();
  // a GPU, or the meta device standing for one
  return groups_[g].params.front().device().target() == DeviceType::CUDA && group_on_one_device(g, with_grad);
}

bool Optimizer::group_on_one_device(size_t g, std::vector<size_t>& with_grad) const {
  with_grad.clear();
  const std::vector<Tensor>& ps = groups_[g].params;
  const Device dev = ps.front().device();
  for (size_t i = 0; i < ps.size(); ++i) {
    if (ps[i].device() != dev) return false;
    const Tensor grad = ps[i].grad();
    if (!grad.defined()) continue;
    if (grad.device() != dev) return false;
    with_grad.push_back(i);
  }
  return true;
}

double Optimizer::lr(size_t group) const {
  MINIDL_CHECK(group < groups_.size(), name_, ".lr: group ", group, " out of range (", groups_.size(), " groups)");
  return groups_[group].lr;
}

void Optimizer::set_lr(size_t group, double lr) {
  MINIDL_CHECK(group < groups_.size(), name_, ".set_lr: group ", group, " out of range (", groups_.size(),
               " groups)");
  MINIDL_CHECK(std::isfinite(lr) && lr >= 0, name_, ".set_lr: invalid learning rate ", lr, " for group ", group,
               "; lr must be a finite number >= 0");
  groups_[group].lr = lr;
}

const ParamState& Optimizer::state(size_t group, size_t index) const {
  MINIDL_CHECK(group < state_.size() && index < state_[group].size(), name_, ".state: no parameter ", index,
               " in group ", group);
  pull_steps();
  return state_[group][index];
}

// ---- state_dict ----

namespace {

std::string group_key(size_t g, const std::string& name) { return "group." + std::to_string(g) + "." + name; }
std::string state_key(size_t g, size_t i, const std::string& name) {
  return "state." + std::to_string(g) + "." + std::to_string(i) + "." + name;
}
Tensor f64_scalar(double v) { return scalar_tensor(v, {.dtype = DType::f64}); }
Tensor i64_scalar(int64_t v) { return scalar_tensor(static_cast<double>(v), {.dtype = DType::i64}); }

}  // namespace

std::map<std::string, Tensor> Optimizer::state_dict() const {
  std::map<std::string, Tensor> d;
  pull_steps();
  d["state.step"] = i64_scalar(step_count_);
  for (size_t g = 0; g < groups_.size(); ++g) {
    const ParamGroup& grp = groups_[g];
    d[group_key(g, "num_params")] = i64_scalar(static_cast<int64_t>(grp.params.size()));
    d[group_key(g, "lr")] = f64_scalar(grp.lr);
    d[group_key(g, "weight_decay")] = f64_scalar(grp.weight_decay);
    for (const auto& [k, v] : grp.options) d[group_key(g, k)] = f64_scalar(v);
    for (size_t i = 0; i < grp.params.size(); ++i) {
      const ParamState& st = state_[g][i];
      if (st.empty()) continue;
      for (const auto& [k, buf] : st.buffers) d[state_key(g, i, k)] = buf.detach().clone();
      if (keeps_param_step()) d[state_key(g, i, "step")] = i64_scalar(st.step);
    }
  }
  return d;
}

void Optimizer::load_state_dict(const std::map<std::string, Tensor>& dict) {
  const std::string who = name_ + ".load_state_dict";
  std::set<std::string> used;
  auto find = [&](const std::string& key) -> const Tensor* {
    const auto it = dict.find(key);
    if (it == dict.end()) return nullptr;
    used.insert(key);
    MINIDL_CHECK(it->second.defined(), who, ": '", key, "' is an undefined Tensor");
    return &it->second;
  };
  auto need = [&](const std::string& key) -> const Tensor& {
    const Tensor* t = find(key);
    MINIDL_CHECK(t != nullptr, who, ": missing key '", key, "'; the dict must come from state_dict() of a ",
                 name_, " over the same parameter groups");
    return *t;
  };
  auto scalar = [&](const std::string& key, DType dtype) -> double {
    const Tensor& t = need(key);
    MINIDL_CHECK(t.dim() == 0 && t.dtype() == dtype, who, ": '", key, "' must be a 0-dim ", dtype_name(dtype),
                 " tensor, got ", t.meta());
    return t.item();
  };

  const auto steps = static_cast<int64_t>(scalar("state.step", DType::i64));
  MINIDL_CHECK(steps >= 0, who, ": 'state.step' is negative (", steps, ")");

  std::vector<ParamGroup> groups = groups_;
  for (size_t g = 0; g < groups.size(); ++g) {
    ParamGroup& grp = groups[g];
    const auto n = static_cast<int64_t>(scalar(group_key(g, "num_params"), DType::i64));
    MINIDL_CHECK(n == static_cast<int64_t>(grp.params.size()), who, ": group ", g, " was saved with ", n,
                 " parameters but this optimizer's group ", g, " has ", grp.params.size(),
                 "; build the optimizer over the same parameter groups before loading");
    grp.lr = scalar(group_key(g, "lr"), DType::f64);
    grp.weight_decay = scalar(group_key(g, "weight_decay"), DType::f64);
    for (auto& [k, v] : grp.options) v = scalar(group_key(g, k), DType::f64);
    validate_hyper_parameters(grp);
  }

  std::vector<std::vector<ParamState>> states(groups.size());
  for (size_t g = 0; g < groups.size(); ++g) {
    states[g].resize(groups[g].params.size());
    const std::vector<std::string> names = buffer_names(groups[g]);
    for (size_t i = 0; i < groups[g].params.size(); ++i) {
      const Tensor& p = groups[g].params[i];
      ParamState& st = states[g][i];
      std::vector<std::string> present, absent;
      for (const auto& k : names) {
        const Tensor* src = find(state_key(g, i, k));
        if (src == nullptr) {
          absent.push_back(state_key(g, i, k));
          continue;
        }
        present.push_back(state_key(g, i, k));
        MINIDL_CHECK(src->shape() == p.shape() && src->dtype() == p.dtype(), who, ": '", state_key(g, i, k), "' is ",
                     src->meta(), " but parameter ", i, " of group ", g, " is ", p.meta(),
                     "; the state must match its parameter's shape and dtype");
        Tensor buf = empty_like(p);   // the parameter's memory format, as a fresh state's: the fused path takes it
        buf.copy_(*src);
        st.buffers[k] = buf;
      }
      if (keeps_param_step()) {
        const std::string key = state_key(g, i, "step");
        if (find(key) != nullptr) {
          const auto s = static_cast<int64_t>(scalar(key, DType::i64));
          MINIDL_CHECK(s > 0, who, ": '", key, "' must be > 0 when present, got ", s);
          st.step = s;
          present.push_back(key);
        } else {
          absent.push_back(key);
        }
      }
      MINIDL_CHECK(present.empty() || absent.empty(), who, ": incomplete state for parameter ", i, " of group ", g,
                   ": has '", present.empty() ? "" : present.front(), "' but not '",
                   absent.empty() ? "" : absent.front(), "'; save the dict with state_dict() and load it whole");
    }
  }

  for (const auto& [k, v] : dict) {
    (void)v;
    MINIDL_CHECK(used.count(k), who, ": unknown key '", k, "' (this ", name_, " has ", groups.size(),
                 " group(s); keys are documented in optim/optimizer.h); was the dict saved by another optimizer "
                 "or over other parameter groups?");
  }

  groups_ = std::move(groups);
  state_ = std::move(states);
  step_count_ = steps;
  if (device_state()) {   // the loaded rates and counts replace the device's
    uploaded_lrs_.clear();
    upload_lrs();
    push_steps();
  }
}

}  // namespace minidl::optim
