// SGD's update, written as PyTorch 1.13's _single_tensor_sgd with minidl's in-place ops so it runs
// on any device and rounds like PyTorch (same operations in the same order).
#include "optim/sgd.h"

#include <cmath>

#include "core/backend.h"
#include "core/ops.h"

namespace minidl::optim {

namespace {

std::map<std::string, double> sgd_defaults(const SgdOptions& o) {
  return {{"lr", o.lr},
          {"weight_decay", o.weight_decay},
          {"momentum", o.momentum},
          {"dampening", o.dampening},
          {"nesterov", o.nesterov ? 1.0 : 0.0},
          {"maximize", o.maximize ? 1.0 : 0.0}};
}

}  // namespace

SGD::SGD(std::vector<Tensor> params, const SgdOptions& options) : SGD(single_group(std::move(params)), options) {}

SGD::SGD(std::vector<ParamGroup> groups, const SgdOptions& defaults) : Optimizer("SGD", sgd_defaults(defaults)) {
  init_groups(std::move(groups));
}

void SGD::validate_hyper_parameters(const ParamGroup& group) const {
  MINIDL_CHECK(!std::isnan(group.lr), "SGD: lr is required; set SgdOptions::lr (or the group's lr)");
  Optimizer::validate_hyper_parameters(group);
  const double momentum = group.option("momentum");
  const double dampening = group.option("dampening");
  MINIDL_CHECK(std::isfinite(momentum) && momentum >= 0, "SGD: invalid momentum ", momentum,
               "; momentum must be >= 0 (0 disables it)");
  MINIDL_CHECK(std::isfinite(dampening), "SGD: invalid dampening ", dampening, "; dampening must be finite");
  if (group.option("nesterov") != 0.0) {
    MINIDL_CHECK(momentum > 0 && dampening == 0, "SGD: nesterov momentum requires momentum > 0 and dampening = 0 (got ",
                 "momentum ", momentum, ", dampening ", dampening, "); set momentum > 0 and dampening 0, or nesterov "
                 "false");
  }
}

std::vector<std::string> SGD::buffer_names(const ParamGroup& group) const {
  if (group.option("momentum") == 0.0) return {};
  return {"momentum_buffer"};
}

void SGD::update(const ParamGroup& group, Tensor& param, const Tensor& grad, ParamState& state) {
  const double momentum = group.option("momentum");
  const double dampening = group.option("dampening");
  const bool nesterov = group.option("nesterov") != 0.0;
  Tensor d_p = group.option("maximize") != 0.0 ? neg(grad) : grad;
  if (group.weight_decay != 0.0) {
    d_p = d_p.clone();  // never modify the caller's gradient
    d_p.add_(param, group.weight_decay);
  }
  if (momentum != 0.0) {
    auto it = state.buffers.find("momentum_buffer");
    if (it == state.buffers.end()) {
      state.buffers["momentum_buffer"] = d_p.detach().clone();
    } else {
      it->second.mul_(momentum).add_(d_p, 1.0 - dampening);
    }
    const Tensor& buf = state.buffers["momentum_buffer"];
    if (nesterov) {
      d_p = d_p.clone();
      d_p.add_(buf, momentum);
    } else {
      d_p = buf;
    }
  }
  param.add_(d_p, -group.lr);
}

// All parameters of the group on one CUDA device: one Backend::fused_sgd_step call. Fresh
// momentum buffers are made here but kept only when the backend took the group, so a declined
// group goes through update() exactly as before.
bool SGD::fused_group_step(size_t g) {
  std::vector<size_t> idx;
  if (!group_on_one_cuda_device(g, idx)) return false;
  if (idx.empty()) return true;
  const ParamGroup& group = groups_[g];
  const bool use_momentum = group.option("momentum") != 0.0;
  std::vector<Tensor> params, grads, bufs;
  std::vector<uint8_t> fresh;
  for (size_t i : idx) {
    params.push_back(group.params[i]);
    grads.push_back(group.params[i].grad());
    if (!use_momentum) continue;
    const auto it = state_[g][i].buffers.find("momentum_buffer");
    fresh.push_back(it == state_[g][i].buffers.end() ? 1 : 0);
    bufs.push_back(fresh.back() ? empty_like(params.back()) : it->second);   // the parameter's format
  }
  const SgdHyper h{group.lr, group.weight_decay, group.option("momentum"), group.option("dampening"),
                   group.option("nesterov") != 0.0, group.option("maximize") != 0.0, skip_flag(), lr_device(g)};
  if (!backend(params.front().device()).fused_sgd_step(params, grads, bufs, fresh, h)) return false;
  for (size_t k = 0; k < fresh.size(); ++k) {
    if (fresh[k]) state_[g][idx[k]].buffers["momentum_buffer"] = bufs[k];
  }
  return true;
}

}  // namespace minidl::optim
