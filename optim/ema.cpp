// The EMA update and its state, with in-place minidl ops so it runs on the parameters' device
// without allocating per step.
#include "optim/ema.h"

#include <cmath>
#include <set>

#include "core/autograd.h"
#include "core/error.h"

namespace minidl::optim {

namespace {
std::string shadow_key(size_t i) { return "shadow." + std::to_string(i); }
}  // namespace

Ema::Ema(const std::vector<Tensor>& params, double decay) : decay_(decay) {
  MINIDL_CHECK(std::isfinite(decay) && decay >= 0.0 && decay < 1.0, "Ema: decay ", decay,
               " must be in [0, 1) (e.g. 0.999; 1 would never move the average)");
  NoGradGuard no_grad;
  std::set<const TensorImpl*> seen;
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    MINIDL_CHECK(p.defined(), "Ema: parameter ", i, " is an undefined Tensor; pass only real parameters");
    MINIDL_CHECK(is_floating(p.dtype()), "Ema: parameter ", i, " is ", p.meta(), ", not floating point");
    MINIDL_CHECK(seen.insert(p.impl_ptr().get()).second, "Ema: parameter ", i, " (", p.meta(),
                 ") is listed twice; pass each parameter once");
    params_.push_back(p);
    shadows_.push_back(p.dtype() == DType::f16 ? p.detach().to(DType::f32) : p.detach().clone());
  }
}

void Ema::update() {
  NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) {
    shadows_[i].mul_(decay_);
    const Tensor p = params_[i].detach();
    shadows_[i].add_(p.dtype() == shadows_[i].dtype() ? p : p.to(shadows_[i].dtype()), 1.0 - decay_);
  }
  ++num_updates_;
}

void Ema::copy_to(const std::vector<Tensor>& params) const {
  MINIDL_CHECK(params.size() == shadows_.size(), "Ema::copy_to: got ", params.size(), " parameters but the Ema tracks ",
               shadows_.size(), "; pass the same parameter list as at construction");
  NoGradGuard no_grad;
  for (size_t i = 0; i < params.size(); ++i) {
    MINIDL_CHECK(params[i].defined() && params[i].shape() == shadows_[i].shape(), "Ema::copy_to: parameter ", i,
                 " is ", params[i].defined() ? params[i].meta() : std::string("undefined"), " but its shadow is ",
                 shadows_[i].meta(), "; pass the same parameter list as at construction");
    Tensor dst = params[i];
    dst.copy_(shadows_[i]);
  }
}

std::map<std::string, Tensor> Ema::state_dict() const {
  NoGradGuard no_grad;
  std::map<std::string, Tensor> state;
  for (size_t i = 0; i < shadows_.size(); ++i) state[shadow_key(i)] = shadows_[i].clone();
  state["num_updates"] = scalar_tensor(static_cast<double>(num_updates_), {.dtype = DType::i64});
  state["decay"] = scalar_tensor(decay_, {.dtype = DType::f64});
  return state;
}

void Ema::load_state_dict(const std::map<std::string, Tensor>& state) {
  const auto get = [&](const std::string& key) -> const Tensor& {
    const auto it = state.find(key);
    MINIDL_CHECK(it != state.end() && it->second.defined(), "Ema::load_state_dict: the state has no '", key,
                 "'; it must come from Ema::state_dict() of an Ema over the same parameters");
    return it->second;
  };
  const size_t expected = shadows_.size() + 2;
  MINIDL_CHECK(state.size() == expected, "Ema::load_state_dict: the state has ", state.size(),
               " entries but this Ema expects ", expected, " (", shadows_.size(),
               " shadows, num_updates, decay); was it saved for a different model?");
  const double saved_decay = get("decay").item();
  MINIDL_CHECK(saved_decay == decay_, "Ema::load_state_dict: the state was saved with decay ", saved_decay,
               " but this Ema has decay ", decay_, "; construct the Ema with decay ", saved_decay, " to resume");
  const double updates = get("num_updates").item();
  MINIDL_CHECK(updates >= 0.0 && updates == std::floor(updates), "Ema::load_state_dict: num_updates ", updates,
               " is not a non-negative integer");
  // Validate every shadow before writing any, so a failed load leaves the Ema unchanged.
  for (size_t i = 0; i < shadows_.size(); ++i) {
    const Tensor& s = get(shadow_key(i));
    MINIDL_CHECK(s.shape() == shadows_[i].shape(), "Ema::load_state_dict: '", shadow_key(i), "' is ", s.meta(),
                 " but the parameter is ", shadows_[i].meta(), "; was it saved for a different model?");
  }
  NoGradGuard no_grad;
  for (size_t i = 0; i < shadows_.size(); ++i) shadows_[i].copy_(get(shadow_key(i)));
  num_updates_ = static_cast<int64_t>(updates);
}

}  // namespace minidl::optim
