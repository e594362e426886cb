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
  // Keras / TensorFlow's placement of eps ("epsilon hat" of Kingma and Ba, before their Section
  // 2.1): p -= lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + eps), i.e. PyTorch's update
  // with eps / sqrt(1 - beta2^t) (31.6x eps at the first step, eps after a few thousand). Keras'
  // default eps is 1e-7. Kept out of the state_dict when false, so PyTorch-style files are as before.
  bool keras_eps = false;
};

// Per parameter, with g its gradient (negated when maximize) and t its own step count (+1 first):
//   Adam:  g += weight_decay * p            AdamW: p *= 1 - lr * weight_decay
//   m = beta1*m + (1-beta1)*g;  v = beta2*v + (1-beta2)*g*g
//   amsgrad: vmax = max(vmax, v), used instead of v below
//   p -= lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//   keras_eps: eps / sqrt(1 - beta2^t) in place of eps (Keras' update, rounded as PyTorch's)
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
