// Window planning and the once-per-window bookkeeping of gradient accumulation.
#include "optim/accumulation.h"

#include "core/autograd.h"
#include "core/ops.h"
#include "optim/clip.h"

namespace minidl::optim {

std::vector<MicroBatch> plan_accumulation(const std::vector<int64_t>& sizes, int64_t k) {
  MINIDL_CHECK(k >= 1, "gradient accumulation: accumulation_steps must be >= 1, got ", k,
               " (1 means no accumulation)");
  std::vector<MicroBatch> plan(sizes.size());
  for (size_t start = 0; start < sizes.size(); start += static_cast<size_t>(k)) {
    const size_t end = std::min(sizes.size(), start + static_cast<size_t>(k));
    int64_t window = 0;
    for (size_t i = start; i < end; ++i) {
      MINIDL_CHECK(sizes[i] >= 1, "gradient accumulation: micro-batch ", i, " has ", sizes[i],
                   " samples; every micro-batch needs at least one");
      window += sizes[i];
    }
    for (size_t i = start; i < end; ++i) {
      plan[i] = {static_cast<double>(sizes[i]) / static_cast<double>(window), i + 1 == end, sizes[i]};
    }
  }
  return plan;
}

AccumulatingTrainer::AccumulatingTrainer(Optimizer& optimizer, AccumulationOptions options)
    : opt_(optimizer), o_(std::move(options)) {
  MINIDL_CHECK(o_.max_grad_norm >= 0.0, "gradient accumulation: max_grad_norm must be >= 0 (0 disables clipping), got ",
               o_.max_grad_norm);
  for (size_t g = 0; g < opt_.num_groups(); ++g) base_lrs_.push_back(opt_.lr(g));
  if (o_.schedule) {
    apply_schedule(*o_.schedule, 0, base_lrs_, [this](size_t g, double lr) { opt_.set_lr(g, lr); });
  }
  opt_.zero_grad();
}

bool AccumulatingTrainer::micro_batch(const Tensor& loss, const MicroBatch& mb) {
  MINIDL_CHECK(loss.defined() && loss.numel() == 1, "gradient accumulation: the loss must be a scalar (the mean over ",
               "the micro-batch), got ", loss.defined() ? loss.meta() : std::string("an undefined tensor"));
  MINIDL_CHECK(mb.loss_weight > 0.0 && mb.loss_weight <= 1.0, "gradient accumulation: loss weight ", mb.loss_weight,
               " is outside (0, 1]; take MicroBatch values from plan_accumulation()");
  GradScaler* scaler = o_.scaler;
  // The scaler's device state (CUDA graphs): every decision is the device's, nothing is read here.
  const bool on_device = scaler != nullptr && scaler->device_state();
  if (scaler != nullptr && !on_device) {
    if (!window_open_) window_scale_ = scaler->get_scale();
    MINIDL_CHECK(scaler->get_scale() == window_scale_, "gradient accumulation: the loss scale changed inside an ",
                 "accumulation window (", window_scale_, " -> ", scaler->get_scale(), "); call GradScaler::update() ",
                 "only once per effective batch (AccumulatingTrainer does it at the end of the window)");
  }
  window_open_ = true;
  Tensor weighted = mb.loss_weight == 1.0 ? loss : loss * mb.loss_weight;
  if (scaler != nullptr) weighted = scaler->scale(weighted);
  GradientSync* sync = o_.sync;
  if (sync != nullptr) sync->before_backward(mb.steps);
  weighted.backward();
  if (sync != nullptr) sync->after_backward(mb.steps);
  if (o_.after_backward) o_.after_backward();
  if (!mb.steps) return false;

  window_open_ = false;
  if (on_device) {
    MINIDL_CHECK(sync == nullptr && !o_.before_step, "gradient accumulation: the gradient scaler's device state ",
                 "(CUDA graphs) decides on the device; data-parallel training and a before-step hook read values on ",
                 "the host (run without --cuda-graphs)");
    if (o_.max_grad_norm > 0.0) {
      scaler->unscale_(opt_);   // clipping sees unscaled gradients; a window with inf is skipped below
      clip();
    }
    scaler->step(opt_);   // unscales (unless done), and the fused kernels skip on the device's found-inf flag
    scaler->update();
  } else {
    if (scaler != nullptr) {
      scaler->unscale_(opt_);  // once per window, before clipping
      if (sync != nullptr && scaler->is_enabled()) scaler->set_found_inf(opt_, sync->any(scaler->found_inf(opt_)));
      if (scaler->found_inf(opt_)) {
        scaler->update();  // backoff; the whole effective batch is skipped
        ++skipped_steps_;
        opt_.zero_grad();
        return false;
      }
    }
    bool proceed = o_.before_step ? o_.before_step() : true;
    if (sync != nullptr && o_.before_step) proceed = !sync->any(!proceed);  // no hook: every rank proceeds
    if (!proceed) {
      if (scaler != nullptr) scaler->update();
      ++skipped_steps_;
      opt_.zero_grad();
      return false;
    }
    if (o_.max_grad_norm > 0.0) clip();
    if (scaler != nullptr) {
      scaler->step(opt_);  // already unscaled and clean: steps
      scaler->update();
    } else {
      opt_.step();
    }
  }
  ++optimizer_steps_;
  if (o_.schedule) {
    apply_schedule(*o_.schedule, optimizer_steps_, base_lrs_, [this](size_t g, double lr) { opt_.set_lr(g, lr); });
  }
  if (o_.ema != nullptr) o_.ema->update();
  opt_.zero_grad();
  return true;
}

void AccumulatingTrainer::clip() {
  std::vector<Tensor> params;
  for (const ParamGroup& g : opt_.param_groups()) params.insert(params.end(), g.params.begin(), g.params.end());
  GradientSync* sync = o_.sync;
  if (opt_.device_state() || (o_.scaler != nullptr && o_.scaler->device_state())) {
    MINIDL_CHECK(sync == nullptr, "gradient accumulation: clipping in the device state (CUDA graphs) keeps the norm ",
                 "on the device, but data-parallel training agrees on it on the host (run without --cuda-graphs)");
    const Tensor norm = clip_grad_norm_device(params, o_.max_grad_norm);
    if (!norm.defined()) {   // no gradient: nothing clipped
      last_grad_norm_ = 0.0;
      last_grad_norm_device_ = Tensor();
    } else if (last_grad_norm_device_.defined()) {
      // One tensor from window to window: a replay writes the one its capture made, and an eager
      // window between replays leaves nothing new in the graphs' pool (train/graphed_step.h).
      NoGradGuard no_grad;
      last_grad_norm_device_.copy_(norm);
    } else {
      last_grad_norm_device_ = norm;
    }
    return;
  }
  std::function<double(double)> reduce;
  if (sync != nullptr) reduce = [sync](double norm) { return sync->same(norm); };
  last_grad_norm_ = clip_grad_norm(params, o_.max_grad_norm, 2.0, false, reduce);
  last_grad_norm_device_ = Tensor();
}

double AccumulatingTrainer::last_grad_norm() const {
  if (!last_grad_norm_device_.defined()) return last_grad_norm_;
  return last_grad_norm_device_.item();
}

void AccumulatingTrainer::settle_device_micro_batch() {
  MINIDL_CHECK(o_.scaler == nullptr || o_.scaler->device_state(), "gradient accumulation: a micro-batch settled ",
               "from the device needs the gradient scaler's device state (GradScaler::to_device_state)");
  window_open_ = true;
}

void AccumulatingTrainer::restore(const Counts& before, bool window_open) {
  window_open_ = window_open;
  // A norm the abandoned capture's clipping made was never written: the eager window makes its own.
  last_grad_norm_device_ = Tensor();
  optimizer_steps_ = before.windows;
  skipped_steps_ = before.skipped;
  opt_.set_step_count(before.optimizer_steps);
}

void AccumulatingTrainer::settle_device_step(const Counts& before, bool skipped) {
  MINIDL_CHECK(!skipped || (o_.scaler != nullptr && o_.scaler->device_state()), "gradient accumulation: a step ",
               "skipped on the device needs the gradient scaler's device state (GradScaler::to_device_state)");
  const int64_t taken = skipped ? 0 : 1;
  restore({.optimizer_steps = before.optimizer_steps + taken, .windows = before.windows + taken,
           .skipped = before.skipped + 1 - taken},
          false);   // the replayed micro-batch closed its window
}

}  // namespace minidl::optim
