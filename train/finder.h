// The maximum-batch finder of minidl-maxbatch: predict the largest micro-batch that fits the
// memory budget from a linear model (fixed bytes + bytes per sample) fitted on two small probe
// batches, try it and refit on the survivors nearest the answer (memory is rarely linear over the
// whole range), then confirm with few trials (grow or step down, then bisect), each of which may
// fail with an OOM that the trial runner recovers from. The search only sees a try_batch callback, so it is tested
// with a fake memory model and runs unchanged on the CPU budget or a GPU.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace minidl::train {

struct Trial {
  bool ok = false;               // K full steps ran without an OOM
  int64_t peak_allocated = 0;    // bytes, over the K steps (up to the OOM when !ok)
  int64_t peak_reserved = 0;
  // The peak of the forward + backward phase alone, in the bytes the batch needs (reserved on a GPU,
  // live blocks on the CPU, whose allocator releases its cache before failing; 0: not measured, use
  // peak_reserved). It grows
  // linearly with the batch; the optimizer step's own peak (weights + gradients + state +
  // update temporaries) does not, and dominates small batches, so the fit uses this one.
  int64_t activation_phase_reserved = 0;
  double step_seconds = 0.0;     // mean time of `batch` images' step (after the first), when ok
  int64_t fit_bytes() const { return activation_phase_reserved > 0 ? activation_phase_reserved : peak_reserved; }
  bool recovered = true;         // after an OOM, allocated memory returned to its level before the trial
  // CUDA graphs (a CUDA device, unless --no-cuda-graphs): whether the trial's steps replayed a
  // captured graph; false when its capture ran out of memory and its steps fell back to eager ones,
  // or when eager work beside the graphs did not fit and dropped them (graphs_dropped).
  bool graphed = false;
  bool graphs_dropped = false;
  // With accumulation: the run's epoch at this batch holds fewer micro-batches than a window, so no
  // window is captured or replayed, in the trial as in the run (every step eager).
  bool windowless = false;
};
using TryBatch = std::function<Trial(int64_t batch)>;

struct LinearMemoryModel {
  double fixed_bytes = 0.0;
  double bytes_per_sample = 0.0;
  double predict(int64_t batch) const { return fixed_bytes + bytes_per_sample * static_cast<double>(batch); }
  // The largest batch whose prediction fits `budget` (0 when none; `limit` when per-sample is 0).
  int64_t max_batch(int64_t budget, int64_t limit) const;
};
// The line through two (batch, peak bytes) measurements.
LinearMemoryModel fit_memory_model(int64_t b1, int64_t peak1, int64_t b2, int64_t peak2);

struct FinderOptions {
  int64_t budget_bytes = 0;      // the cap on reserved bytes the prediction aims at
  int64_t probe_small = 2;
  int64_t probe_large = 8;
  int64_t limit = 1 << 16;       // never try more than this
  int max_trials = 40;
  // Where what fits is not monotonic in the batch (--checkpoint optimal solves a plan per batch),
  // a batch above the first failure may fit again: after the search, the batches answer + 2 ..
  // answer + look_above, then steps of an eighth of the answer up to twice it, are tried; from the
  // first that fits the search grows and bisects again, until none above fits. 0: the first
  // failure ends the search.
  int64_t look_above = 0;
};

struct FinderResult {
  LinearMemoryModel model;
  int64_t predicted = 0;          // from the model fitted on the two probes
  // The second fit, after the first trial: the line through the two largest survivors (the
  // prediction and the larger probe when the prediction survived; else the probes' line again).
  LinearMemoryModel refined_model;
  int64_t refined = 0;            // its prediction, tried next
  int64_t max_batch = 0;          // confirmed: survives; max_batch + 1 failed (unless hit_limit)
  bool hit_limit = false;
  Trial at_max;                   // the trial of max_batch
  std::vector<std::pair<int64_t, Trial>> trials;  // in the order run
  int ooms = 0;
  bool all_recovered = true;
  // look_above: the answer before a batch above it fitted (0 when none did, or when not looking).
  int64_t below_gap = 0;
  // The dry run (minidl-maxbatch): the search above on the shape-only device, then one real trial
  // at its answer. Filled by run_maxbatch; trials/ooms above are then the real trials alone.
  int64_t dry_max_batch = 0;
  int dry_trials = 0;
  double dry_seconds = 0.0;       // wall time of the whole dry search
  Trial dry_at_max;               // the dry trial at dry_max_batch
  bool confirmed = false;         // the real trial at dry_max_batch fitted
  // MaxBatchOptions::confirm_next: a real trial at the answer + 1 ran and ran out of memory (when
  // it fitted instead, the search went on upward on real trials, and confirmed is false).
  bool next_tried = false, next_failed = false;
  double prediction_error_pct() const;  // (predicted - max) / max x 100, of the probes' prediction
  double refined_error_pct() const;     // the same for the second fit's prediction
};

FinderResult find_max_batch(const TryBatch& try_batch, const FinderOptions& o);

// Upward from a batch known to fit (`fits`, whose trial is `at_fits`): steps of 1, 2, 4, ... to
// the first batch that fails (or to `limit`), then halving between the last fit and it. Appends
// its trials to r.trials (counting OOMs and recoveries) and sets r.max_batch, r.at_max and
// r.hit_limit. minidl-maxbatch uses it when the real trial at the dry run's answer + 1 fits.
void search_upward(const TryBatch& try_batch, int64_t fits, const Trial& at_fits, int64_t limit, FinderResult& r);

// floor(max x (1 - margin)), at least 1 (0 when max is 0).
int64_t recommended_batch(int64_t max_batch, double margin);

// Keeping an effective batch B with micro-batches of at most `max_micro`: the fewest accumulation
// steps k0 = ceil(B / max_micro); among k0 .. 1.25 k0 the first k that divides B gives exactly
// B = micro x k; when none does, k0 steps of ceil(B / k0) (<= max_micro, micro x k0 >= B).
struct AccumulationPlan {
  int64_t micro_batch = 0;
  int64_t steps = 0;
  int64_t effective() const { return micro_batch * steps; }
};
AccumulationPlan accumulation_for(int64_t effective_batch, int64_t max_micro);

// --profile: per candidate batch, throughput and the run-time estimates, and the recommendation.
struct ProfileRow {
  int64_t batch = 0;
  double images_per_second = 0.0;
  int64_t peak_allocated = 0;
  int64_t peak_reserved = 0;
  double epoch_seconds = 0.0;
  double run_seconds = 0.0;
  bool within_margin = false;    // batch <= the recommended batch
};
// Candidates: powers of two below max_batch, the recommended batch and max_batch.
std::vector<int64_t> profile_candidates(int64_t max_batch, int64_t recommended);
// The recommendation: with time_budget_s > 0, the smallest batch within the margin whose run
// fits the budget (the fastest one within the margin when none does); otherwise the fastest
// within the margin. Returns an index into rows (-1 when rows is empty).
int pick_profile_batch(const std::vector<ProfileRow>& rows, double time_budget_s);

}  // namespace minidl::train
