// Adam and AdamW, the adaptive optimizers of the batch-size studies, with exactly
// torch.optim.Adam / AdamW's (1.13) updates: Adam adds weight decay to the gradient (L2), AdamW
// decays the weights directly (decoupled), which is what makes their results differ.
#pragma once
#include <vector>

#include "optim/optimizer.h"

namespace minidl::optim {

struct AdamOptions {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 0.0;  // AdamW's default in PyTorch is 1e-2: see AdamW below
  bool amsgrad = false;
  bool maximize = false;
};

// Per parameter, with g its gradient (negated when maximize) and t its own step count (+1 first):
//   Adam:  g += weight_decay * p            AdamW: p *= 1 - lr * weight_decay
//   m = beta1*m + (1-beta1)*g;  v = beta2*v + (1-beta2)*g*g
//   amsgrad: vmax = max(vmax, v), used instead of v below
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
// State: "exp_avg", "exp_avg_sq", "max_exp_avg_sq" (amsgrad) and the per-parameter step.
class Adam : public Optimizer {
 public:
  Adam(std::vector<Tensor> params, const AdamOptions& options = {});
  Adam(std::vector<ParamGroup> groups, const AdamOptions& defaults = {});

 protected:
  Adam(const char* name, bool decoupled, std::vector<ParamGroup> groups, const AdamOptions& defaults);
  void validate_hyper_parameters(const ParamGroup& group) const override;
  std::vector<std::string> buffer_names(const ParamGroup& group) const override;
  bool keeps_param_step() const override { return true; }
  void update(const ParamGroup& group, Tensor& param, const Tensor& grad, ParamState& state) override;
  bool fused_group_step(size_t g) override;

 private:
  bool decoupled_;
};

// AdamOptions with PyTorch's AdamW default weight decay.
inline AdamOptions adamw_defaults() {
  AdamOptions o;
  o.weight_decay = 1e-2;
  return o;
}

class AdamW : public Adam {
 public:
  AdamW(std::vector<Tensor> params, const AdamOptions& options = adamw_defaults());
  AdamW(std::vector<ParamGroup> groups, const AdamOptions& defaults = adamw_defaults());
};

}  // namespace minidl::optim
