// The dry-run memory estimate and its measurement (see memest.h).
#include "experiments/harness/memest.h"

#include <chrono>
#include <cstdio>

#include "core/allocator.h"
#include "experiments/harness/gpu_plan.h"
#include "experiments/harness/results.h"
#include "experiments/harness/step_runner.h"
#include "train/run.h"

namespace minidl::harness {
namespace {

double pct(int64_t estimate, int64_t measured) {
  return measured > 0 ? 100.0 * static_cast<double>(estimate - measured) / static_cast<double>(measured) : 0.0;
}

std::string mib(int64_t b) { return fmt(static_cast<double>(b) / (1024.0 * 1024.0), 1); }

}  // namespace

double MemestRow::error_pct() const { return pct(estimate.peak_allocated, measurement.peak_allocated); }
double MemestRow::reserved_error_pct() const { return pct(estimate.peak_reserved, measurement.peak_reserved); }

MemestReport run_memest(const TrainConfig& c, const std::vector<int64_t>& batches, bool measure) {
  validate(c);
  const bool plan = !c.gpu.empty();   // --gpu: the dry run alone, for a GPU this machine need not have
  const int64_t budget = plan                     ? plan_budget(c)
                         : c.memory_budget.empty() ? 0
                                                   : static_cast<int64_t>(parse_bytes(c.memory_budget));
  MemestReport rep;
  // Two steps in either mode, as minidl-maxbatch makes at least (its trials make two anyway where an
  // epoch holds two windows): with CUDA graphs the eager step at the batch, then the capture and a
  // replay. The same count in both modes lets rows with and without graphs be compared.
  const int steps = 2;
  rep.device = (plan ? plan_assumptions(c) : device_description(resolve_device(c.device))) + "; dry run on " +
               dry_run_device(c).str();
  {
    StepRunner dry(c, budget, dry_run_device(c));
    rep.title = c.model + " at " + std::to_string(dry.model().image_size) + " px, " + c.optimizer +
                (c.amp ? (c.amp_dtype == "bf16" ? ", AMP bf16" : ", AMP") : ", FP32") + ", checkpoint " + c.checkpoint + ", accumulation " +
                std::to_string(c.accumulation_steps) +
                (budget > 0 ? ", budget " + format_bytes(static_cast<size_t>(budget)) : ", no budget") +
                (c.expandable_segments ? ", expandable segments" : "");
    rep.baseline_bytes = dry.baseline_allocated();
    rep.graphs = c.resolved_cuda_graphs();
    rep.footprint = dry.footprint().describe();
    for (int64_t b : batches) {
      MemestRow r;
      r.batch = b;
      r.estimate = dry.run(b, steps);
      rep.rows.push_back(r);
    }
  }
  if (!measure || plan) return rep;
  StepRunner runner(c, budget);
  for (MemestRow& r : rep.rows) {
    if (r.over_budget()) continue;
    r.measurement = runner.run(r.batch, steps);
    r.measured = true;
  }
  return rep;
}

std::string memest_graphs_note(const MemestReport& rep) {
  if (!rep.graphs) return "";
  // Batches whose capture does not fit, whose graphs go mid-run, and whose epoch has no full window.
  std::string eager, dropped, windowless;
  for (const auto& r : rep.rows) {
    if (r.over_budget() || r.estimate.graphed) continue;
    std::string& list = r.estimate.windowless ? windowless : r.estimate.graphs_dropped ? dropped : eager;
    list += (list.empty() ? "" : ", ") + std::to_string(r.batch);
  }
  if (eager.empty() && dropped.empty() && windowless.empty())
    return "\nEvery batch's steps replay a CUDA graph: its private pool is in the peaks.\n";
  std::string out = "\nSteps replay a CUDA graph (its private pool is in the peaks) except";
  if (!eager.empty())
    out += " at batch " + eager + ", whose capture does not fit: those steps run eagerly, as the run's would, and "
           "their peaks include the failed capture's";
  if (!dropped.empty())
    out += std::string(eager.empty() ? "" : ";") + " at batch " + dropped + ", where eager work beside the graphs (an "
           "evaluation batch, the epoch's partial batch, a batch's inputs) does not fit: the graphs go there and the "
           "steps after it run eagerly, as the run's would";
  if (!windowless.empty())
    out += std::string(eager.empty() && dropped.empty() ? "" : ";") + " at batch " + windowless + ", whose epoch " +
           "holds fewer micro-batches than a window: its one step is a trailing window, eager, as the run's would be";
  return out + ".\n";
}

std::string memest_table(const MemestReport& rep) {
  std::vector<Row> out;
  for (const auto& r : rep.rows) {
    if (r.over_budget()) {
      out.push_back({std::to_string(r.batch), "over the budget", "-", "-", "-", "-", "-",
                     fmt(1e3 * r.estimate.step_seconds, 1), "not run"});
      continue;
    }
    const bool m = r.measured;
    out.push_back({std::to_string(r.batch), mib(r.estimate.peak_allocated),
                   m ? mib(r.measurement.peak_allocated) : "-", m ? fmt(r.error_pct(), 2) : "-",
                   mib(r.estimate.peak_reserved), m ? mib(r.measurement.peak_reserved) : "-",
                   m ? fmt(r.reserved_error_pct(), 2) : "-", fmt(1e3 * r.estimate.step_seconds, 1),
                   m ? fmt(1e3 * r.measurement.step_seconds, 1) : "not run"});
  }
  return markdown_table({"batch", "estimated peak allocated MiB", "measured peak allocated MiB", "error %",
                         "estimated peak reserved MiB", "measured peak reserved MiB", "error %", "dry step ms",
                         "measured step ms"},
                        out);
}

std::string memest_markdown(const MemestReport& r, const std::string& commit, const std::string& date) {
  return "# minidl-memest: " + r.title + "\n\n" + "- device: " + r.device + "\n- commit: " + commit +
         "\n- date: " + date + "\n- weights + optimizer state (dry run): " + mib(r.baseline_bytes) +
         " MiB\n- also held, as in the run: " + r.footprint +
         "\n\nEstimated: a dry run on the shape-only device of one training step and the run's evaluation pass, "
         "beside the data the run holds (docs/memory.md). Measured: the same, run for real. A batch over the "
         "budget is not run.\n\n" +
         memest_table(r) + memest_graphs_note(r);
}

}  // namespace minidl::harness
