// The maximum-batch report (see maxbatch.h).
#include "experiments/harness/maxbatch.h"

#include <chrono>
#include <cmath>
#include <cstdio>
#include <optional>
#include <sstream>

#include "core/allocator.h"
#include "distributed/process_group.h"
#include "experiments/harness/gpu_plan.h"
#include "experiments/harness/results.h"
#include "experiments/harness/step_runner.h"
#include "train/run.h"

namespace minidl::harness {
namespace {

std::string mib(int64_t b) { return format_bytes(static_cast<size_t>(std::max<int64_t>(b, 0))); }   // one style

int64_t train_images(const TrainConfig& c) {
  const SplitSpec s = parse_split(c.split);
  if (s.counts) return 2 * static_cast<int64_t>(s.parts[0]);
  return static_cast<int64_t>(2 * (c.synthetic_size > 0 ? c.synthetic_size : 1000) * s.parts[0]);
}

// A trial as every rank sees it (one allreduce per figure): ok only when it was ok everywhere (an
// OOM on one rank is an OOM of the job), the largest peaks and step time, recovered everywhere. The
// ranks therefore take the same decisions and try the same batches in the same order.
Trial agree(distributed::ProcessGroup* group, Trial t) {
  if (group == nullptr) return t;
  const auto max = [&](double v) { return group->allreduce(v, distributed::ReduceOp::Max); };
  t.ok = !group->any(!t.ok);
  t.recovered = !group->any(!t.recovered);
  t.peak_allocated = static_cast<int64_t>(max(static_cast<double>(t.peak_allocated)));
  t.peak_reserved = static_cast<int64_t>(max(static_cast<double>(t.peak_reserved)));
  t.activation_phase_reserved = static_cast<int64_t>(max(static_cast<double>(t.activation_phase_reserved)));
  t.step_seconds = max(t.step_seconds);
  return t;
}

}  // namespace

double parse_duration(const std::string& s) {
  try {
    size_t used = 0;
    double v = std::stod(s, &used);
    const std::string unit = s.substr(used);
    if (unit == "h") v *= 3600;
    else if (unit == "m" || unit == "min") v *= 60;
    else if (!unit.empty() && unit != "s") throw std::invalid_argument(s);
    if (v < 0) throw std::invalid_argument(s);
    return v;
  } catch (const std::exception&) {
    throw UsageError("--time-budget '" + s + "': expected a duration such as 90, 90s, 15m or 2h");
  }
}

namespace {

// One search of run_maxbatch, as named parts: the checks and runners, the report's first line, the
// dry search and its confirmation (or the search on real trials), the summary lines and JSON, the
// accumulation plan and the profile. The members are what the parts share.
class Search {
 public:
  Search(const TrainConfig& c, const MaxBatchOptions& o, bool verbose);
  MaxBatchReport run();

 private:
  void check() const;
  void say(const std::string& line);
  void first_line();
  Trial real_trial(int64_t b);
  void search();
  void confirm_next(int64_t answer);
  void check_recommended();
  bool optimal() const { return runner_->model().checkpoint.kind == CheckpointSpec::Kind::Optimal; }
  void summary();
  void accumulation();
  void profile();

  const TrainConfig& c_;
  const MaxBatchOptions& o_;
  const bool verbose_;
  // --gpu: a plan for a GPU this machine need not have, from the dry run alone (gpu_plan.h).
  const bool plan_;
  // Several ranks: each searches its own device's maximum micro-batch with trials that do not
  // communicate (an OOM inside one cannot leave another rank waiting in a collective), and the
  // ranks agree on every trial's outcome afterwards. The trials hold, beside the model, a buffer
  // as large as the gradients: DataParallel's buckets in training.
  distributed::ProcessGroup* group_ = nullptr;
  MaxBatchReport rep_;
  // The dry run: the same trials on the shape-only device standing for this one (each one a
  // fraction of a real step's time), with the same budget. Its answer is then confirmed by one
  // real trial; only when that fails does the search run on real trials. Built first: its model
  // passes through host memory on the way to the meta device, which must not count against the
  // real runner's budget.
  std::optional<StepRunner> dry_;
  std::optional<StepRunner> real_;   // none for a plan
  StepRunner* runner_ = nullptr;      // the real one when there is one
  Tensor buckets_, dry_buckets_;      // the dry run holds them too
  FinderOptions fo_;
  std::ostringstream os_;
};

Search::Search(const TrainConfig& c, const MaxBatchOptions& o, bool verbose)
    : c_(c), o_(o), verbose_(verbose), plan_(!c.gpu.empty()) {
  check();
  rep_.budget_bytes = plan_ ? plan_budget(c_) : static_cast<int64_t>(parse_bytes(c_.memory_budget));
  group_ = c_.world_size > 1 ? &distributed::world() : nullptr;
  if (group_ && group_->world_size() != c_.world_size)
    throw UsageError("the configuration says " + std::to_string(c_.world_size) + " ranks but this process is " +
                     group_->describe());
  dry_.emplace(c_, rep_.budget_bytes, dry_run_device(c_));
  if (!plan_) real_.emplace(c_, rep_.budget_bytes);
  runner_ = real_ ? &*real_ : &*dry_;
  if (group_) {
    buckets_ = zeros({std::max<int64_t>(1, runner_->parameter_bytes())}, {DType::u8, runner_->device(), false});
    dry_buckets_ = zeros({std::max<int64_t>(1, dry_->parameter_bytes())}, {DType::u8, dry_->device(), false});
  }
  // The prediction aims at the smallest budget over the ranks (devices of different sizes), so that
  // every rank tries the same batches.
  fo_.budget_bytes =
      group_ ? static_cast<int64_t>(group_->allreduce(static_cast<double>(rep_.budget_bytes), distributed::ReduceOp::Min))
             : rep_.budget_bytes;
  fo_.probe_small = o_.probe_small;
  fo_.probe_large = o_.probe_large;
  fo_.limit = o_.limit;
}

void Search::check() const {
  validate(c_);
  if (c_.memory_budget.empty() && !plan_)
    throw UsageError("minidl-maxbatch needs --memory-budget (e.g. 11GiB) or --gpu (e.g. h100): the search is "
                     "relative to a budget");
  if (plan_ && o_.profile)
    throw UsageError("--profile times real steps, which a plan (--gpu) does not run: profile on the GPU itself, "
                     "without --gpu");
  if (plan_ && c_.world_size > 1) throw UsageError("--gpu plans for one device: run it as one process");
  if (o_.steps < 1) throw UsageError("--steps must be >= 1");
  if (o_.margin < 0 || o_.margin >= 1) throw UsageError("--margin must be in [0, 1)");
  if (o_.effective_batch < 0) throw UsageError("--effective-batch must be > 0");
}

void Search::say(const std::string& line) {
  os_ << line << "\n";
  if (verbose_) std::printf("%s\n", line.c_str()), std::fflush(stdout);
}

void Search::first_line() {
  if (plan_) say(plan_assumptions(c_));
  say("minidl-maxbatch: " + c_.model + " at " + std::to_string(runner_->model().image_size) + " px, " + c_.optimizer +
      ", checkpoint " + c_.checkpoint + ", budget " + mib(rep_.budget_bytes) +
      (c_.expandable_segments ? " (expandable segments)" : "") + ", " + std::to_string(o_.steps) +
      " steps per trial; weights + optimizer state " + mib(runner_->baseline_allocated()) +
      "; every trial also holds what the run holds beside its steps: " + runner_->footprint().describe() +
      (group_ ? "; " + std::to_string(group_->world_size()) + " ranks: the maximum per device, each trial agreed "
                "across the ranks (gradient buckets " + mib(static_cast<int64_t>(buckets_.nbytes())) + " held)"
              : ""));
}

Trial Search::real_trial(int64_t b) {
  // A sweep stopped by SIGINT (a deadline) should not wait for the rest of the search.
  const bool stop = group_ ? group_->any(stop_requested()) : stop_requested();
  if (stop) throw Interrupted("minidl-maxbatch: stopped (SIGINT) before trying batch " + std::to_string(b));
  const Trial t = agree(group_, runner_->run(b, o_.steps));
  say("  batch " + std::to_string(b) + ": " + (t.ok ? "ok" : "OOM") + ", peak allocated " + mib(t.peak_allocated) +
      ", reserved " + mib(t.peak_reserved) +
      (t.ok ? ", " + fmt(t.step_seconds, 3) + (c_.accumulation_steps > 1 ? " s a micro-batch" : " s/step")
            : (t.recovered ? ", recovered" : ", NOT recovered")));
  return t;
}

void Search::search() {
  const auto t0 = std::chrono::steady_clock::now();
  FinderOptions dry_fo = fo_;
  dry_fo.max_trials = 200;
  // Each batch's own recomputation plan makes what fits non-monotonic: look past the first failure.
  if (optimal()) dry_fo.look_above = 4;
  // Agreed across ranks like the real trials: ranks with different budgets search the same batches.
  const FinderResult dry_search =
      find_max_batch([&](int64_t b) { return agree(group_, dry_->run(b, o_.steps)); }, dry_fo);
  const double dry_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  say("dry run on " + dry_run_device(c_).str() + ": maximum batch " + std::to_string(dry_search.max_batch) +
      " after " + std::to_string(dry_search.trials.size()) + " dry trials in " + fmt(dry_seconds, 3) +
      " s (peak allocated " + mib(dry_search.at_max.peak_allocated) + ", reserved " +
      mib(dry_search.at_max.peak_reserved) + ")" +
      (dry_search.below_gap > 0 ? "; batches above its first answer, " + std::to_string(dry_search.below_gap) +
                                      ", fit again (each batch solves its own --checkpoint optimal plan): the largest "
                                      "that fits is the answer"
                                : ""));
  Trial confirm;
  if (dry_search.max_batch > 0 && !plan_) confirm = real_trial(dry_search.max_batch);
  FinderResult& f = rep_.finder;
  if (plan_) {
    f = dry_search;   // the plan's answer: not tried on the GPU
  } else if (confirm.ok) {
    f = dry_search;
    f.trials = {{dry_search.max_batch, confirm}};
    f.ooms = 0;
    f.all_recovered = true;
    f.at_max = confirm;
    f.confirmed = true;
    if (o_.confirm_next && !f.hit_limit) confirm_next(dry_search.max_batch);
  } else {
    // Below the dry run's answer, which has just failed: the probes' line may point far above it
    // (with --checkpoint optimal each batch's plan fills the limit, and the peaks hardly grow).
    FinderOptions real_fo = fo_;
    const int64_t below = dry_search.max_batch - 1;
    if (dry_search.max_batch > 0) real_fo.limit = std::min(fo_.limit, std::max<int64_t>(below, 1));
    say(dry_search.max_batch > 0 ? "the real trial at the dry run's answer failed: searching on real trials below it"
                                 : "the dry run fits no batch: searching on real trials");
    f = find_max_batch([this](int64_t b) { return real_trial(b); }, real_fo);
    if (dry_search.max_batch > 0 && f.hit_limit && f.max_batch == below) f.hit_limit = false;   // the next one failed
  }
  f.dry_max_batch = dry_search.max_batch;
  f.dry_trials = static_cast<int>(dry_search.trials.size());
  f.dry_seconds = dry_seconds;
  f.dry_at_max = dry_search.at_max;
  if (group_) group_->check_same("the maximum batch found", f.max_batch);   // agreed trials: never differs
  rep_.recommended = recommended_batch(f.max_batch, o_.margin);
}

// --confirm-next: upward from the confirmed answer on real trials (search_upward), whose first is
// the answer + 1. When that one runs out of memory, the dry run's answer is the real one both ways;
// when it fits, the search goes on to the real maximum.
void Search::confirm_next(int64_t answer) {
  FinderResult& f = rep_.finder;
  f.next_tried = true;
  search_upward([this](int64_t b) { return real_trial(b); }, answer, f.at_max, fo_.limit, f);
  f.next_failed = f.max_batch == answer;
  f.confirmed = f.next_failed;
  if (!f.next_failed)
    say("the real trial at the dry run's answer + 1 fitted: the real maximum is " + std::to_string(f.max_batch));
}

// What fits is not monotonic in the batch. The run's shapes change with it: the epoch's last,
// smaller batch and the evaluation's, and where the caching allocator places their blocks beside the
// full batch's. And --checkpoint optimal solves a plan for each batch, and a smaller batch's plan
// keeps more, up to the planner's limit: its real peak (workspaces, the allocator's blocks, which the
// planner's model leaves out) can pass the budget where a larger batch's least-memory plan fitted.
// The recommended batch is therefore tried itself: in the dry run, one step down at a time until it
// fits, then in a real trial (a few steps down at most).
void Search::check_recommended() {
  const int64_t first = rep_.recommended;
  if (first <= 0 || first == rep_.finder.max_batch) return;
  const auto down = [](int64_t b) { return b - std::max<int64_t>(1, b / 50); };
  int64_t b = first;
  for (int k = 0; b > 0 && k < 200 && !agree(group_, dry_->run(b, o_.steps)).ok; ++k) b = down(b);
  bool confirmed = plan_ || b <= 0;
  for (int k = 0; !confirmed && k < 6; ++k) {
    confirmed = real_trial(b).ok;
    if (!confirmed) b = down(b);
  }
  rep_.recommended = std::max<int64_t>(b, 0);
  if (b != first)
    say("the recommended batch " + std::to_string(first) + " does not fit (" +
        (optimal() ? "it runs its own recomputation plan: --checkpoint optimal plans each batch"
                   : "its epochs end with other shapes, whose blocks fall elsewhere") +
        "): " + std::to_string(b) + (confirmed ? " does" : " is the last tried"));
}

// The lines after the search, and maxbatch.json's figures.
void Search::summary() {
  const FinderResult& f = rep_.finder;
  say("memory model: " + mib(static_cast<int64_t>(f.model.fixed_bytes)) + " + " +
      mib(static_cast<int64_t>(f.model.bytes_per_sample)) + " per sample -> predicted maximum " +
      std::to_string(f.predicted) +
      (f.refined != f.predicted ? "; refit after the first trial: " +
                                      mib(static_cast<int64_t>(f.refined_model.bytes_per_sample)) + " per sample -> " +
                                      std::to_string(f.refined)
                                : ""));
  const double frag =
      f.at_max.peak_reserved > 0 ? 1.0 - static_cast<double>(f.at_max.peak_allocated) / f.at_max.peak_reserved : 0.0;
  const std::string next = std::to_string(f.max_batch + 1);
  say("maximum batch: " + std::to_string(f.max_batch) + (f.hit_limit ? " (the --limit; memory allows more)" : "") +
      (plan_ ? " (the dry run's answer for --gpu " + c_.gpu + ", not tried on a GPU; the dry run says " + next +
                   " does not fit)"
       : f.confirmed && f.next_failed
           ? " (the dry run's answer, checked both ways by real trials: it fits, " + next + " does not)"
       : f.confirmed ? " (the dry run's answer, confirmed by one real trial; the dry run says " + next +
                           " does not fit)"
                     : " after " + std::to_string(f.trials.size()) + " real trials (" + std::to_string(f.ooms) +
                           " OOM, " + (f.all_recovered ? "all recovered cleanly" : "NOT all recovered") + ")") +
      // The dry run's answer does not come from the probes' straight line; where memory is far from
      // linear in the batch (recomputation plans) its error says nothing but that.
      (plan_ || f.confirmed ? "; the probes' straight line predicted " + std::to_string(f.predicted) +
                                  " (the dry run decides: memory is not linear in the batch)"
                            : "; linear-model prediction error " + fmt(f.prediction_error_pct(), 1) + "% (probes), " +
                                  fmt(f.refined_error_pct(), 1) + "% (refit)"));
  say("peak at the maximum: allocated " + mib(f.at_max.peak_allocated) + ", reserved " + mib(f.at_max.peak_reserved) +
      ", fragmentation " + fmt(100 * frag, 1) + "%" +
      (frag >= 0.05 && !c_.expandable_segments && dry_run_device(c_).target() == DeviceType::CUDA
           ? " (--expandable-segments gives memory freed between live blocks back to the device: this "
             "program with it answers for it)"
           : ""));
  if (c_.resolved_cuda_graphs())
    say(std::string(f.at_max.graphed
                        ? "steps at the maximum: replayed from a CUDA graph (its private pool is in the peak)"
                    : f.at_max.windowless
                        ? "steps at the maximum: eager, since an epoch at this batch holds fewer micro-batches than a "
                          "window of --accumulation-steps " + std::to_string(c_.accumulation_steps) +
                              ": its one step is a trailing window, which never replays (in the run as in the trial)"
                    : f.at_max.graphs_dropped
                        ? "steps at the maximum: replayed from a CUDA graph until eager work beside it (an evaluation "
                          "batch, the epoch's partial batch, a batch's inputs) does not fit, then eager (the run drops "
                          "the graphs as the trial did)"
                        : "steps at the maximum: eager, since the CUDA graph's capture does not fit (the run falls "
                          "back as the trial did)") +
        (f.at_max.graphed ? "" : "; --cuda-graphs finds the largest batch that replays, --no-cuda-graphs the largest "
                                 "eager one"));
  say("recommended batch (" + fmt(100 * o_.margin, 0) + "% margin" +
      (optimal() ? ", tried with its own recomputation plan" : ", tried") + "): " + std::to_string(rep_.recommended));
  rep_.json = {{"budget_bytes", rep_.budget_bytes},
               {"gpu", c_.gpu},
               {"world_size", c_.world_size},
               {"steps_per_trial", o_.steps},
               {"fixed_bytes", f.model.fixed_bytes},
               {"bytes_per_sample", f.model.bytes_per_sample},
               {"predicted", f.predicted},
               {"refined_prediction", f.refined},
               {"max_batch", f.max_batch},
               {"dry_max_batch", f.dry_max_batch},
               {"dry_trials", f.dry_trials},
               {"dry_seconds", f.dry_seconds},
               {"dry_peak_allocated_bytes", f.dry_at_max.peak_allocated},
               {"dry_peak_reserved_bytes", f.dry_at_max.peak_reserved},
               {"confirmed_by_one_real_trial", f.confirmed},
               {"real_next_tried", f.next_tried},
               {"real_next_failed", f.next_failed},
               {"hit_limit", f.hit_limit},
               {"trials", f.trials.size()},
               {"ooms", f.ooms},
               {"all_recovered", f.all_recovered},
               {"prediction_error_pct", f.prediction_error_pct()},
               {"refined_error_pct", f.refined_error_pct()},
               {"peak_allocated_bytes", f.at_max.peak_allocated},
               {"peak_reserved_bytes", f.at_max.peak_reserved},
               {"fragmentation", frag},
               {"graphed_at_max", f.at_max.graphed},
               {"graphs_dropped_at_max", f.at_max.graphs_dropped},
               {"windowless_at_max", f.at_max.windowless},
               {"margin", o_.margin},
               {"recommended", rep_.recommended}};
}

// --effective-batch: each rank's share of it (rounded up) split into micro-batches.
void Search::accumulation() {
  if (o_.effective_batch <= 0 || rep_.recommended <= 0) return;
  const int64_t share = (o_.effective_batch + c_.world_size - 1) / c_.world_size;
  AccumulationPlan& a = rep_.accumulation;
  a = accumulation_for(share, rep_.recommended);
  say("effective batch " + std::to_string(o_.effective_batch) + ": --batch-size " + std::to_string(a.micro_batch) +
      " --accumulation-steps " + std::to_string(a.steps) + " (= " +
      (c_.world_size > 1 ? std::to_string(a.effective()) + " per rank x " + std::to_string(c_.world_size) + " ranks = "
                         : "") +
      std::to_string(a.effective() * c_.world_size) + ")");
  rep_.json["effective_batch"] = o_.effective_batch;
  rep_.json["accumulation_micro_batch"] = a.micro_batch;
  rep_.json["accumulation_steps"] = a.steps;
}

void Search::profile() {
  if (!o_.profile || rep_.finder.max_batch <= 0) return;
  const int64_t n = o_.dataset_size > 0 ? o_.dataset_size : train_images(c_);
  say("profile (" + std::to_string(n) + " images per epoch, " + std::to_string(c_.epochs) + " epochs):");
  say("  batch  images/s  peak allocated  epoch time  run time");
  nlohmann::json rows = nlohmann::json::array();
  for (int64_t b : profile_candidates(rep_.finder.max_batch, rep_.recommended)) {
    const Trial t = agree(group_, runner_->run(b, std::max(o_.steps, 2)));
    if (!t.ok) continue;
    ProfileRow r;
    r.batch = b;
    r.images_per_second = static_cast<double>(b * c_.world_size) / t.step_seconds;   // all ranks
    r.peak_allocated = t.peak_allocated;
    r.peak_reserved = t.peak_reserved;
    r.epoch_seconds = static_cast<double>(n) / r.images_per_second;
    r.run_seconds = r.epoch_seconds * static_cast<double>(c_.epochs);
    r.within_margin = b <= rep_.recommended;
    rep_.profile.push_back(r);
    char line[160];
    std::snprintf(line, sizeof(line), "  %5lld  %8.1f  %14s  %9.1fs  %7.1fs%s", static_cast<long long>(b),
                  r.images_per_second, mib(r.peak_allocated).c_str(), r.epoch_seconds, r.run_seconds,
                  r.within_margin ? "" : "  (beyond the margin)");
    say(line);
    rows.push_back({{"batch", b},
                    {"images_per_second", r.images_per_second},
                    {"peak_allocated_bytes", r.peak_allocated},
                    {"peak_reserved_bytes", r.peak_reserved},
                    {"graphed", t.graphed},
                    {"epoch_seconds", r.epoch_seconds},
                    {"run_seconds", r.run_seconds}});
  }
  rep_.chosen = pick_profile_batch(rep_.profile, o_.time_budget_s);
  rep_.json["profile"] = rows;
  if (rep_.chosen < 0) return;
  const ProfileRow& r = rep_.profile[static_cast<size_t>(rep_.chosen)];
  const bool fits = o_.time_budget_s > 0 && r.run_seconds <= o_.time_budget_s;
  say("profile recommendation: batch " + std::to_string(r.batch) + " (" +
      (fits ? "the smallest whose run fits the " + fmt(o_.time_budget_s, 0) + " s budget"
            : std::string(o_.time_budget_s > 0 ? "none fits the time budget; " : "") +
                  "the fastest within the memory margin") +
      ", " + fmt(r.images_per_second, 1) + " images/s)");
  rep_.json["profile_recommendation"] = r.batch;
}

MaxBatchReport Search::run() {
  first_line();
  search();
  check_recommended();
  summary();
  accumulation();
  profile();
  rep_.text = os_.str();
  return rep_;
}

}  // namespace

MaxBatchReport run_maxbatch(const TrainConfig& c, const MaxBatchOptions& o, bool verbose) {
  return Search(c, o, verbose).run();
}

}  // namespace minidl::harness
