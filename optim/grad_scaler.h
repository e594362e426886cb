// Dynamic loss scaling for mixed precision, with PyTorch's torch.amp.GradScaler semantics: the
// loss is multiplied by a scale so small f16 gradients do not flush to zero; before the optimizer
// step the gradients are unscaled in one fused pass that also looks for inf/NaN; a step with a
// non-finite gradient is skipped and the scale shrinks, and a long run of clean steps grows it.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>

#include "core/tensor.h"
#include "optim/optimizer.h"

namespace minidl::optim {

struct GradScalerOptions {
  double init_scale = 65536.0;   // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // consecutive clean steps before the scale grows
  // Off: scale() returns the loss as it is, unscale_() does nothing, step() always steps and
  // update() does nothing; one flag turns AMP's loss scaling on or off for the whole step.
  bool enabled = true;
};

// Per step, in this order (as PyTorch): backward(scaler.scale(loss)); optionally unscale_(opt)
// then clip; step(opt); update(). With gradient accumulation, scale() every micro-batch's loss
// with the same scale (update() runs only once per effective batch, so it cannot change inside a
// window) and call unscale_/step/update once at the end of the window: AccumulatingTrainer does
// this when given a scaler.
class GradScaler {
 public:
  explicit GradScaler(GradScalerOptions options = {});

  bool is_enabled() const { return o_.enabled; }
  // The loss times the current scale, in f32 (an f16 loss is widened first, as the scale may not
  // fit in f16); differentiable. Disabled: the loss itself.
  Tensor scale(const Tensor& loss) const;
  // Multiplies every gradient of the optimizer's parameters by 1/scale in one pass and records
  // whether any was inf or NaN. At most once per optimizer between update()s: a second call, or a
  // call after step(), throws.
  void unscale_(Optimizer& optimizer);
  // Unscales (unless unscale_ ran already) and steps the optimizer unless a gradient was
  // non-finite. Returns whether it stepped. At most once per optimizer between update()s.
  bool step(Optimizer& optimizer);
  // Adjusts the scale after a step: backoff on any non-finite gradient (and the clean-step count
  // restarts), growth after growth_interval consecutive clean steps. Throws when no optimizer was
  // unscaled since the last update (nothing to base the decision on).
  void update();
  // Sets the scale directly (PyTorch's update(new_scale)); also resets the per-step state.
  void update(double new_scale);

  double get_scale() const;               // 1.0 when disabled, as PyTorch
  int64_t growth_tracker() const;

  // The device state, for CUDA graphs (docs/cuda/graphs.md): the scale, the growth tracker and each
  // step's found-inf flag live on `device` (a CUDA device), and every decision is made there:
  // scale() multiplies by the device scale, unscale_ computes 1/scale on the device, step() hands
  // the flag to the optimizer's fused kernels (which skip on it), update() runs PyTorch's rule in
  // a kernel. No call between scale() and update() synchronizes, so a whole step can be captured;
  // the results are bit-identical to the host state's. step() then returns true whether or not
  // the device skipped; found_inf(), get_scale(), growth_tracker() and state_dict() read the
  // device (a sync, outside any capture). The optimizer must take the fused path; Adam's step
  // counts must be in the optimizer's device state (Optimizer::to_device_state), so that a skipped
  // step does not count. to_host_state() brings the state back.
  void to_device_state(Device device);
  void to_host_state();
  // Forgets this step's unscale_/step() without an update(): a captured step abandoned part-way
  // (out of memory during its capture) ran their host code but none of their device work.
  void abandon_step() { per_opt_.clear(); }
  bool device_state() const { return dev_scale_.defined(); }
  // The device state's found-inf flag of the last unscale_ (one-element f32), undefined otherwise.
  const Tensor& device_found_inf() const { return dev_found_; }
  // Whether the optimizer's gradients were found non-finite by this step's unscale_ (false when
  // not unscaled yet).
  bool found_inf(const Optimizer& optimizer) const;
  // Replaces this step's found-inf flag after unscale_ (data-parallel training ORs it across the
  // ranks, so every rank skips or steps together). Throws unless unscale_ ran since the last
  // update(); does nothing when disabled.
  void set_found_inf(const Optimizer& optimizer, bool found);
  const GradScalerOptions& options() const { return o_; }

  // PyTorch's keys: "scale", "growth_factor", "backoff_factor", "growth_interval",
  // "_growth_tracker" (0-dim f64 / i64 tensors). Empty when disabled.
  std::map<std::string, Tensor> state_dict() const;
  // Throws when enabled and the dict is empty (it was saved with the scaler off), or on a missing
  // key or invalid value; changes nothing on error.
  void load_state_dict(const std::map<std::string, Tensor>& dict);

 private:
  // The device state on a device with values: the meta device's (a dry run) has none, and its
  // reads give the host state's.
  bool valued() const { return device_state() && !dev_scale_.device().is_meta(); }
  enum class Stage { Ready, Unscaled, Stepped };
  struct PerOptimizer {
    Stage stage = Stage::Ready;
    bool found_inf = false;
    bool checked = false;  // some gradient was unscaled (PyTorch: found_inf_per_device not empty)
  };
  GradScalerOptions o_;
  float scale_;                  // f32, as PyTorch's _scale tensor
  int64_t growth_tracker_ = 0;
  std::unordered_map<const Optimizer*, PerOptimizer> per_opt_;
  Tensor dev_scale_, dev_tracker_, dev_found_;   // the device state (0-dim f32, [1] i32, [1] f32)
};

// The optimizer's state_dict() and the scaler's in one map (scaler keys prefixed "scaler."), so a
// checkpoint restores both together; load_training_state splits it and loads each, all or nothing
// for the scaler part.
std::map<std::string, Tensor> training_state_dict(const Optimizer& optimizer, const GradScaler& scaler);
void load_training_state(Optimizer& optimizer, GradScaler& scaler, const std::map<std::string, Tensor>& dict);

}  // namespace minidl::optim
