// The search of finder.h: probe, fit, predict, refit on the survivors nearest the answer (secant
// steps), then grow or step down by doubling steps and bisect the last gap, so a good prediction is
// confirmed in two or three trials.
#include "train/finder.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <iterator>
#include <map>
#include <optional>

#include "core/error.h"

namespace minidl::train {
namespace {
constexpr int kSecantSteps = 4;   // refits before falling back to doubling growth

// FinderOptions::look_above's candidates above an answer, in increasing order, none above limit:
// answer + 2 .. answer + look_above, then steps of an eighth of the answer up to twice it.
std::vector<int64_t> above_answer(int64_t answer, int64_t look_above, int64_t limit) {
  std::vector<int64_t> c;
  for (int64_t b = answer + 2; b <= answer + look_above; ++b) c.push_back(b);
  const int64_t step = std::max<int64_t>(1, (answer + 7) / 8);
  for (int64_t b = answer + step; b <= 2 * answer; b += step) c.push_back(b);
  std::sort(c.begin(), c.end());
  c.erase(std::unique(c.begin(), c.end()), c.end());
  c.erase(std::remove_if(c.begin(), c.end(), [&](int64_t b) { return b <= answer + 1 || b > limit; }), c.end());
  return c;
}

// FinderOptions::look_above, after the search: lo its answer, hi the failure above it; `run` tries
// a batch and moves lo and hi as the search's own trials do. From the first candidate above the
// answer that fits, grow by doubling steps and bisect, again until no candidate fits.
void look_above(const std::function<Trial(int64_t)>& run, int64_t& lo, std::optional<int64_t>& hi,
                const FinderOptions& o, FinderResult& r) {
  const int64_t first = lo;
  const auto tried = [&](int64_t b) {
    return std::any_of(r.trials.begin(), r.trials.end(), [&](const auto& t) { return t.first == b; });
  };
  while (hi && lo > 0) {
    std::optional<int64_t> again;
    for (int64_t c : above_answer(lo, o.look_above, o.limit)) {
      if (!tried(c) && run(c).ok) {
        again = c;
        break;
      }
    }
    if (!again) break;
    hi.reset();   // the failures below it no longer bound the answer
    for (int64_t step = 1; !hi; step *= 2) {
      const int64_t c = std::min(lo + step, o.limit);
      if (c <= lo || (run(c).ok && c == o.limit)) break;
    }
    r.hit_limit = !hi;
    while (hi && *hi - lo > 1) run(lo + (*hi - lo) / 2);
  }
  r.below_gap = lo != first ? first : 0;
}
}  // namespace

int64_t LinearMemoryModel::max_batch(int64_t budget, int64_t limit) const {
  if (bytes_per_sample <= 0) return fixed_bytes <= static_cast<double>(budget) ? limit : 0;
  const double b = std::floor((static_cast<double>(budget) - fixed_bytes) / bytes_per_sample);
  return std::clamp<int64_t>(b < 0 ? 0 : static_cast<int64_t>(std::min(b, 9e15)), 0, limit);
}

LinearMemoryModel fit_memory_model(int64_t b1, int64_t peak1, int64_t b2, int64_t peak2) {
  MINIDL_CHECK(b1 != b2, "maxbatch: the two probe batches must differ, got ", b1, " twice");
  LinearMemoryModel m;
  m.bytes_per_sample = static_cast<double>(peak2 - peak1) / static_cast<double>(b2 - b1);
  m.fixed_bytes = static_cast<double>(peak1) - m.bytes_per_sample * static_cast<double>(b1);
  return m;
}

double FinderResult::prediction_error_pct() const {
  return max_batch > 0 ? 100.0 * static_cast<double>(predicted - max_batch) / static_cast<double>(max_batch) : 0.0;
}

double FinderResult::refined_error_pct() const {
  return max_batch > 0 ? 100.0 * static_cast<double>(refined - max_batch) / static_cast<double>(max_batch) : 0.0;
}

FinderResult find_max_batch(const TryBatch& try_batch, const FinderOptions& o) {
  MINIDL_CHECK(o.probe_small >= 1 && o.probe_large > o.probe_small && o.limit >= o.probe_large,
               "maxbatch: probes must satisfy 1 <= small < large <= limit, got ", o.probe_small, ", ", o.probe_large,
               ", limit ", o.limit);
  FinderResult r;
  std::optional<int64_t> hi;  // smallest batch known to fail
  bool step_down = false;     // a prediction failed: the answer is usually a little below it
  int64_t lo = 0;             // largest batch known to survive
  std::map<int64_t, int64_t> survivors;  // batch -> bytes the fit uses
  auto run = [&](int64_t b) {
    MINIDL_CHECK(static_cast<int>(r.trials.size()) < o.max_trials, "maxbatch: no answer after ", o.max_trials,
                 " trials (last tried ", b, ")");
    Trial t = try_batch(b);
    r.trials.emplace_back(b, t);
    if (t.ok) {
      survivors[b] = t.fit_bytes();
      if (b > lo) lo = b, r.at_max = t;
    } else {
      ++r.ooms;
      r.all_recovered = r.all_recovered && t.recovered;
      if (!hi || b < *hi) hi = b;
    }
    return t;
  };
  // The line through the two largest survivors: the local slope just below the answer, which is
  // what decides it when memory is not linear in the batch.
  auto local_model = [&] {
    auto last = survivors.rbegin();
    auto prev = std::next(last);
    return fit_memory_model(prev->first, prev->second, last->first, last->second);
  };

  bool refined = false;
  // Secant steps from prediction c: try it (inside the bracket, and at most doubling the largest
  // survivor unless `uncapped`: a nearly flat line, as recomputation under a budget gives,
  // predicts far too much); every survivor refits the line on the two largest survivors and
  // predicts again, so the fit moves to the batches near the answer, and a right prediction is
  // confirmed by the next batch failing. Returns whether the line's own prediction (not the cap,
  // not lo + 1) failed: the answer is then probably just below it (else bisection is better).
  auto secant = [&](int64_t c, bool uncapped) {
    for (int k = 0; k < kSecantSteps; ++k) {
      int64_t cap = hi ? *hi - 1 : o.limit;
      if (!(uncapped && k == 0)) cap = std::min(cap, 2 * lo);
      const bool capped = c > cap;
      c = std::min(std::max(c, lo + 1), cap);
      if (c <= lo) return false;
      if (!run(c).ok) return c > lo + 1 && !capped;
      const LinearMemoryModel m = local_model();
      c = m.max_batch(o.budget_bytes, o.limit);
      if (!refined) r.refined_model = m, r.refined = std::max(c, lo), refined = true;
    }
    return false;
  };

  const Trial t1 = run(o.probe_small);
  if (t1.ok) {
    const Trial t2 = run(o.probe_large);
    if (t2.ok) {
      r.model = fit_memory_model(o.probe_small, t1.fit_bytes(), o.probe_large, t2.fit_bytes());
      r.predicted = std::max(r.model.max_batch(o.budget_bytes, o.limit), o.probe_large);
      r.refined = r.predicted;
      r.refined_model = r.model;
      step_down = secant(r.predicted, true);
      // The probes' prediction itself failed, by an unknown factor (memory convex in the batch):
      // a survivor half way gives a line nearer the answer to continue from.
      if (hi && !refined && *hi - lo > 2) {
        if (run(lo + (*hi - lo) / 2).ok) {
          const LinearMemoryModel m = local_model();
          r.refined_model = m, r.refined = std::max(m.max_batch(o.budget_bytes, o.limit), lo), refined = true;
          step_down = secant(r.refined, false);
        } else {
          step_down = false;  // bisect
        }
      }
    } else {
      r.predicted = r.refined = o.probe_small;
    }
  }
  if (!hi) {
    // Grow from the largest survivor by doubling steps until a failure (or the limit).
    for (int64_t step = 1;; step *= 2) {
      const int64_t c = std::min(lo + step, o.limit);
      if (c <= lo) {
        r.hit_limit = true;
        break;
      }
      if (!run(c).ok) break;
      if (c == o.limit) {
        r.hit_limit = true;
        break;
      }
    }
  } else if (step_down && *hi - lo > 2) {
    // A failed prediction is usually a little too high: step down from it by doubling steps that
    // start at 2% of it, switching to bisection once a step would cover half the gap.
    for (int64_t step = std::max<int64_t>(1, *hi / 50); *hi - lo > 2 && step <= (*hi - lo) / 2; step *= 2) {
      if (run(*hi - step).ok) break;
    }
  }
  while (hi && *hi - lo > 1) run(lo + (*hi - lo) / 2);
  if (o.look_above > 0) look_above(run, lo, hi, o, r);
  r.max_batch = lo;
  return r;
}

int64_t recommended_batch(int64_t max_batch, double margin) {
  if (max_batch <= 0) return 0;
  return std::max<int64_t>(1, static_cast<int64_t>(std::floor(static_cast<double>(max_batch) * (1.0 - margin))));
}

AccumulationPlan accumulation_for(int64_t effective_batch, int64_t max_micro) {
  MINIDL_CHECK(effective_batch >= 1 && max_micro >= 1, "maxbatch: --effective-batch ", effective_batch,
               " needs a micro-batch of at least 1 (got ", max_micro, ")");
  AccumulationPlan p;
  p.steps = (effective_batch + max_micro - 1) / max_micro;
  p.micro_batch = (effective_batch + p.steps - 1) / p.steps;
  // An exact split keeps the effective batch (and so the tuned learning rate) exactly B: take it
  // when it costs at most 25% more accumulation steps than the fewest.
  for (int64_t k = p.steps; k <= p.steps + p.steps / 4; ++k) {
    if (effective_batch % k == 0) return {effective_batch / k, k};
  }
  return p;
}

std::vector<int64_t> profile_candidates(int64_t max_batch, int64_t recommended) {
  std::vector<int64_t> c;
  for (int64_t b = 1; b < max_batch; b *= 2) c.push_back(b);
  if (recommended > 0) c.push_back(recommended);
  if (max_batch > 0) c.push_back(max_batch);
  std::sort(c.begin(), c.end());
  c.erase(std::unique(c.begin(), c.end()), c.end());
  return c;
}

int pick_profile_batch(const std::vector<ProfileRow>& rows, double time_budget_s) {
  int fastest = -1;
  for (size_t i = 0; i < rows.size(); ++i) {
    if (!rows[i].within_margin) continue;
    if (fastest < 0 || rows[i].images_per_second > rows[static_cast<size_t>(fastest)].images_per_second)
      fastest = static_cast<int>(i);
  }
  if (time_budget_s > 0) {
    int best = -1;
    for (size_t i = 0; i < rows.size(); ++i) {
      if (!rows[i].within_margin || rows[i].run_seconds > time_budget_s) continue;
      if (best < 0 || rows[i].batch < rows[static_cast<size_t>(best)].batch) best = static_cast<int>(i);
    }
    if (best >= 0) return best;
  }
  if (fastest < 0 && !rows.empty()) fastest = 0;
  return fastest;
}

void search_upward(const TryBatch& try_batch, int64_t fits, const Trial& at_fits, int64_t limit, FinderResult& r) {
  const auto tried = [&](int64_t b) {
    const Trial t = try_batch(b);
    r.trials.emplace_back(b, t);
    if (!t.ok) {
      ++r.ooms;
      r.all_recovered = r.all_recovered && t.recovered;
    }
    return t;
  };
  int64_t lo = fits, hi = 0;
  r.at_max = at_fits;
  for (int64_t step = 1; hi == 0 && lo < limit; step *= 2) {
    const int64_t b = std::min(lo + step, limit);
    const Trial t = tried(b);
    if (t.ok) lo = b, r.at_max = t;
    else hi = b;
  }
  while (hi > lo + 1) {
    const int64_t mid = lo + (hi - lo) / 2;
    const Trial t = tried(mid);
    if (t.ok) lo = mid, r.at_max = t;
    else hi = mid;
  }
  r.max_batch = lo;
  r.hit_limit = hi == 0;
}

}  // namespace minidl::train
