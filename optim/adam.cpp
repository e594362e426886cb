// Adam/AdamW's update, written as PyTorch 1.13's _single_tensor_adam(w) (non-capturable) with
// minidl's ops so it runs on any device and rounds like PyTorch: bias corrections are computed in
// double on the host from the per-parameter step, as PyTorch does with step.item(). The fused CUDA
// kernel computes the same formula in double on the device, from the device's step counts in the
// optimizer's device state (CUDA graphs).
#include "optim/adam.h"

#include <cmath>

#include "core/backend.h"
#include "core/ops.h"

namespace minidl::optim {

namespace {

std::map<std::string, double> adam_defaults(const AdamOptions& o) {
  std::map<std::string, double> d{{"lr", o.lr},
                                  {"weight_decay", o.weight_decay},
                                  {"beta1", o.beta1},
                                  {"beta2", o.beta2},
                                  {"eps", o.eps},
                                  {"amsgrad", o.amsgrad ? 1.0 : 0.0},
                                  {"maximize", o.maximize ? 1.0 : 0.0}};
  if (o.keras_eps) d["keras_eps"] = 1.0;  // absent when off: state files and their keys as PyTorch's
  return d;
}

bool keras_eps(const ParamGroup& group) {
  const auto it = group.options.find("keras_eps");
  return it != group.options.end() && it->second != 0.0;
}

}  // namespace

Adam::Adam(std::vector<Tensor> params, const AdamOptions& options)
    : Adam("Adam", false, single_group(std::move(params)), options) {}

Adam::Adam(std::vector<ParamGroup> groups, const AdamOptions& defaults)
    : Adam("Adam", false, std::move(groups), defaults) {}

Adam::Adam(const char* name, bool decoupled, std::vector<ParamGroup> groups, const AdamOptions& defaults)
    : Optimizer(name, adam_defaults(defaults)), decoupled_(decoupled) {
  init_groups(std::move(groups));
}

AdamW::AdamW(std::vector<Tensor> params, const AdamOptions& options)
    : Adam("AdamW", true, single_group(std::move(params)), options) {}

AdamW::AdamW(std::vector<ParamGroup> groups, const AdamOptions& defaults)
    : Adam("AdamW", true, std::move(groups), defaults) {}

void Adam::validate_hyper_parameters(const ParamGroup& group) const {
  Optimizer::validate_hyper_parameters(group);
  for (const char* b : {"beta1", "beta2"}) {
    const double v = group.option(b);
    MINIDL_CHECK(v >= 0 && v < 1, name(), ": invalid ", b, " ", v, "; betas must be in [0, 1) (PyTorch's defaults are ",
                 "0.9 and 0.999)");
  }
  const double eps = group.option("eps");
  MINIDL_CHECK(std::isfinite(eps) && eps > 0, name(), ": invalid eps ", eps,
               "; eps must be > 0 (it keeps the denominator away from zero; the default is 1e-8)");
}

std::vector<std::string> Adam::buffer_names(const ParamGroup& group) const {
  if (group.option("amsgrad") != 0.0) return {"exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
  return {"exp_avg", "exp_avg_sq"};
}

void Adam::update(const ParamGroup& group, Tensor& param, const Tensor& grad, ParamState& state) {
  const double lr = group.lr;
  const double wd = group.weight_decay;
  const double beta1 = group.option("beta1");
  const double beta2 = group.option("beta2");
  const double eps = group.option("eps");
  const bool amsgrad = group.option("amsgrad") != 0.0;

  if (state.empty()) {
    for (const auto& k : buffer_names(group)) state.buffers[k] = zeros_like(param);
  }
  Tensor& exp_avg = state.buffers.at("exp_avg");
  Tensor& exp_avg_sq = state.buffers.at("exp_avg_sq");

  Tensor g = group.option("maximize") != 0.0 ? neg(grad) : grad;
  state.step += 1;
  if (decoupled_) {
    param.mul_(1.0 - lr * wd);
  } else if (wd != 0.0) {
    g = g.clone();  // never modify the caller's gradient
    g.add_(param, wd);
  }
  exp_avg.mul_(beta1).add_(g, 1.0 - beta1);
  exp_avg_sq.mul_(beta2).add_(mul(g, g), 1.0 - beta2);

  const auto step = static_cast<double>(state.step);
  const double bias_correction1 = 1.0 - std::pow(beta1, step);
  const double bias_correction2 = 1.0 - std::pow(beta2, step);
  const double step_size = lr / bias_correction1;
  const double bias_correction2_sqrt = std::sqrt(bias_correction2);

  Tensor denom;
  if (amsgrad) {
    Tensor& max_sq = state.buffers.at("max_exp_avg_sq");
    max_sq.copy_(maximum(max_sq, exp_avg_sq));
    denom = sqrt(max_sq) / bias_correction2_sqrt;
  } else {
    denom = sqrt(exp_avg_sq) / bias_correction2_sqrt;
  }
  denom = denom + (keras_eps(group) ? eps / bias_correction2_sqrt : eps);
  param.add_(exp_avg / denom, -step_size);
}

// All parameters of the group on one device: one Backend::fused_adam_step call (CUDA: one
// launch; CPU: one multi-threaded pass with update()'s arithmetic to the bit). New state and the
// incremented step counts are committed only when the backend took the group, so a declined group
// goes through update() exactly as before.
bool Adam::fused_group_step(size_t g) {
  std::vector<size_t> idx;
  if (!group_on_one_device(g, idx)) return false;
  if (idx.empty()) return true;
  const ParamGroup& group = groups_[g];
  const bool amsgrad = group.option("amsgrad") != 0.0;
  std::vector<Tensor> params, grads, m, v, vmax;
  std::vector<int64_t> steps;
  std::vector<std::map<std::string, Tensor>> fresh(idx.size());
  for (size_t k = 0; k < idx.size(); ++k) {
    const size_t i = idx[k];
    const ParamState& st = state_[g][i];
    params.push_back(group.params[i]);
    grads.push_back(group.params[i].grad());
    std::map<std::string, Tensor> bufs = st.buffers;
    if (st.empty()) {
      for (const auto& name : buffer_names(group)) fresh[k][name] = bufs[name] = zeros_like(params.back());
    }
    m.push_back(bufs.at("exp_avg"));
    v.push_back(bufs.at("exp_avg_sq"));
    if (amsgrad) vmax.push_back(bufs.at("max_exp_avg_sq"));
    steps.push_back(st.step + 1);
  }
  AdamHyper h{group.lr,
              group.weight_decay,
              group.option("beta1"),
              group.option("beta2"),
              group.option("eps"),
              amsgrad,
              group.option("maximize") != 0.0,
              decoupled_,
              skip_flag(),
              keras_eps(group),
              lr_device(g)};
  MINIDL_CHECK(skip_flag() == nullptr || device_state(), name(), ": the gradient scaler's device state (CUDA graphs) ",
               "skips a step on the device, but the step counts (bias correction) are on the host, where a skipped ",
               "step would still count; call to_device_state() on the optimizer too (GraphedStep does)");
  // The device state: each parameter's count lives on the device, which advances it (or not, when
  // the gradient scaler's flag skips the step): the host's counts are read back when needed.
  std::vector<int64_t*> counts;
  for (size_t i : idx) counts.push_back(step_device(g, i));
  if (device_state()) h.step_device = counts.data();
  if (!backend(params.front().device()).fused_adam_step(params, grads, m, v, vmax, steps, h)) return false;
  for (size_t k = 0; k < idx.size(); ++k) {
    ParamState& st = state_[g][idx[k]];
    for (auto& [name, t] : fresh[k]) st.buffers[name] = t;
    if (!device_state()) st.step = steps[k];
  }
  return true;
}

}  // namespace minidl::optim
