// Stochastic gradient descent with momentum, dampening, Nesterov and L2 weight decay: the
// optimizer of the ResNet batch-size studies, with exactly torch.optim.SGD's (1.13) update so
// results carry over from the PyTorch papers they reproduce.
#pragma once
#include <vector>

#include "optim/optimizer.h"

namespace minidl::optim {

struct SgdOptions {
  double lr = kUnset;  // required (as in PyTorch): no sensible default
  double momentum = 0.0;
  double dampening = 0.0;
  double weight_decay = 0.0;
  bool nesterov = false;
  bool maximize = false;
};

// Per parameter, with g its gradient (negated when maximize):
//   g += weight_decay * p;
//   momentum != 0: buf = g on the first step (no dampening), else buf = momentum*buf + (1-dampening)*g;
//                  g = nesterov ? g + momentum*buf : buf
//   p -= lr * g
// State: "momentum_buffer" when momentum != 0.
class SGD : public Optimizer {
 public:
  SGD(std::vector<Tensor> params, const SgdOptions& options);
  // Groups' unset fields take `defaults`.
  SGD(std::vector<ParamGroup> groups, const SgdOptions& defaults);

 protected:
  void validate_hyper_parameters(const ParamGroup& group) const override;
  std::vector<std::string> buffer_names(const ParamGroup& group) const override;
  bool keeps_param_step() const override { return false; }
  void update(const ParamGroup& group, Tensor& param, const Tensor& grad, ParamState& state) override;
  bool fused_group_step(size_t g) override;
};

}  // namespace minidl::optim
