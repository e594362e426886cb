// The accumulation-aware training step: k micro-batches make one effective batch. Each micro-batch
// loss is weighted so the window's gradient equals that of one batch of all its samples, and the
// optimizer step, clipping, the LR schedule and the EMA advance once per window, never per
// micro-batch. The experiments' maximum-batch results rest on this equivalence.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "optim/ema.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "optim/schedule.h"

namespace minidl::optim {

// One micro-batch's place in its window.
struct MicroBatch {
  double loss_weight = 1.0;  // multiplies the micro-batch's mean loss before backward
  bool steps = false;        // the optimizer steps after this micro-batch (it closes its window)
  int64_t samples = 0;
};

// Splits an epoch's micro-batches (their sample counts, in order) into windows of k. A micro-batch
// of n samples in a window of N samples gets weight n / N, so the window's summed gradient is the
// gradient of the mean loss over its N samples: 1/k for equal micro-batches, the sample share for
// an uneven last micro-batch. A trailing partial window (fewer than k micro-batches at the end of
// the epoch) still makes one optimizer step, weighted over its own samples: every sample is used,
// and the choice does not depend on the device. Throws for k < 1 or a size < 1.
std::vector<MicroBatch> plan_accumulation(const std::vector<int64_t>& micro_batch_sizes, int64_t k);

// What data-parallel training (distributed::DataParallel) needs from the loop, so that optim/ knows
// nothing of ranks: the backward of a micro-batch that does not step runs without synchronisation,
// the one that steps waits for the averaged gradients before unscaling, and every decision the
// step makes (skip on inf, before_step's refusal, the clip norm) is the same on every rank.
class GradientSync {
 public:
  virtual ~GradientSync() = default;
  virtual void before_backward(bool will_step) = 0;
  virtual void after_backward(bool will_step) = 0;
  virtual bool any(bool flag) = 0;          // true on every rank when true on one
  virtual double same(double value) = 0;    // one value for every rank (the clip norm: the largest)
};

struct AccumulationOptions {
  double max_grad_norm = 0.0;                    // > 0: clip_grad_norm before each step (its device
                                                 // form in the device state: captured steps clip)
  std::shared_ptr<const LrSchedule> schedule = {};  // optional: lr = base_lr[g] * factor(optimizer step)
  Ema* ema = nullptr;                            // optional: updated after each optimizer step
  // Optional, run before clipping; returning false skips the optimizer step (the gradient scaler
  // of the mixed-precision work unscales here and reports non-finite gradients).
  std::function<bool()> before_step = {};
  // Optional mixed-precision loss scaling. Every micro-batch's weighted loss is multiplied by the
  // same scale (the scale cannot change inside a window: update() runs once, at its end); at the
  // end of the window the gradients are unscaled once, a non-finite value in any micro-batch skips
  // the whole effective batch (inf and NaN survive accumulation) and backs the scale off, and
  // clipping sees unscaled gradients.
  GradScaler* scaler = nullptr;
  // Optional data-parallel synchronisation (see GradientSync).
  GradientSync* sync = nullptr;
  // Optional, run after each micro-batch's backward, before anything else of its window's end (the
  // maximum-batch trials read the backward's memory peak there, before the update's).
  std::function<void()> after_backward = {};
};

class AccumulatingTrainer {
 public:
  // Zeroes the gradients and, with a schedule, sets the step-0 learning rates from the groups'
  // current ones (taken as the base learning rates).
  AccumulatingTrainer(Optimizer& optimizer, AccumulationOptions options = {});

  // Backpropagates loss * mb.loss_weight (loss: the micro-batch's mean, a scalar); when mb.steps,
  // finishes the window: before_step, clipping, optimizer step, schedule, EMA, zero_grad.
  // Returns true when the optimizer stepped.
  bool micro_batch(const Tensor& loss, const MicroBatch& mb);

  int64_t optimizer_steps() const { return optimizer_steps_; }    // windows closed with a step
  // CUDA graphs: a step whose outcome only the device knows. A replay runs a captured micro-batch
  // on the device only (nothing counted), its capture ran the host code without the device work
  // (counted), and with the scaler's device state a window the device skipped was counted as a
  // step. settle_device_step, after the micro-batch that closes a window, sets this trainer's and
  // the optimizer's counts to `before` (taken with counts() before the step) plus that step: a
  // step taken, or one skipped (`skipped`: the device's found-inf flag, read by the caller after
  // the step). The schedule is not applied: the caller writes the learning rates to the device.
  // settle_device_micro_batch, after a replayed micro-batch that does not step, opens the window
  // as its host code would have.
  struct Counts {
    int64_t optimizer_steps = 0;   // Optimizer::step_count
    int64_t windows = 0;           // optimizer_steps()
    int64_t skipped = 0;           // skipped_steps()
  };
  Counts counts() const { return {opt_.step_count(), optimizer_steps_, skipped_steps_}; }
  void settle_device_step(const Counts& before, bool skipped);
  void settle_device_micro_batch();
  // A capture abandoned part-way (out of memory) ran some of a micro-batch's
  // host code and none of its device work: restore() puts the counts and the window back as they
  // were before it (`window_open`: window_open() then), so that the micro-batch can run eagerly.
  void restore(const Counts& before, bool window_open);
  bool window_open() const { return window_open_; }   // a micro-batch that did not step ran since the last step
  int64_t skipped_steps() const { return skipped_steps_; }        // windows before_step refused
  // 0 when not clipping. With the device state (the optimizer's or the scaler's) the norm stays on
  // the device and this reads it (a sync); a window the device skipped then shows its non-finite norm.
  double last_grad_norm() const;
  const std::vector<double>& base_lrs() const { return base_lrs_; }

 private:
  Optimizer& opt_;
  AccumulationOptions o_;
  std::vector<double> base_lrs_;
  int64_t optimizer_steps_ = 0;
  int64_t skipped_steps_ = 0;
  double last_grad_norm_ = 0.0;
  Tensor last_grad_norm_device_;   // the device state's last norm (0-dim f64), or undefined
  // clip_grad_norm before the step: on the device in the device state (no host read), otherwise on
  // the host (one read; the same norm on every rank with `sync`).
  void clip();
  bool window_open_ = false;
  double window_scale_ = 0.0;   // the scaler's scale when the open window started
};

}  // namespace minidl::optim
