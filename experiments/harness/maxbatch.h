// minidl-maxbatch as a library call (the techniques study runs it once per row): the finder on a
// StepRunner, the recommended batch, the accumulation plan for an effective batch, and --profile.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/config.h"
#include "train/finder.h"

namespace minidl::harness {

using namespace ::minidl::train;   // the trainer library (train/), which the programs are built on

struct MaxBatchOptions {
  int steps = 3;                 // K full training steps per trial
  double margin = 0.10;          // recommended = max x (1 - margin)
  int64_t effective_batch = 0;   // > 0: print the accumulation that keeps it
  bool profile = false;
  double time_budget_s = 0.0;    // --profile: smallest batch whose run fits this
  int64_t dataset_size = 0;      // images per epoch for the time estimates; 0: from --split
  int64_t probe_small = 2;
  int64_t probe_large = 8;
  int64_t limit = 1 << 16;
  // Also try the dry run's answer + 1 on the device, so the answer is checked both ways (the
  // techniques study's "dry run = trial" column); when it fits, the search goes on upward.
  bool confirm_next = false;
};

struct MaxBatchReport {
  FinderResult finder;
  int64_t budget_bytes = 0;
  int64_t recommended = 0;
  AccumulationPlan accumulation;  // when effective_batch > 0
  std::vector<ProfileRow> profile;
  int chosen = -1;                // index into profile
  std::string text;               // the printable report
  nlohmann::json json;
};

// Throws UsageError for bad input (no --memory-budget, a budget below the model's size...).
MaxBatchReport run_maxbatch(const TrainConfig& c, const MaxBatchOptions& o, bool verbose);

// "90", "90s", "15m", "2h" -> seconds; throws UsageError.
double parse_duration(const std::string& s);

}  // namespace minidl::harness
