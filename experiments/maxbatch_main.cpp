// minidl-maxbatch: the largest micro-batch that survives K full training steps under a memory
// budget, found from a linear memory model and confirmed with few OOM-safe trials; optionally the
// accumulation plan for an effective batch and a speed/memory profile (see docs/experiments.md).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "core/thread_policy.h"
#include "train/config.h"
#include "experiments/harness/gpu_plan.h"
#include "experiments/harness/maxbatch.h"
#include "experiments/harness/ranks.h"
#include "experiments/harness/results.h"
#include "train/run.h"

using namespace minidl::harness;

int main(int argc, char** argv) {
  minidl::apply_thread_policy(argv);   // OpenMP threads wait passively unless the user chose (core/thread_policy.h)
  TrainConfig c;
  MaxBatchOptions o;
  std::string time_budget = "0";
  CLI::App app{"minidl-maxbatch: find the largest batch that fits a memory budget, and the one to use"};
  add_config_flag(app);
  add_train_flags(app, c);
  app.get_option("--out")->description("folder for maxbatch.json; empty: print only");
  app.add_option("--steps", o.steps,
                 "full training steps (forward, backward, optimizer) per trial; at least two where an epoch "
                 "has two, as the run's second step starts where its first left the memory");
  app.add_option("--margin", o.margin, "safety margin: recommended batch = max x (1 - margin)");
  app.add_option("--effective-batch", o.effective_batch,
                 "also print the accumulation steps that keep this effective batch; 0: off");
  app.add_flag("--profile", o.profile,
               "measure images/s and memory for batches up to the maximum and recommend one; off by default");
  app.add_option("--time-budget", time_budget, "--profile: the smallest batch whose whole run fits (90s, 15m, 2h); 0: off");
  app.add_option("--dataset-size", o.dataset_size, "--profile: images per epoch; 0: the --split's training images");
  app.add_option("--probe-small", o.probe_small, "the smaller probe batch of the memory model");
  app.add_option("--probe-large", o.probe_large, "the larger probe batch of the memory model");
  app.add_option("--limit", o.limit, "never try a batch above this");
  app.add_flag("--confirm-next", o.confirm_next,
               "also try the dry run's answer + 1 on the device, so the answer is checked both ways (when it fits, "
               "the search goes on upward on real trials); off by default");
  app.add_option("--gpu", c.gpu,
                 "plan for this GPU from any machine, with the dry run alone (no step runs): h100, h200, a100-80gb, "
                 "a100-40gb, l4, rtx-2080ti, rtx-4090, or its memory (24GiB); needs --device cuda; the budget is "
                 "--memory-budget or the GPU's memory less its CUDA context; empty: the device itself");
  if (const int rc = parse_command_line(app, argc, argv, "minidl-maxbatch"); rc >= 0) return rc;
  // Under mpirun -np N: the per-device maximum, every trial agreed across the ranks; rank 0 reports.
  return run_program("minidl-maxbatch", c.verbose, [&](const Ranks& ranks) {
    c.world_size = ranks.world_size;
    c.device = rank_device(c.device, ranks);
    o.time_budget_s = parse_duration(time_budget);
    const MaxBatchReport rep = run_maxbatch(c, o, ranks.lead());
    if (!c.out.empty() && ranks.lead()) {
      nlohmann::json j = provenance(c.gpu.empty() ? device_description(resolve_device(c.device)) : plan_assumptions(c));
      j["program"] = "minidl-maxbatch";
      j["config"] = to_json(c);
      j["result"] = rep.json;
      write_file_atomic(std::filesystem::path(c.out) / "maxbatch.json", j.dump(2) + "\n");
      std::printf("wrote %s\n", (std::filesystem::path(c.out) / "maxbatch.json").c_str());
    }
    return 0;
  });
}
