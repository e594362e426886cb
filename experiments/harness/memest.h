// minidl-memest: "will batch N fit?" without spending a run. Each batch size is dry-run on the
// shape-only device standing for the configured one (docs/memory.md): the same training step, with
// the same model, optimizer, AMP, recomputation and accumulation, through a model of the device's
// allocator, which gives its peak allocated and peak reserved bytes exactly. One real step per
// batch then measures the same peaks, side by side, unless the dry run says the batch exceeds
// --memory-budget: such a batch is marked and not run.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "train/config.h"
#include "train/finder.h"

namespace minidl::harness {

using namespace ::minidl::train;   // the trainer library (train/), which the programs are built on

struct MemestRow {
  int64_t batch = 0;
  Trial estimate;              // the dry run (ok false: it ran out of the budget)
  bool measured = false;       // a real step ran (not when over the budget, or --no-measure)
  Trial measurement;
  bool over_budget() const { return !estimate.ok; }
  double error_pct() const;           // peak allocated: (estimate - measured) / measured x 100
  double reserved_error_pct() const;  // the same for peak reserved
};

struct MemestReport {
  std::string title;               // model, image size, optimizer, AMP, recomputation, budget
  std::string device;              // the measured device, and the dry run's
  int64_t baseline_bytes = 0;      // weights + optimizer state (+ the cuBLAS workspace), dry run
  std::string footprint;           // what the run holds beside its steps (RunFootprint::describe)
  std::vector<MemestRow> rows;
  bool graphs = false;             // the steps replay CUDA graphs where they fit (TrainConfig::resolved_cuda_graphs)
};

// Dry-runs every batch, then measures the ones within the budget (all of them without a budget)
// when `measure`. With --checkpoint optimal both solve the plan the run solves at each batch
// (modelled link times, train::optimal_recompute_limit), so the measured step runs the plan the
// dry run estimated.
// With CUDA graphs, which batches' steps replay a graph and which fell back to eager steps (their
// capture did not fit): empty without graphs.
std::string memest_graphs_note(const MemestReport& rep);
MemestReport run_memest(const TrainConfig& c, const std::vector<int64_t>& batches, bool measure = true);

std::string memest_table(const MemestReport& r);
// memest.md: the title, device, commit and date, then the table.
std::string memest_markdown(const MemestReport& r, const std::string& commit, const std::string& date);

}  // namespace minidl::harness
