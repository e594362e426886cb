// minidl-train: one training run with every knob as a flag (see docs/experiments.md). A thin main:
// parsing, then harness::run_training, then the summary, metrics.csv and results.json.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <limits>

#include "core/thread_policy.h"
#include "train/config.h"
#include "experiments/harness/ranks.h"
#include "experiments/harness/results.h"
#include "train/run.h"

using namespace minidl::harness;

int main(int argc, char** argv) {
  minidl::apply_thread_policy(argv);   // OpenMP threads wait passively unless the user chose (core/thread_policy.h)
  TrainConfig c;
  CLI::App app{"minidl-train: train one model and report loss, accuracy, speed and memory per epoch"};
  add_config_flag(app);
  add_train_flags(app, c);
  if (const int rc = parse_command_line(app, argc, argv, "minidl-train"); rc >= 0) return rc;
  // Under mpirun -np N every rank trains on its shard (docs/distributed.md); rank 0 prints and writes.
  return run_program("minidl-train", c.verbose, [&](const Ranks& ranks) {
    c.world_size = ranks.world_size;
    c.device = rank_device(c.device, ranks);
    if (c.summary) {
      if (ranks.lead()) std::printf("%s", model_summary(c).c_str());
      return 0;
    }
    install_sigint_handler();
    // A busy CPU slows training whatever the program does; the line says how the threads wait.
    if (ranks.lead() && !c.quiet && c.device == "cpu")
      if (const std::string note = minidl::cpu_load_note(); !note.empty()) std::printf("minidl-train: %s\n", note.c_str());
    if (ranks.lead()) {   // before training, not after: a read-only or full --out is found now
      if (!c.out.empty()) check_writable("--out", std::filesystem::path(c.out) / "results.json");
      if (!c.save_weights.empty()) check_writable("--save-weights", c.save_weights);
      if (!c.save_initial_weights.empty()) check_writable("--save-initial-weights", c.save_initial_weights);
    }
    const RunResult r = run_training(c);
    const int status = r.status == "ok" ? 0 : (r.status == "interrupted" ? 130 : 1);
    if (!ranks.lead()) return status;
    // Folder data: how many files were left out, always (a run of unreadable files must not look clean).
    const std::string skipped = c.data == "synthetic" ? "" : "; " + std::to_string(r.skipped_files) +
                                " unreadable file" + (r.skipped_files == 1 ? "" : "s") + " skipped";
    // No epoch trained in this session (a resumed run that had already finished): nothing measured.
    const double nan = std::numeric_limits<double>::quiet_NaN();
    const bool trained = !r.epochs.empty();
    // Accuracies within two standard errors of 50% say so, as the studies' summaries do.
    const auto chance = [](double acc, int64_t n) { return at_chance(acc, n) ? ", chance" : ""; };
    std::printf("%s: %s%s%s; %lld steps, best val acc %s (epoch %s%s), test acc %s%s, %s img/s, "
                "peak allocated %s, %.1f s%s\n",
                c.model.c_str(), r.status.c_str(), r.note.empty() ? "" : " (", r.note.empty() ? "" : (r.note + ")").c_str(),
                static_cast<long long>(r.steps), value_or_dash(r.best_val_acc, 2, 100.0, "%").c_str(),
                r.best_epoch > 0 ? std::to_string(r.best_epoch).c_str() : "-", chance(r.best_val_acc, r.val_images),
                value_or_dash(r.test_acc, 2, 100.0, "%").c_str(), at_chance(r.test_acc, r.test_images) ? " (chance)" : "",
                value_or_dash(trained ? r.mean_images_per_second() : nan, 1).c_str(),
                trained ? minidl::format_bytes(static_cast<size_t>(r.peak_allocated)).c_str() : "-",
                r.total_seconds, skipped.c_str());
    if (!c.out.empty()) {
      const std::filesystem::path out(c.out);
      // A resumed run continues the earlier session's table instead of replacing it.
      write_file_atomic(out / "metrics.csv", c.resume.empty() ? epochs_csv(r.epochs)
                                                              : resumed_epochs_csv(out / "metrics.csv", r.epochs,
                                                                                   r.first_epoch));
      nlohmann::json j = provenance(r.device_name);
      j["program"] = "minidl-train";
      j["config"] = to_json(c);
      j["result"] = to_json(r);
      write_file_atomic(out / "results.json", j.dump(2) + "\n");
      std::printf("wrote %s and %s\n", (out / "metrics.csv").c_str(), (out / "results.json").c_str());
    }
    if (r.skipped_files > 0)
      std::printf("minidl-train: %lld unreadable file%s skipped (named above by 'minidl data: skipping'; "
                  "--validate-data lists them all before training)\n",
                  static_cast<long long>(r.skipped_files), r.skipped_files == 1 ? " was" : "s were");
    return status;
  });
}
