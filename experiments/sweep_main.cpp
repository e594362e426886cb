// minidl-sweep: a grid of runs or one of the predefined batch-size studies, resumable, with a
// results table, a JSON record, a Markdown summary and a plot (see docs/experiments.md).
#include <CLI/CLI.hpp>
#include <cstdio>

#include "core/thread_policy.h"
#include "train/config.h"
#include "experiments/harness/ranks.h"
#include "experiments/harness/sweep.h"
#include "train/run.h"

using namespace minidl::harness;

namespace {

// The runs of a study on `world` ranks: with `split`, a run's batch is its effective batch and each
// rank trains batch / world (the batch must divide; a --batch-schedule of absolute batches cannot
// be split); the summary shows world size, per-device and effective batch instead of the batch.
void distribute(Study& st, int world, bool split) {
  for (SweepRun& run : st.runs) {
    TrainConfig& c = run.config;
    if (split && !run.find_max_batch) {   // a searched batch is per device already
      if (c.batch_size % world != 0)
        throw UsageError("--rank-batch split: run " + run.id + "'s batch " + std::to_string(c.batch_size) +
                         " does not divide into " + std::to_string(world) + " ranks; use another -np or "
                         "--rank-batch each");
      if (!c.batch_schedule.empty() && c.batch_schedule[0] != 'x')
        throw UsageError("--rank-batch split: run " + run.id + "'s --batch-schedule " + c.batch_schedule +
                         " names absolute batches; use the xF@ form or --rank-batch each");
      c.batch_size /= world;
    }
    c.world_size = world;
  }
  std::vector<std::string> cols;
  for (const std::string& col : st.summary_columns) {
    if (col == "batch_size") {
      for (const char* k : {"world_size", "per_device_batch", "effective_batch"}) cols.push_back(k);
    } else {
      cols.push_back(col);
    }
  }
  st.summary_columns = cols;
}

}  // namespace

int main(int argc, char** argv) {
  minidl::apply_thread_policy(argv);   // OpenMP threads wait passively unless the user chose (core/thread_policy.h)
  TrainConfig base;
  std::string study_name, batches, optimizers, augments, checkpoints, only, rank_batch = "split";
  bool quick = false, process_per_run = false, list = false, retry_failed = false;
  CLI::App app{"minidl-sweep: run a grid of training runs or a predefined batch-size study, resumably"};
  add_config_flag(app);
  base.out = "results";
  add_train_flags(app, base);
  app.get_option("--out")->description("root folder of the study folders (<out>/<study>[-quick-cpu|-quick-cuda][-Nranks]/ "
                                       "with results.csv, results.json, summary.md and the plots)");
  app.add_option("--study", study_name,
                 "keras-batch, utilization, techniques, lr-scaling, batch-schedule (published settings) or "
                 "conv-bn-chain (--conv-bn-chain against batch norm); empty: a grid over the lists below");
  app.add_flag("--quick", quick,
               "scale the study down (small images, few steps, small model): minutes on 2 CPU cores; off by default");
  app.add_option("--batch-sizes", batches, "grid: comma-separated batch sizes; empty: --batch-size");
  app.add_option("--optimizers", optimizers, "grid: e.g. sgd,adam; empty: --optimizer");
  app.add_option("--augments", augments, "grid: e.g. none,keras; empty: --augment");
  app.add_option("--checkpoints", checkpoints, "grid: e.g. none,stages; empty: --checkpoint");
  app.add_option("--rank-batch", rank_batch,
                 "under mpirun -np N: split (each run's batch is the effective batch: every rank trains batch / N, "
                 "so the study compares with its 1-process run) or each (every rank trains the batch: N x larger)");
  app.add_flag("--process-per-run", process_per_run, "run each configuration in its own process; off by default");
  app.add_flag("--list", list, "print the runs (id, group) and whether they are done, then exit; off by default");
  app.add_option("--only", only, "run only this run id (what --process-per-run children get)");
  app.add_flag("--retry-failed", retry_failed,
               "run again the runs whose row says error or crashed, or oom at the batch its maximum-batch search "
               "recommended (max_batch set), replacing those rows (the others stay as they are); off by default");
  if (const int rc = parse_command_line(app, argc, argv, "minidl-sweep"); rc >= 0) return rc;
  // Under mpirun -np N every rank trains every run (each on its shard); rank 0 prints and writes.
  return run_program("minidl-sweep", base.verbose, [&](const Ranks& ranks) {
    base.device = rank_device(base.device, ranks);
    validate(base);
    if (rank_batch != "split" && rank_batch != "each")
      throw UsageError("--rank-batch '" + rank_batch + "': expected split or each");
    Study st;
    if (!study_name.empty()) {
      if (!batches.empty() || !optimizers.empty() || !augments.empty() || !checkpoints.empty())
        throw UsageError("--batch-sizes/--optimizers/--augments/--checkpoints make a grid; they do not apply to "
                         "--study " + study_name);
      st = make_study(study_name, quick, base);
    } else {
      if (quick) throw UsageError("--quick applies to --study");
      st = make_grid(base, batches.empty() ? std::vector<int64_t>{} : parse_int_list("--batch-sizes", batches),
                     parse_word_list(optimizers), parse_word_list(augments), parse_word_list(checkpoints));
    }
    if (ranks.world_size > 1) distribute(st, ranks.world_size, rank_batch == "split");
    for (const auto& run : st.runs) {
      if (!run.unavailable.empty()) continue;
      TrainConfig c = run.config;
      c.memory_budget.clear();  // validated below with the study's own budget when it has one
      validate(c);
    }
    const std::string root = base.out.empty() ? "." : base.out;
    const std::string dev = resolve_device(base.device).is_cuda() ? "cuda" : "cpu";
    SweepOptions o;
    // N ranks: a folder of their own (keras-batch-quick-cpu-2ranks), beside the 1-process one.
    o.out = std::filesystem::path(root) /
            (study_folder(st, dev) + (ranks.world_size > 1 ? "-" + std::to_string(ranks.world_size) + "ranks" : ""));
    o.process_per_run = process_per_run;
    o.only = only;
    o.retry_failed = retry_failed;
    o.verbose = !base.quiet && ranks.lead();
    for (int i = 0; i < argc; ++i) o.argv.emplace_back(argv[i]);
    if (list) {
      if (!ranks.lead()) return 0;
      const CsvTable t = read_csv(o.out / "results.csv");
      for (const auto& run : st.runs) {
        bool done = false;
        for (size_t i = 0; i < t.rows.size(); ++i) done = done || t.get(i, "run_id") == run.id;
        std::printf("%-28s %-34s %s\n", run.id.c_str(), run.group.c_str(),
                    done ? "done" : (run.unavailable.empty() ? "to do" : "unavailable"));
      }
      return 0;
    }
    install_sigint_handler();
    const SweepOutcome out = run_sweep(st, o);
    if (!only.empty() || !ranks.lead()) return out.interrupted ? 130 : 0;
    std::printf("minidl-sweep: %s: %d runs done now%s, %d already done%s\n", st.name.c_str(), out.ran,
                out.retried > 0 ? (" (" + std::to_string(out.retried) + " of them retried)").c_str() : "",
                out.done_before, out.interrupted ? "; interrupted (rerun the same command to resume)" : "");
    std::printf("table:   %s\nsummary: %s\njson:    %s\n", (o.out / "results.csv").c_str(),
                (o.out / "summary.md").c_str(), (o.out / "results.json").c_str());
    if (st.extra_outputs)
      std::printf("plots:   %s (summary.md says which were drawn)\n", (o.out / (st.name + "-*.png")).c_str());
    else if (out.plot_note.empty()) std::printf("plot:    %s\n", (o.out / (st.name + ".png")).c_str());
    else std::printf("plot:    none (%s)\n", out.plot_note.c_str());
    return out.interrupted ? 130 : 0;
  });
}
