// Closed forms of the schedules and the flag parser. Closed forms (not PyTorch's recursive
// multiply-per-step updates) so that resuming at any step gives the same lr without a replay.
#include "optim/schedule.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <numbers>
#include <system_error>
#include <type_traits>

#include "core/error.h"

namespace minidl::optim {

namespace {

// Shortest text that parses back to the same double, so spec() round-trips exactly.
std::string fmt(double v) {
  char buf[64];
  const auto res = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, res.ptr);
}

void check_step(int64_t step, const char* schedule) {
  MINIDL_CHECK(step >= 0, schedule, ": step ", step,
               " is negative; optimizer steps count from 0 (pass the number of optimizer steps taken so far)");
}

void check_gamma(double gamma, const char* schedule) {
  MINIDL_CHECK(std::isfinite(gamma) && gamma > 0.0, schedule, ": gamma ", gamma,
               " must be a finite number > 0 (e.g. 0.1 divides the lr by 10 at each decay)");
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> parts;
  size_t start = 0;
  while (true) {
    const size_t pos = s.find(sep, start);
    parts.push_back(s.substr(start, pos == std::string::npos ? std::string::npos : pos - start));
    if (pos == std::string::npos) break;
    start = pos + 1;
  }
  return parts;
}

// A whole integer or floating-point field of the spec; `what` names it in the error.
template <class T>
T parse_number(const std::string& text, const std::string& spec, const char* what) {
  T v{};
  const char* end = text.data() + text.size();
  const auto res = std::from_chars(text.data(), end, v);
  MINIDL_CHECK(!text.empty() && res.ec == std::errc() && res.ptr == end, "parse_schedule: in '", spec, "', ",
               what, " '", text, "' is not ", std::is_integral_v<T> ? "an integer" : "a number");
  return v;
}

constexpr const char* kGrammar =
    "expected [warmup:W[:START_FACTOR]+]SCHEDULE with SCHEDULE one of constant | step:STEP_SIZE:GAMMA | "
    "multistep:M1,M2,...:GAMMA | cosine[:ETA_MIN_RATIO], e.g. 'warmup:500:0.1+cosine' or "
    "'multistep:30,60,90:0.1'";

// One schedule without warmup; `steps` is the number of steps it spans (for cosine).
std::unique_ptr<LrSchedule> parse_base(const std::string& part, const std::string& spec, int64_t steps) {
  const std::vector<std::string> f = split(part, ':');
  const std::string& name = f[0];
  if (name == "constant") {
    MINIDL_CHECK(f.size() == 1, "parse_schedule: in '", spec, "', 'constant' takes no arguments; ", kGrammar);
    return std::make_unique<ConstantSchedule>();
  }
  if (name == "step") {
    MINIDL_CHECK(f.size() == 3, "parse_schedule: in '", spec, "', 'step' needs step:STEP_SIZE:GAMMA (e.g. step:30:0.1)");
    return std::make_unique<StepSchedule>(parse_number<int64_t>(f[1], spec, "the step size"),
                                          parse_number<double>(f[2], spec, "gamma"));
  }
  if (name == "multistep") {
    MINIDL_CHECK(f.size() == 3, "parse_schedule: in '", spec,
                 "', 'multistep' needs multistep:M1,M2,...:GAMMA (e.g. multistep:30,60,90:0.1)");
    std::vector<int64_t> milestones;
    for (const std::string& m : split(f[1], ',')) {
      milestones.push_back(parse_number<int64_t>(m, spec, "the milestone"));
    }
    return std::make_unique<MultiStepSchedule>(std::move(milestones), parse_number<double>(f[2], spec, "gamma"));
  }
  if (name == "cosine") {
    MINIDL_CHECK(f.size() <= 2, "parse_schedule: in '", spec,
                 "', 'cosine' takes at most one argument: cosine[:ETA_MIN_RATIO] (e.g. cosine:0.01)");
    const double ratio = f.size() == 2 ? parse_number<double>(f[1], spec, "the eta_min ratio") : 0.0;
    MINIDL_CHECK(steps >= 1, "parse_schedule: '", spec, "' has a cosine spanning ", steps,
                 " steps (the run's total steps minus any warmup); make the run longer or the warmup shorter");
    return std::make_unique<CosineSchedule>(steps, ratio);
  }
  MINIDL_FAIL("parse_schedule: unknown schedule '", name, "' in '", spec, "'; ", kGrammar);
}

}  // namespace

double ConstantSchedule::factor(int64_t step) const {
  check_step(step, "constant schedule");
  return 1.0;
}

StepSchedule::StepSchedule(int64_t step_size, double gamma) : step_size_(step_size), gamma_(gamma) {
  MINIDL_CHECK(step_size >= 1, "step schedule: step_size ", step_size,
               " must be >= 1 (the number of optimizer steps between two decays)");
  check_gamma(gamma, "step schedule");
}

double StepSchedule::factor(int64_t step) const {
  check_step(step, "step schedule");
  return std::pow(gamma_, static_cast<double>(step / step_size_));
}

std::string StepSchedule::spec() const { return "step:" + std::to_string(step_size_) + ":" + fmt(gamma_); }

MultiStepSchedule::MultiStepSchedule(std::vector<int64_t> milestones, double gamma)
    : milestones_(std::move(milestones)), gamma_(gamma) {
  MINIDL_CHECK(!milestones_.empty(), "multistep schedule: no milestones; give at least one step at which to decay "
               "(e.g. multistep:30,60,90:0.1), or use 'constant'");
  for (size_t i = 0; i < milestones_.size(); ++i) {
    MINIDL_CHECK(milestones_[i] >= 1, "multistep schedule: milestone ", milestones_[i], " in ", milestones_,
                 " must be >= 1 (an optimizer step after the first)");
    MINIDL_CHECK(i == 0 || milestones_[i] > milestones_[i - 1], "multistep schedule: milestones ", milestones_,
                 " must be strictly increasing; sort them and remove duplicates");
  }
  check_gamma(gamma, "multistep schedule");
}

double MultiStepSchedule::factor(int64_t step) const {
  check_step(step, "multistep schedule");
  // bisect_right, as PyTorch: the decay applies from the milestone step itself.
  const auto passed = std::upper_bound(milestones_.begin(), milestones_.end(), step) - milestones_.begin();
  return std::pow(gamma_, static_cast<double>(passed));
}

std::string MultiStepSchedule::spec() const {
  std::string s = "multistep:";
  for (size_t i = 0; i < milestones_.size(); ++i) s += (i ? "," : "") + std::to_string(milestones_[i]);
  return s + ":" + fmt(gamma_);
}

CosineSchedule::CosineSchedule(int64_t total_steps, double eta_min_ratio)
    : total_steps_(total_steps), eta_min_ratio_(eta_min_ratio) {
  MINIDL_CHECK(total_steps >= 1, "cosine schedule: total_steps ", total_steps,
               " must be >= 1 (the number of optimizer steps the cosine spans)");
  MINIDL_CHECK(std::isfinite(eta_min_ratio) && eta_min_ratio >= 0.0 && eta_min_ratio <= 1.0,
               "cosine schedule: eta_min_ratio ", eta_min_ratio,
               " must be in [0, 1] (the final lr as a fraction of the base lr, e.g. 0.01)");
}

double CosineSchedule::factor(int64_t step) const {
  check_step(step, "cosine schedule");
  if (step >= total_steps_) return eta_min_ratio_;
  const double c = std::cos(std::numbers::pi * static_cast<double>(step) / static_cast<double>(total_steps_));
  return eta_min_ratio_ + (1.0 - eta_min_ratio_) * (1.0 + c) / 2.0;
}

std::string CosineSchedule::spec() const {
  return eta_min_ratio_ == 0.0 ? "cosine" : "cosine:" + fmt(eta_min_ratio_);
}

LinearWarmupSchedule::LinearWarmupSchedule(int64_t warmup_steps, double start_factor,
                                           std::unique_ptr<LrSchedule> inner)
    : warmup_steps_(warmup_steps), start_factor_(start_factor), inner_(std::move(inner)) {
  MINIDL_CHECK(warmup_steps >= 0, "linear warmup: warmup_steps ", warmup_steps,
               " must be >= 0 (0 means no warmup)");
  MINIDL_CHECK(std::isfinite(start_factor) && start_factor > 0.0 && start_factor <= 1.0,
               "linear warmup: start_factor ", start_factor,
               " must be in (0, 1] (the first step's lr as a fraction of the base lr, e.g. 0.1), as PyTorch's LinearLR");
  MINIDL_CHECK(inner_ != nullptr, "linear warmup: no schedule to follow the warmup; pass e.g. a ConstantSchedule");
}

double LinearWarmupSchedule::factor(int64_t step) const {
  check_step(step, "linear warmup");
  if (step < warmup_steps_) {
    return start_factor_ +
           (1.0 - start_factor_) * static_cast<double>(step) / static_cast<double>(warmup_steps_);
  }
  return inner_->factor(step - warmup_steps_);
}

std::string LinearWarmupSchedule::spec() const {
  return "warmup:" + std::to_string(warmup_steps_) + ":" + fmt(start_factor_) + "+" + inner_->spec();
}

std::unique_ptr<LrSchedule> parse_schedule(const std::string& spec, int64_t total_steps) {
  MINIDL_CHECK(total_steps >= 0, "parse_schedule: total_steps ", total_steps, " for '", spec,
               "' is negative; pass the run's number of optimizer steps");
  MINIDL_CHECK(!spec.empty(), "parse_schedule: empty schedule; ", kGrammar);
  const size_t plus = spec.find('+');
  if (plus == std::string::npos) {
    MINIDL_CHECK(spec.rfind("warmup", 0) != 0, "parse_schedule: '", spec,
                 "' has a warmup but no schedule after it; write e.g. '", spec, "+constant'");
    return parse_base(spec, spec, total_steps);
  }
  const std::vector<std::string> w = split(spec.substr(0, plus), ':');
  MINIDL_CHECK(w[0] == "warmup" && (w.size() == 2 || w.size() == 3), "parse_schedule: in '", spec,
               "', the part before '+' must be warmup:W or warmup:W:START_FACTOR; ", kGrammar);
  const int64_t warmup = parse_number<int64_t>(w[1], spec, "the warmup length");
  MINIDL_CHECK(warmup >= 0, "parse_schedule: in '", spec, "', the warmup length ", warmup, " must be >= 0");
  const double start = w.size() == 3 ? parse_number<double>(w[2], spec, "the warmup start factor")
                                     : LinearWarmupSchedule::kDefaultStartFactor;
  const std::string rest = spec.substr(plus + 1);
  MINIDL_CHECK(rest.find('+') == std::string::npos, "parse_schedule: '", spec,
               "' has more than one '+'; only one warmup may precede the schedule");
  MINIDL_CHECK(!rest.empty(), "parse_schedule: '", spec, "' has nothing after '+'; ", kGrammar);
  return std::make_unique<LinearWarmupSchedule>(warmup, start, parse_base(rest, spec, total_steps - warmup));
}

void apply_schedule(const LrSchedule& schedule, int64_t step, const std::vector<double>& base_lrs,
                    const std::function<void(size_t group, double lr)>& set_lr) {
  const double f = schedule.factor(step);
  for (size_t g = 0; g < base_lrs.size(); ++g) set_lr(g, base_lrs[g] * f);
}

double scaled_lr(double base_lr, int64_t effective_batch, int64_t base_batch, LrScaling scaling) {
  MINIDL_CHECK(std::isfinite(base_lr) && base_lr >= 0.0, "scaled_lr: base_lr ", base_lr,
               " must be a finite number >= 0");
  MINIDL_CHECK(base_batch >= 1, "scaled_lr: base_batch ", base_batch,
               " must be >= 1 (the batch size the base lr was tuned for, e.g. 256)");
  MINIDL_CHECK(effective_batch >= 1, "scaled_lr: effective_batch ", effective_batch,
               " must be >= 1 (micro-batch size times accumulation steps)");
  const double ratio = static_cast<double>(effective_batch) / static_cast<double>(base_batch);
  switch (scaling) {
    case LrScaling::None: return base_lr;
    case LrScaling::Linear: return base_lr * ratio;
    case LrScaling::Sqrt: return base_lr * std::sqrt(ratio);
  }
  MINIDL_FAIL("scaled_lr: unknown LrScaling value ", static_cast<int>(scaling));
}

LrScaling parse_lr_scaling(const std::string& name) {
  if (name == "none") return LrScaling::None;
  if (name == "linear") return LrScaling::Linear;
  if (name == "sqrt") return LrScaling::Sqrt;
  MINIDL_FAIL("parse_lr_scaling: unknown lr scaling rule '", name, "'; expected none, linear or sqrt");
}

std::string to_string(LrScaling scaling) {
  switch (scaling) {
    case LrScaling::None: return "none";
    case LrScaling::Linear: return "linear";
    case LrScaling::Sqrt: return "sqrt";
  }
  MINIDL_FAIL("to_string: unknown LrScaling value ", static_cast<int>(scaling));
}

}  // namespace minidl::optim
