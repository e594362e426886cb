// The batch schedule of batch_schedule.h: parsing, the learning-rate rule, epoch units in
// --schedule, and the fallback to accumulation decided by a trial step under the budget.
#include "train/batch_schedule.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <sstream>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/generator.h"
#include "core/ops.h"
#include "train/finder.h"

namespace minidl::train {
namespace {

constexpr const char* kForms = "expected B@E,B@E,... (e.g. 32@0,64@5,128@10), xF@every:N (e.g. x2@every:5) or "
                               "xF@E1,E2,... (e.g. x2@5,10); epochs count completed epochs";

[[noreturn]] void bad(const std::string& spec, const std::string& why) {
  throw UsageError("--batch-schedule '" + spec + "': " + why + "; " + kForms);
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, sep)) out.push_back(item);
  if (!s.empty() && s.back() == sep) out.emplace_back();
  return out;
}

// A non-negative (or, with positive, >= 1) integer, the whole string.
bool to_int(const std::string& s, int64_t* v, bool positive) {
  if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos || s.size() > 12) return false;
  *v = std::stoll(s);
  return !positive || *v >= 1;
}

std::string trimmed_number(double v) {
  char b[40];
  std::snprintf(b, sizeof(b), "%.10g", v);
  return b;
}

}  // namespace

BatchSchedule BatchSchedule::parse(const std::string& spec, int64_t initial_batch) {
  BatchSchedule s;
  s.spec_ = spec;
  s.initial_ = initial_batch;
  if (spec.empty()) return s;
  if (spec[0] == 'x') {
    const size_t at = spec.find('@');
    if (at == std::string::npos) bad(spec, "a growth form needs '@'");
    if (!to_int(spec.substr(1, at - 1), &s.factor_, true) || s.factor_ < 2)
      bad(spec, "the growth factor '" + spec.substr(1, at - 1) + "' is not an integer >= 2");
    const std::string when = spec.substr(at + 1);
    if (when.rfind("every:", 0) == 0) {
      if (!to_int(when.substr(6), &s.every_, true)) bad(spec, "N in every:N must be a positive integer");
      return s;
    }
    int64_t last = 0;
    for (const std::string& e : split(when, ',')) {
      int64_t v = 0;
      if (!to_int(e, &v, true)) bad(spec, "'" + e + "' is not an epoch >= 1");
      if (v <= last) bad(spec, "the epochs must be strictly increasing");
      s.at_.push_back(last = v);
    }
    if (s.at_.empty()) bad(spec, "no epoch after '@'");
    return s;
  }
  int64_t last = -1;
  for (const std::string& item : split(spec, ',')) {
    const size_t at = item.find('@');
    int64_t b = 0, e = 0;
    if (at == std::string::npos || !to_int(item.substr(0, at), &b, true) || !to_int(item.substr(at + 1), &e, false))
      bad(spec, "'" + item + "' is not BATCH@EPOCH with a batch >= 1 and an epoch >= 0");
    if (e <= last) bad(spec, "the epochs must be strictly increasing");
    s.entries_.emplace_back(last = e, b);
  }
  return s;
}

int64_t BatchSchedule::batch_at(int64_t completed) const {
  if (factor_ > 0) {
    int64_t grows = 0;
    if (every_ > 0) grows = completed / every_;
    else grows = std::count_if(at_.begin(), at_.end(), [&](int64_t e) { return e <= completed; });
    int64_t b = initial_;
    for (int64_t i = 0; i < grows; ++i) {
      if (b > std::numeric_limits<int32_t>::max() / factor_)
        throw UsageError("--batch-schedule '" + spec_ + "' grows the batch past 2^31 by epoch " +
                         std::to_string(completed + 1) + "; cap it with the explicit form B@E,...");
      b *= factor_;
    }
    return b;
  }
  int64_t b = initial_;
  for (const auto& [e, batch] : entries_)
    if (e <= completed) b = batch;
  return b;
}

double batch_schedule_lr_factor(const std::string& rule, int64_t batch, int64_t first_batch) {
  const double ratio = static_cast<double>(batch) / static_cast<double>(first_batch);
  if (rule == "linear") return ratio;
  if (rule == "sqrt") return std::sqrt(ratio);
  return 1.0;
}

std::string resolve_epoch_units(const std::string& spec, const std::function<double(double)>& epoch_start_step,
                                int64_t epochs, int64_t warmup_steps) {
  const size_t plus = spec.rfind('+');
  const std::string prefix = plus == std::string::npos ? "" : spec.substr(0, plus + 1);
  const std::string body = spec.substr(prefix.size());
  const std::vector<std::string> f = split(body, ':');
  if (f.size() != 3 || (f[0] != "step" && f[0] != "multistep") || f[1].find('e') == std::string::npos) return spec;
  // "N e" as a number of epochs, and as a step of the inner schedule.
  const auto epochs_of = [&](const std::string& item) {
    try {
      size_t used = 0;
      if (item.size() < 2 || item.back() != 'e') throw std::invalid_argument(item);
      const double e = std::stod(item.substr(0, item.size() - 1), &used);
      if (used != item.size() - 1 || !(e > 0)) throw std::invalid_argument(item);
      return e;
    } catch (const std::exception&) {
      throw UsageError("--schedule '" + spec + "': '" + item + "' is not an epoch count > 0 such as 4e or 2.5e "
                       "(give every milestone in epochs, or none)");
    }
  };
  const auto to_step = [&](double e) {
    const int64_t step = std::llround(epoch_start_step(e)) - warmup_steps;
    if (step < 1)
      throw UsageError("--schedule '" + spec + "': the milestone " + trimmed_number(e) + "e (optimizer step " +
                       std::to_string(step + warmup_steps) + ") falls inside the " + std::to_string(warmup_steps) +
                       "-step warmup");
    return step;
  };
  std::vector<int64_t> steps;
  if (f[0] == "step") {
    const double every = epochs_of(f[1]);
    for (int k = 1; every * k < static_cast<double>(epochs); ++k) steps.push_back(to_step(every * k));
  } else {
    for (const std::string& m : split(f[1], ',')) steps.push_back(to_step(epochs_of(m)));
  }
  // Milestones that land on the same step (an epoch of no steps) collapse: MultiStepLR needs them increasing.
  std::vector<int64_t> uniq;
  for (int64_t s : steps)
    if (uniq.empty() || s > uniq.back()) uniq.push_back(s);
  if (uniq.empty()) return prefix + "constant";
  std::string out = prefix + "multistep:";
  for (size_t i = 0; i < uniq.size(); ++i) out += (i ? "," : "") + std::to_string(uniq[i]);
  return out + ":" + f[2];
}

EpochBatch fit_scheduled_batch(int64_t scheduled, int64_t accumulation, const std::function<bool(int64_t)>& fits) {
  EpochBatch eb{scheduled, scheduled, accumulation};
  if (fits(scheduled)) return eb;
  int64_t lo = 0, hi = scheduled;  // lo fits (0: none known), hi does not
  while (hi - lo > 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    (fits(mid) ? lo : hi) = mid;
  }
  if (lo == 0) {
    eb.micro = 0;
    return eb;
  }
  // An exact split keeps the scheduled batch, its learning rate and its step count: taken when it
  // needs at most twice the fewest accumulation steps (128 with 15 fitting: 8 x 16, not 15 x 9).
  AccumulationPlan p = accumulation_for(scheduled, lo);
  for (int64_t k = p.steps; k <= 2 * p.steps && p.effective() != scheduled; ++k)
    if (scheduled % k == 0) p = {scheduled / k, k};
  eb.micro = p.micro_batch;
  eb.accumulation = accumulation * p.steps;
  return eb;
}

EpochBatches::EpochBatches(const TrainConfig& c, int64_t train_size)
    : schedule_(BatchSchedule::parse(c.batch_schedule, c.batch_size)), lr_rule_(c.batch_schedule_lr),
      accumulation_(c.accumulation_steps), train_size_(train_size), batch_(static_cast<size_t>(c.epochs + 1)) {
  for (int64_t e = 1; e <= c.epochs; ++e) batch_[static_cast<size_t>(e)] = schedule_.batch_at(e - 1);
}

int64_t EpochBatches::scheduled(int64_t epoch) const {
  return batch_[static_cast<size_t>(std::clamp<int64_t>(epoch, 1, static_cast<int64_t>(batch_.size()) - 1))];
}

bool EpochBatches::phase_starts(int64_t epoch) const { return epoch <= 1 || scheduled(epoch) != scheduled(epoch - 1); }

int64_t EpochBatches::steps(int64_t epoch) const {
  const int64_t eff = scheduled(epoch) * accumulation_;
  return (train_size_ + eff - 1) / eff;
}

int64_t EpochBatches::total_steps() const {
  int64_t t = 0;
  for (size_t e = 1; e < batch_.size(); ++e) t += steps(static_cast<int64_t>(e));
  return t;
}

double EpochBatches::epoch_start_step(double completed) const {
  if (!schedule_.active()) return completed * static_cast<double>(steps(1));
  const auto whole = static_cast<int64_t>(std::floor(completed));
  double s = 0.0;
  for (int64_t e = 1; e <= whole; ++e) s += static_cast<double>(steps(e));
  return s + (completed - static_cast<double>(whole)) * static_cast<double>(steps(whole + 1));
}

double EpochBatches::lr_factor(int64_t epoch) const {
  return batch_schedule_lr_factor(lr_rule_, scheduled(epoch), scheduled(1));
}

std::vector<int64_t> EpochBatches::micro_sizes(const EpochBatch& eb) const {
  std::vector<int64_t> sizes(static_cast<size_t>((train_size_ + eb.micro - 1) / eb.micro), eb.micro);
  if (train_size_ % eb.micro != 0) sizes.back() = train_size_ % eb.micro;
  return sizes;
}

std::vector<std::string> EpochBatches::phase_lines(int64_t epoch, const EpochBatch& eb,
                                                   const std::string& limit_name) const {
  std::vector<std::string> out;
  const std::string at = "epoch " + std::to_string(epoch) + ": ";
  if (schedule_.active()) {
    char f[32];
    std::snprintf(f, sizeof(f), "%.4g", lr_factor(epoch));
    out.push_back(at + "batch " + std::to_string(eb.scheduled) + " (--batch-schedule " + schedule_.spec() +
                  "), lr x" + f + " (--batch-schedule-lr " + lr_rule_ + ")");
  }
  if (eb.fell_back()) {
    const int64_t wanted = eb.scheduled * accumulation_;
    out.push_back(at + "batch " + std::to_string(eb.scheduled) + " does not fit " + limit_name +
                  " (a trial forward/backward ran out of memory): micro-batch " + std::to_string(eb.micro) + " x " +
                  std::to_string(eb.accumulation) + " accumulation, effective batch " + std::to_string(eb.effective()) +
                  (eb.effective() == wanted ? " as scheduled" : " (no exact split of " + std::to_string(wanted) + ")"));
  }
  return out;
}

std::string EpochBatches::progress_note(const EpochBatch& eb) const {
  std::string s = schedule_.active() ? "  batch " + std::to_string(eb.effective()) : "";
  if (eb.fell_back())
    s += " (" + std::to_string(eb.micro) + " x " + std::to_string(eb.accumulation) + ": " +
         std::to_string(eb.scheduled) + " does not fit)";
  return s;
}

bool trial_step_fits(Model& m, optim::Optimizer& opt, const TrainConfig& c, Device device, int64_t micro,
                     bool accumulating) {
  // Batch-norm statistics move in a training forward; the default generator serves dropout.
  std::vector<Tensor> buffers = m.module->buffers(), saved;
  for (const Tensor& b : buffers) saved.push_back(b.clone());
  Generator& g = default_generator();
  const uint64_t seed = g.seed(), offset = g.offset();
  const TensorOptions fo{DType::f32, device, false};
  int64_t params = 0, largest = 0;   // bytes
  for (const Tensor& p : m.module->parameters()) {
    params += static_cast<int64_t>(p.nbytes());
    largest = std::max(largest, static_cast<int64_t>(p.nbytes()));
  }
  bool ok = true;
  try {
    int64_t ballast_bytes = micro * (3 * m.image_size * m.image_size * 4 + 8);  // the loader's next batch
    if (opt.step_count() == 0) ballast_bytes += static_cast<int64_t>(static_cast<double>(params) * optimizer_state_factor(c));
    const Tensor ballast = empty({ballast_bytes}, {DType::u8, device, false});
    Generator local(c.seed * 4 + 11);
    // A second micro-batch adds its gradients into the first one's (temporaries of a parameter's size).
    for (int pass = 0; pass < (accumulating ? 2 : 1); ++pass) {
      const Tensor x = randn(m.input_shape(micro), fo, &local);
      const Tensor labels = gt(rand({micro}, fo, &local), full({1}, 0.5, fo)).to(DType::i64);
      m.loss(m.forward(x), labels).backward();
    }
    // The optimizer step, once the activations are gone: the unfused update's temporaries, copies
    // of the largest parameter's gradient (optim/sgd.cpp, adam.cpp: one for weight decay, one for
    // Nesterov; Adam's g*g and its denominator).
    const bool wd = c.resolved_weight_decay() != 0.0;
    const int64_t copies = c.optimizer == "sgd" ? (wd ? 1 : 0) + (c.nesterov ? 1 : 0) : 2 + (wd ? 1 : 0);
    const Tensor update = empty({std::max<int64_t>(1, copies * largest)}, {DType::u8, device, false});
  } catch (const OutOfMemoryError&) {
    ok = false;
  }
  opt.zero_grad();
  {
    NoGradGuard no_grad;
    for (size_t i = 0; i < buffers.size(); ++i) buffers[i].copy_(saved[i]);
  }
  g.manual_seed(seed);
  g.set_offset(offset);
  return ok;
}

}  // namespace minidl::train
