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
#include "experiments/harness/train.h"

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

MaxBatchReport run_maxbatch(const TrainConfig& c, const MaxBatchOptions& o, bool verbose) {
  validate(c);
  // --gpu: a plan for a GPU this machine need not have, from the dry run alone (gpu_plan.h).
  const bool plan = !c.gpu.empty();
  if (c.memory_budget.empty() && !plan)
    throw UsageError("minidl-maxbatch needs --memory-budget (e.g. 11GiB) or --gpu (e.g. h100): the search is "
                     "relative to a budget");
  if (plan && o.profile)
    throw UsageError("--profile times real steps, which a plan (--gpu) does not run: profile on the GPU itself, "
                     "without --gpu");
  if (plan && c.world_size > 1) throw UsageError("--gpu plans for one device: run it as one process");
  if (o.steps < 1) throw UsageError("--steps must be >= 1");
  if (o.margin < 0 || o.margin >= 1) throw UsageError("--margin must be in [0, 1)");
  if (o.effective_batch < 0) throw UsageError("--effective-batch must be > 0");
  MaxBatchReport rep;
  rep.budget_bytes = plan ? plan_budget(c) : static_cast<int64_t>(parse_bytes(c.memory_budget));
  // Several ranks: each searches its own device's maximum micro-batch with trials that do not
  // communicate (an OOM inside one cannot leave another rank waiting in a collective), and the
  // ranks agree on every trial's outcome afterwards. The trials hold, beside the model, a buffer
  // as large as the gradients: DataParallel's buckets in training.
  distributed::ProcessGroup* group = c.world_size > 1 ? &distributed::world() : nullptr;
  if (group && group->world_size() != c.world_size)
    throw UsageError("the configuration says " + std::to_string(c.world_size) + " ranks but this process is " +
                     group->describe());
  // The dry run: the same trials on the shape-only device standing for this one (each one a
  // fraction of a real step's time), with the same budget. Its answer is then confirmed by one
  // real trial; only when that fails does the search run on real trials.
  // Built first: its model passes through host memory on the way to the meta device, which must
  // not count against the real runner's budget.
  StepRunner dry(c, rep.budget_bytes, dry_run_device(c));
  std::optional<StepRunner> real;   // none for a plan
  if (!plan) real.emplace(c, rep.budget_bytes);
  StepRunner& runner = real ? *real : dry;   // the real one when there is one
  Tensor buckets, dry_buckets;   // the dry run holds them too
  if (group) {
    buckets = zeros({std::max<int64_t>(1, runner.parameter_bytes())}, {DType::u8, runner.device(), false});
    dry_buckets = zeros({std::max<int64_t>(1, dry.parameter_bytes())}, {DType::u8, dry.device(), false});
  }
  std::ostringstream os;
  auto say = [&](const std::string& line) {
    os << line << "\n";
    if (verbose) std::printf("%s\n", line.c_str()), std::fflush(stdout);
  };
  if (plan) say(plan_assumptions(c));
  say("minidl-maxbatch: " + c.model + " at " + std::to_string(runner.model().image_size) + " px, " + c.optimizer +
      ", checkpoint " + c.checkpoint + ", budget " + mib(rep.budget_bytes) + ", " + std::to_string(o.steps) +
      " steps per trial; weights + optimizer state " + mib(runner.baseline_allocated()) +
      "; every trial also holds what the run holds beside its steps: " + runner.footprint().describe() +
      (group ? "; " + std::to_string(group->world_size()) + " ranks: the maximum per device, each trial agreed "
                      "across the ranks (gradient buckets " + mib(static_cast<int64_t>(buckets.nbytes())) + " held)"
             : ""));
  FinderOptions fo;
  // The prediction aims at the smallest budget over the ranks (devices of different sizes), so that
  // every rank tries the same batches.
  fo.budget_bytes = group ? static_cast<int64_t>(group->allreduce(static_cast<double>(rep.budget_bytes), distributed::ReduceOp::Min))
                          : rep.budget_bytes;
  fo.probe_small = o.probe_small;
  fo.probe_large = o.probe_large;
  fo.limit = o.limit;
  const auto real_trial = [&](int64_t b) {
    // A sweep stopped by SIGINT (a deadline) should not wait for the rest of the search.
    const bool stop = group ? group->any(stop_requested()) : stop_requested();
    if (stop) throw Interrupted("minidl-maxbatch: stopped (SIGINT) before trying batch " + std::to_string(b));
    const Trial t = agree(group, runner.run(b, o.steps));
    say("  batch " + std::to_string(b) + ": " + (t.ok ? "ok" : "OOM") + ", peak allocated " + mib(t.peak_allocated) +
        ", reserved " + mib(t.peak_reserved) +
        (t.ok ? ", " + fmt(t.step_seconds, 3) + " s/step" : (t.recovered ? ", recovered" : ", NOT recovered")));
    return t;
  };
  const auto t0 = std::chrono::steady_clock::now();
  FinderOptions dry_fo = fo;
  dry_fo.max_trials = 200;
  // Agreed across ranks like the real trials: ranks with different budgets search the same batches.
  const FinderResult dry_search = find_max_batch([&](int64_t b) { return agree(group, dry.run(b, o.steps)); }, dry_fo);
  const double dry_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  say("dry run on " + dry_run_device(c).str() + ": maximum batch " + std::to_string(dry_search.max_batch) + " after " +
      std::to_string(dry_search.trials.size()) + " dry trials in " + fmt(dry_seconds, 3) + " s (peak allocated " +
      mib(dry_search.at_max.peak_allocated) + ", reserved " + mib(dry_search.at_max.peak_reserved) + ")");
  Trial confirm;
  if (dry_search.max_batch > 0 && !plan) confirm = real_trial(dry_search.max_batch);
  if (plan) {
    rep.finder = dry_search;   // the plan's answer: not tried on the GPU
  } else if (confirm.ok) {
    rep.finder = dry_search;
    rep.finder.trials = {{dry_search.max_batch, confirm}};
    rep.finder.ooms = 0;
    rep.finder.all_recovered = true;
    rep.finder.at_max = confirm;
    rep.finder.confirmed = true;
  } else {
    say(dry_search.max_batch > 0 ? "the real trial at the dry run's answer failed: searching on real trials"
                                 : "the dry run fits no batch: searching on real trials");
    rep.finder = find_max_batch(real_trial, fo);
  }
  rep.finder.dry_max_batch = dry_search.max_batch;
  rep.finder.dry_trials = static_cast<int>(dry_search.trials.size());
  rep.finder.dry_seconds = dry_seconds;
  rep.finder.dry_at_max = dry_search.at_max;
  const FinderResult& f = rep.finder;
  if (group) group->check_same("the maximum batch found", f.max_batch);   // agreed trials: never differs
  rep.recommended = recommended_batch(f.max_batch, o.margin);
  say("memory model: " + mib(static_cast<int64_t>(f.model.fixed_bytes)) + " + " +
      mib(static_cast<int64_t>(f.model.bytes_per_sample)) + " per sample -> predicted maximum " +
      std::to_string(f.predicted) +
      (f.refined != f.predicted ? "; refit after the first trial: " +
                                      mib(static_cast<int64_t>(f.refined_model.bytes_per_sample)) + " per sample -> " +
                                      std::to_string(f.refined)
                                : ""));
  const double frag =
      f.at_max.peak_reserved > 0 ? 1.0 - static_cast<double>(f.at_max.peak_allocated) / f.at_max.peak_reserved : 0.0;
  say("maximum batch: " + std::to_string(f.max_batch) + (f.hit_limit ? " (the --limit; memory allows more)" : "") +
      (plan ? " (the dry run's answer for --gpu " + c.gpu + ", not tried on a GPU; the dry run says " +
                  std::to_string(f.max_batch + 1) + " does not fit)"
       : f.confirmed ? " (the dry run's answer, confirmed by one real trial; the dry run says " +
                           std::to_string(f.max_batch + 1) + " does not fit)"
                     : " after " + std::to_string(f.trials.size()) + " real trials (" + std::to_string(f.ooms) +
                         " OOM, " + (f.all_recovered ? "all recovered cleanly" : "NOT all recovered") + ")") +
      "; linear-model prediction error " + fmt(f.prediction_error_pct(), 1) + "% (probes), " +
      fmt(f.refined_error_pct(), 1) + "% (refit)");
  say("peak at the maximum: allocated " + mib(f.at_max.peak_allocated) + ", reserved " + mib(f.at_max.peak_reserved) +
      ", fragmentation " + fmt(100 * frag, 1) + "%");
  say("recommended batch (" + fmt(100 * o.margin, 0) + "% margin): " + std::to_string(rep.recommended));
  rep.json = {{"budget_bytes", rep.budget_bytes},
              {"gpu", c.gpu},
              {"world_size", c.world_size},
              {"steps_per_trial", o.steps},
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
              {"hit_limit", f.hit_limit},
              {"trials", f.trials.size()},
              {"ooms", f.ooms},
              {"all_recovered", f.all_recovered},
              {"prediction_error_pct", f.prediction_error_pct()},
              {"refined_error_pct", f.refined_error_pct()},
              {"peak_allocated_bytes", f.at_max.peak_allocated},
              {"peak_reserved_bytes", f.at_max.peak_reserved},
              {"fragmentation", frag},
              {"margin", o.margin},
              {"recommended", rep.recommended}};
  if (o.effective_batch > 0 && rep.recommended > 0) {
    // Each rank's share of the effective batch (rounded up) is split into micro-batches.
    const int64_t share = (o.effective_batch + c.world_size - 1) / c.world_size;
    rep.accumulation = accumulation_for(share, rep.recommended);
    say("effective batch " + std::to_string(o.effective_batch) + ": --batch-size " +
        std::to_string(rep.accumulation.micro_batch) + " --accumulation-steps " +
        std::to_string(rep.accumulation.steps) + " (= " +
        (c.world_size > 1 ? std::to_string(rep.accumulation.effective()) + " per rank x " +
                                std::to_string(c.world_size) + " ranks = "
                          : "") +
        std::to_string(rep.accumulation.effective() * c.world_size) + ")");
    rep.json["effective_batch"] = o.effective_batch;
    rep.json["accumulation_micro_batch"] = rep.accumulation.micro_batch;
    rep.json["accumulation_steps"] = rep.accumulation.steps;
  }
  if (o.profile && f.max_batch > 0) {
    const int64_t n = o.dataset_size > 0 ? o.dataset_size : train_images(c);
    say("profile (" + std::to_string(n) + " images per epoch, " + std::to_string(c.epochs) + " epochs):");
    say("  batch  images/s  peak allocated  epoch time  run time");
    nlohmann::json rows = nlohmann::json::array();
    for (int64_t b : profile_candidates(f.max_batch, rep.recommended)) {
      const Trial t = agree(group, runner.run(b, std::max(o.steps, 2)));
      if (!t.ok) continue;
      ProfileRow r;
      r.batch = b;
      r.images_per_second = static_cast<double>(b * c.world_size) / t.step_seconds;   // all ranks
      r.peak_allocated = t.peak_allocated;
      r.peak_reserved = t.peak_reserved;
      r.epoch_seconds = static_cast<double>(n) / r.images_per_second;
      r.run_seconds = r.epoch_seconds * static_cast<double>(c.epochs);
      r.within_margin = b <= rep.recommended;
      rep.profile.push_back(r);
      char line[160];
      std::snprintf(line, sizeof(line), "  %5lld  %8.1f  %14s  %9.1fs  %7.1fs%s", static_cast<long long>(b),
                    r.images_per_second, mib(r.peak_allocated).c_str(), r.epoch_seconds, r.run_seconds,
                    r.within_margin ? "" : "  (beyond the margin)");
      say(line);
      rows.push_back({{"batch", b},
                      {"images_per_second", r.images_per_second},
                      {"peak_allocated_bytes", r.peak_allocated},
                      {"peak_reserved_bytes", r.peak_reserved},
                      {"epoch_seconds", r.epoch_seconds},
                      {"run_seconds", r.run_seconds}});
    }
    rep.chosen = pick_profile_batch(rep.profile, o.time_budget_s);
    rep.json["profile"] = rows;
    if (rep.chosen >= 0) {
      const ProfileRow& r = rep.profile[static_cast<size_t>(rep.chosen)];
      const bool fits = o.time_budget_s > 0 && r.run_seconds <= o.time_budget_s;
      say("profile recommendation: batch " + std::to_string(r.batch) + " (" +
          (fits ? "the smallest whose run fits the " + fmt(o.time_budget_s, 0) + " s budget"
                : std::string(o.time_budget_s > 0 ? "none fits the time budget; " : "") +
                      "the fastest within the memory margin") +
          ", " + fmt(r.images_per_second, 1) + " images/s)");
      rep.json["profile_recommendation"] = r.batch;
    }
  }
  rep.text = os.str();
  return rep;
}

}  // namespace minidl::harness
