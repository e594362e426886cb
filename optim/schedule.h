// Learning-rate schedules as pure functions of the optimizer step, plus the batch-size scaling
// rules: the experiments sweep batch sizes and need lr(step) that matches PyTorch's schedulers
// without tying the schedule to an optimizer type (it returns numbers; the caller sets them).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace minidl::optim {

// A multiplier of the base learning rate. `step` counts optimizer steps from 0 (one per effective
// batch, never per micro-batch: with gradient accumulation the schedule advances once per k
// micro-batches). factor() is a closed form, so resuming at any step needs no replay.
class LrSchedule {
 public:
  virtual ~LrSchedule() = default;
  virtual double factor(int64_t step) const = 0;
  // The flag spec that parse_schedule() turns back into this schedule (cosine's length is not
  // part of the spec: it comes from the run length passed to the parser).
  virtual std::string spec() const = 0;
  double lr(double base_lr, int64_t step) const { return base_lr * factor(step); }
};

// factor = 1.
class ConstantSchedule final : public LrSchedule {
 public:
  double factor(int64_t step) const override;
  std::string spec() const override { return "constant"; }
};

// PyTorch's StepLR: gamma ^ floor(step / step_size).
class StepSchedule final : public LrSchedule {
 public:
  StepSchedule(int64_t step_size, double gamma);
  double factor(int64_t step) const override;
  std::string spec() const override;

 private:
  int64_t step_size_;
  double gamma_;
};

// PyTorch's MultiStepLR: gamma ^ (number of milestones <= step). Milestones strictly increasing, >= 1.
class MultiStepSchedule final : public LrSchedule {
 public:
  MultiStepSchedule(std::vector<int64_t> milestones, double gamma);
  double factor(int64_t step) const override;
  std::string spec() const override;

 private:
  std::vector<int64_t> milestones_;
  double gamma_;
};

// PyTorch's CosineAnnealingLR closed form with T_max = total_steps and eta_min = eta_min_ratio *
// base_lr: r + (1 - r) * (1 + cos(pi * step / total_steps)) / 2. Past total_steps the factor stays
// at eta_min_ratio (PyTorch's formula would climb back up: a run that overshoots its planned
// length should not see its learning rate rise again).
class CosineSchedule final : public LrSchedule {
 public:
  explicit CosineSchedule(int64_t total_steps, double eta_min_ratio = 0.0);
  double factor(int64_t step) const override;
  std::string spec() const override;
  int64_t total_steps() const { return total_steps_; }

 private:
  int64_t total_steps_;
  double eta_min_ratio_;
};

// Linear warmup then `inner`, as PyTorch's SequentialLR([LinearLR(start_factor, total_iters=W),
// inner], milestones=[W]): for step < W the factor is start_factor + (1 - start_factor) * step / W;
// from step W on it is inner.factor(step - W), i.e. the inner schedule is SHIFTED by the warmup
// length and starts from its own step 0 (so a cosine after warmup should span total - W steps).
// start_factor in (0, 1] as PyTorch's LinearLR; warmup_steps 0 means no warmup.
class LinearWarmupSchedule final : public LrSchedule {
 public:
  static constexpr double kDefaultStartFactor = 1.0 / 3.0;  // PyTorch LinearLR's default
  LinearWarmupSchedule(int64_t warmup_steps, double start_factor, std::unique_ptr<LrSchedule> inner);
  double factor(int64_t step) const override;
  std::string spec() const override;
  const LrSchedule& inner() const { return *inner_; }

 private:
  int64_t warmup_steps_;
  double start_factor_;
  std::unique_ptr<LrSchedule> inner_;
};

// Parses a --lr-schedule flag. Grammar: [warmup:W[:START_FACTOR]+]SCHEDULE with SCHEDULE one of
//   constant | step:STEP_SIZE:GAMMA | multistep:M1,M2,...:GAMMA | cosine[:ETA_MIN_RATIO]
// e.g. "warmup:500:0.1+cosine", "multistep:30,60,90:0.1". `total_steps` is the run's number of
// optimizer steps; a cosine spans total_steps (total_steps - W after a warmup). Throws
// minidl::Error naming the spec, the bad part and the expected form.
std::unique_ptr<LrSchedule> parse_schedule(const std::string& spec, int64_t total_steps);

// Sets lr = base_lrs[g] * factor(step) for every group through `set_lr` (e.g. a lambda calling
// Optimizer::set_lr): keeps the schedule independent of the optimizer classes.
void apply_schedule(const LrSchedule& schedule, int64_t step, const std::vector<double>& base_lrs,
                    const std::function<void(size_t group, double lr)>& set_lr);

// The batch-size scaling rules: Linear (Goyal et al. 2017) lr = base_lr * eff / base, Sqrt
// (Krizhevsky 2014, Hoffer et al. 2017) lr = base_lr * sqrt(eff / base). effective_batch is the
// optimizer's batch (micro-batch * accumulation steps), base_batch the one base_lr was tuned for.
enum class LrScaling { None, Linear, Sqrt };
double scaled_lr(double base_lr, int64_t effective_batch, int64_t base_batch, LrScaling scaling);
LrScaling parse_lr_scaling(const std::string& name);  // "none" | "linear" | "sqrt"
std::string to_string(LrScaling scaling);

}  // namespace minidl::optim
