// Exponential moving average of the weights: evaluating the averaged weights often gives better
// accuracy than the last iterate, notably at large batch sizes. The averages advance once per
// optimizer step (once per effective batch under gradient accumulation), never per micro-batch.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace minidl::optim {

class Ema {
 public:
  // Keeps a shadow copy of every parameter (same device, no grad), initialised to the parameters'
  // current values. decay in [0, 1): 0.999 averages over ~1000 steps. Shadows of f16 parameters
  // are kept in f32: in f16, (1 - decay) * param is mostly below half an ulp of the shadow and the
  // average would stop moving.
  Ema(const std::vector<Tensor>& params, double decay);

  // shadow = decay * shadow + (1 - decay) * param for every parameter given at construction.
  // Call it once right after each optimizer step (not after each micro-batch backward).
  void update();
  // Writes the shadows into `params` (same count and shapes as at construction), e.g. to
  // evaluate or save the averaged model. Clone the parameters first to get the raw ones back.
  void copy_to(const std::vector<Tensor>& params) const;

  // "shadow.<i>" for parameter i, "num_updates" (i64 scalar) and "decay" (f64 scalar); the tensors
  // are copies, so saving them is safe while training goes on.
  std::map<std::string, Tensor> state_dict() const;
  // Restores the shadows and update count; the state's decay must match this Ema's.
  void load_state_dict(const std::map<std::string, Tensor>& state);

  int64_t num_updates() const { return num_updates_; }
  double decay() const { return decay_; }
  const std::vector<Tensor>& shadows() const { return shadows_; }

 private:
  std::vector<Tensor> params_;
  std::vector<Tensor> shadows_;
  double decay_;
  int64_t num_updates_ = 0;
};

}  // namespace minidl::optim
