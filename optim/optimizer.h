// The optimizer base: parameter groups, zero_grad, step and a flat state_dict of tensors. It owns
// everything optimizers share so SGD/Adam/AdamW only write their update formula, and so schedules,
// clipping and checkpointing talk to one interface whatever the optimizer.
#pragma once
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <vector>

#include "core/tensor.h"

namespace minidl::optim {

// NaN marks "not set: take the optimizer's default" in a ParamGroup (a real lr is never NaN).
inline constexpr double kUnset = std::numeric_limits<double>::quiet_NaN();

// A set of parameters sharing hyper-parameters, as PyTorch's param_groups entries.
// `options` holds the optimizer-specific ones by PyTorch's names (SGD: momentum, dampening,
// nesterov, maximize; Adam/AdamW: beta1, beta2, eps, amsgrad, maximize; booleans as 0/1); any that
// is missing, and lr/weight_decay left at kUnset, are filled from the optimizer's defaults when the
// group is added. Unknown option names are an error, so a typo cannot be silently ignored.
struct ParamGroup {
  std::vector<Tensor> params;
  double lr = kUnset;
  double weight_decay = kUnset;
  std::map<std::string, double> options = {};

  double option(const std::string& name) const;  // throws naming the option when absent
};

// Per-parameter state: named buffers (same shape, dtype and device as the parameter) and, for
// optimizers that keep one (Adam, AdamW), the number of steps this parameter has taken. Empty
// (no buffers, step 0) until the parameter first receives a gradient in step(), as in PyTorch.
struct ParamState {
  std::map<std::string, Tensor> buffers;
  int64_t step = 0;
  bool empty() const { return buffers.empty() && step == 0; }
};

// state_dict() keys (all tensors; hyper-parameters 0-dim f64, counts 0-dim i64):
//   "state.step"                  i64: number of step() calls on this optimizer
//   "group.<g>.num_params"        i64: parameters in group g (checked on load)
//   "group.<g>.lr", "group.<g>.weight_decay", "group.<g>.<option>"   f64, for every option
//   "state.<g>.<i>.<buffer>"      the buffer of parameter i of group g, e.g. momentum_buffer (SGD);
//                                 exp_avg, exp_avg_sq, max_exp_avg_sq (Adam/AdamW, the last with
//                                 amsgrad): same shape/dtype/device as the parameter
//   "state.<g>.<i>.step"          i64: that parameter's step count (Adam/AdamW)
// Parameters without state (never had a gradient; SGD without momentum) have no "state.<g>.<i>.*"
// keys. Tensors are copies: later steps do not change a dict already taken.
class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  const std::string& name() const { return name_; }
  void add_param_group(ParamGroup group);
  const std::vector<ParamGroup>& param_groups() const { return groups_; }
  size_t num_groups() const { return groups_.size(); }

  // Sets every parameter's grad to undefined (PyTorch's set_to_none=True): the next backward
  // writes fresh gradients instead of adding to stale ones, and step() skips untouched params.
  // With set_grads_to_none(false) it writes zeros into the gradients that exist instead, keeping
  // their memory (set_to_none=False): a CUDA graph of an accumulation window's micro-batches adds
  // into the gradients at the addresses it captured. The values are the same, except that a
  // gradient of exactly -0.0 becomes 0.0 + -0.0 = +0.0.
  void zero_grad();
  void set_grads_to_none(bool to_none) { grads_to_none_ = to_none; }
  bool grads_to_none() const { return grads_to_none_; }
  // One update of every parameter that has a gradient, under NoGradGuard.
  virtual void step();
  int64_t step_count() const { return step_count_; }
  // CUDA graphs: a replay runs a captured step() on the device without calling it on the host, and
  // a step the gradient scaler's device state skipped was counted by step(); the graphed loop
  // settles the count afterwards (AccumulatingTrainer::settle_device_step), so schedules, progress
  // and saved state count the steps the weights really took, as in the eager loop.
  void set_step_count(int64_t n);
  // GradScaler's device state (CUDA graphs): while set, step() passes this one-element f32 device
  // flag to the fused kernels, which change nothing when it is nonzero (the skipped step decided
  // on the device, without a host sync). A group that cannot take the fused path then throws.
  // An undefined tensor clears it.
  void set_skip_flag(const Tensor& flag) { skip_flag_ = flag; }

  // The device state, for CUDA graphs (docs/cuda/graphs.md): the groups' learning rates live in an
  // f64 tensor on `device` (a CUDA device, or the meta device standing for one) that the fused
  // kernels read when they run, and an optimizer that keeps per-parameter step counts (Adam, AdamW)
  // keeps them there too: its kernel advances a count unless the gradient scaler's flag skips the
  // step, and computes the bias corrections from it. So a captured step() replays with no host
  // value in it, and a schedule never needs a new capture. Every group must then take the fused
  // path (step() throws otherwise). state() and state_dict() read the counts back (a sync: never
  // inside a capture), load_state_dict() writes them and the rates; to_host_state() brings the
  // counts back and ends the device state.
  void to_device_state(Device device);
  void to_host_state();
  bool device_state() const { return dev_lrs_.defined(); }
  // Writes the groups' learning rates to the device state when one changed since the last write
  // (a small host-to-device copy); does nothing without the device state or while the device is
  // capturing (the graph reads the rate when it replays). step() calls it first; whoever replays
  // a graph that holds step() calls it before each replay, so the replay uses the current rates.
  void upload_lrs();

  double lr(size_t group) const;
  void set_lr(size_t group, double lr);

  // The state of parameter i of group g (empty before its first update).
  const ParamState& state(size_t group, size_t index) const;

  std::map<std::string, Tensor> state_dict() const;
  // Restores hyper-parameters, step counts and buffers saved by state_dict() of an optimizer of the
  // same kind over parameters of the same shapes and dtypes. All or nothing: on any error
  // (missing/unknown key, wrong shape/dtype, invalid hyper-parameter) nothing is changed.
  void load_state_dict(const std::map<std::string, Tensor>& dict);

 protected:
  // defaults: "lr", "weight_decay" and every option with its default value.
  Optimizer(std::string name, std::map<std::string, double> defaults);

  // One group holding `params` with every hyper-parameter at the optimizer's default (none when
  // params is empty, so the base class reports the empty list).
  static std::vector<ParamGroup> single_group(std::vector<Tensor> params);
  // Adds the groups after the subclass is fully constructed (virtual checks need it).
  void init_groups(std::vector<ParamGroup> groups);

  // Throws (naming the optimizer and the fix) for hyper-parameters this optimizer rejects.
  virtual void validate_hyper_parameters(const ParamGroup& group) const;
  // Buffer names a non-empty state of a parameter of `group` holds.
  virtual std::vector<std::string> buffer_names(const ParamGroup& group) const = 0;
  // Whether ParamState::step is kept (and saved) per parameter.
  virtual bool keeps_param_step() const = 0;
  // The update of one parameter with its (defined) gradient; runs under NoGradGuard.
  virtual void update(const ParamGroup& group, Tensor& param, const Tensor& grad, ParamState& state) = 0;
  // The update of every parameter of group g that has a gradient in one fused backend call
  // (Backend::fused_*_step), tried first by step(); returns false, changing nothing, when the
  // group cannot take the fused path (not all on one CUDA device, or the backend declines), and
  // step() then calls update() per parameter. The default never fuses.
  virtual bool fused_group_step(size_t /*g*/) { return false; }
  // For fused_group_step: whether every parameter of group g, and every gradient it has, is on
  // one device (any kind: group_on_one_device; a CUDA device or the meta device standing for one:
  // group_on_one_cuda_device); `with_grad` gets the indices of the parameters that have a gradient.
  bool group_on_one_device(size_t g, std::vector<size_t>& with_grad) const;
  bool group_on_one_cuda_device(size_t g, std::vector<size_t>& with_grad) const;
  // The device flag of set_skip_flag for the fused kernels (nullptr when none).
  const float* skip_flag() const;
  // The device state's learning rate of group g and step count of parameter i of group g, for the
  // fused kernels (nullptr without the device state, or for optimizers without step counts).
  const double* lr_device(size_t g) const;
  int64_t* step_device(size_t g, size_t i) const;

  std::vector<ParamGroup> groups_;
  // [group][index]. Mutable: with the device state its step counts live on the device, and the
  // const readers (state(), state_dict()) copy them back here first.
  mutable std::vector<std::vector<ParamState>> state_;

 private:
  void check_group(const ParamGroup& group, size_t group_index) const;
  void pull_steps() const;   // the device's step counts into state_ (device state only)
  void push_steps();         // state_'s step counts to the device

  std::string name_;
  std::map<std::string, double> defaults_;
  int64_t step_count_ = 0;
  bool grads_to_none_ = true;
  Tensor skip_flag_;
  Tensor dev_lrs_;                    // [groups] f64: the device state's learning rates
  Tensor dev_steps_;                  // [parameters of every group, group by group] i64, or undefined
  std::vector<size_t> step_offsets_;  // the index in dev_steps_ of each group's first parameter
  std::vector<double> uploaded_lrs_;  // the rates dev_lrs_ holds (empty: none written yet)
};

}  // namespace minidl::optim
