// minidl-memest: the dry-run estimate of training memory per batch size, beside the peak a real
// step measures (see docs/experiments.md).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "core/thread_policy.h"
#include "train/config.h"
#include "experiments/harness/memest.h"
#include "experiments/harness/results.h"
#include "train/run.h"

using namespace minidl::harness;

int main(int argc, char** argv) {
  minidl::apply_thread_policy(argv);   // OpenMP threads wait passively unless the user chose (core/thread_policy.h)
  TrainConfig c;
  std::string batches = "1,4,16,64";
  bool no_measure = false;
  CLI::App app{"minidl-memest: peak memory per batch size from a dry run on the shape-only device, beside the "
               "peak a real training step measures"};
  add_config_flag(app);
  add_train_flags(app, c);
  app.get_option("--out")->description("folder for memest.json and memest.md; empty: print only");
  app.add_option("--batch-sizes", batches, "comma-separated batch sizes to estimate and measure");
  app.add_flag("--no-measure", no_measure, "dry runs only: no real step (the estimate column alone)");
  app.add_option("--gpu", c.gpu,
                 "plan for this GPU from any machine, with the dry run alone (no step runs): h100, h200, a100-80gb, "
                 "a100-40gb, l4, rtx-2080ti, rtx-4090, or its memory (24GiB); needs --device cuda; the budget is "
                 "--memory-budget or the GPU's memory less its CUDA context; empty: the device itself");
  if (const int rc = parse_command_line(app, argc, argv, "minidl-memest"); rc >= 0) return rc;
  try {
    const auto bs = parse_int_list("--batch-sizes", batches);
    const MemestReport rep = run_memest(c, bs, !no_measure);
    const std::string table = memest_table(rep);
    std::printf("minidl-memest: %s\n%s\nweights + optimizer state: %.1f MiB\nalso held, as in the run: %s\n\n%s",
                rep.title.c_str(), rep.device.c_str(), static_cast<double>(rep.baseline_bytes) / (1 << 20),
                rep.footprint.c_str(), table.c_str());
    std::printf("%s", memest_graphs_note(rep).c_str());
    for (const auto& r : rep.rows) {
      if (r.over_budget())
        std::printf("batch %lld exceeds --memory-budget %s in the dry run: not run\n", static_cast<long long>(r.batch),
                    c.memory_budget.c_str());
    }
    if (!c.out.empty()) {
      nlohmann::json j = provenance(rep.device);
      j["program"] = "minidl-memest";
      j["config"] = to_json(c);
      j["title"] = rep.title;
      j["baseline_bytes"] = rep.baseline_bytes;
      j["also_held"] = rep.footprint;
      nlohmann::json arr = nlohmann::json::array();
      for (const auto& r : rep.rows) {
        nlohmann::json row = {{"batch", r.batch},
                              {"over_budget", r.over_budget()},
                              {"estimated_peak_allocated", r.estimate.peak_allocated},
                              {"estimated_peak_reserved", r.estimate.peak_reserved},
                              {"dry_run_seconds", r.estimate.step_seconds},
                              {"estimated_graphed", r.estimate.graphed},
                              {"measured", r.measured}};
        if (r.measured) {
          row["measured_peak_allocated"] = r.measurement.peak_allocated;
          row["measured_peak_reserved"] = r.measurement.peak_reserved;
          row["measured_step_seconds"] = r.measurement.step_seconds;
          row["error_pct"] = r.error_pct();
          row["reserved_error_pct"] = r.reserved_error_pct();
        }
        arr.push_back(row);
      }
      j["rows"] = arr;
      const std::filesystem::path out(c.out);
      write_file_atomic(out / "memest.json", j.dump(2) + "\n");
      write_file_atomic(out / "memest.md", memest_markdown(rep, j["commit"], j["date"]));
      std::printf("wrote %s and %s\n", (out / "memest.json").c_str(), (out / "memest.md").c_str());
    }
    return 0;
  } catch (const UsageError& e) {
    std::fprintf(stderr, "minidl-memest: error: %s\n", user_message(e, c.verbose).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "minidl-memest: error: %s\n", user_message(e, c.verbose).c_str());
    return 1;
  }
}
