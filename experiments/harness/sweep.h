// minidl-sweep: a grid of runs (batch sizes x optimizers x augmentation x techniques) or one of
// the predefined studies, executed in one process or one process per run, each finished run
// appended atomically to results/<study>/results.csv (and runs.jsonl), so a rerun skips what is
// done and a killed sweep loses at most the run in progress. Then results.json, summary.md, plot.
#pragma once
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "train/config.h"
#include "experiments/harness/maxbatch.h"
#include "experiments/harness/results.h"

namespace minidl::harness {

using namespace ::minidl::train;   // the trainer library (train/), which the programs are built on

struct SweepRun {
  std::string id;              // stable across reruns: the resume key
  std::string group;           // the plot series ("sgd, augment none")
  std::string technique;       // the techniques study's row name ("" elsewhere)
  TrainConfig config;
  bool find_max_batch = false; // run minidl-maxbatch first and train at its maximum micro-batch
  bool throughput_only = false;  // utilization: measure speed and memory, no evaluation
  std::string unavailable;     // non-empty: recorded as skipped with this reason
};

// A published value to put beside ours: the study's `group` at effective batch `batch`.
struct PublishedPoint {
  std::string group;
  int64_t batch = 0;
  double value = 0;
};

struct Study {
  std::string name;
  std::string title;
  bool quick = false;
  std::string variant;                      // "amp" / "amp-bf16": the utilization study under --amp (its own folder)
  std::vector<SweepRun> runs;
  MaxBatchOptions maxbatch;                 // for find_max_batch runs
  std::string plot_y = "test_acc";          // a results.csv column
  std::string plot_ylabel = "test accuracy";
  std::vector<std::string> summary_columns; // results.csv columns shown in summary.md
  std::string notes;                        // what the published study found, for summary.md
  std::string published_setup;              // the published runs' data, size and epochs ("" for a grid)
  // > 1: each (group, effective batch) is run this many times with seeds --seed, --seed + 1, ...
  // summary.md then leads with their mean and spread (seed_summary.h) and the plot has error bars.
  int seeds = 1;
  std::vector<PublishedPoint> published;    // drawn beside ours (means table and plot)
  // Study-specific outputs (the batch-schedule study's curves and per-variant means): given the
  // study, results.csv, every run's latest record (runs.jsonl) and the folder, it writes its plots
  // and returns Markdown for summary.md, placed after the table; the plot against the batch size
  // is then not drawn.
  std::function<std::string(const Study&, const CsvTable&, const std::map<std::string, nlohmann::json>&,
                            const std::filesystem::path&)>
      extra_outputs;
};

// keras-batch, utilization, techniques, lr-scaling, batch-schedule, conv-bn-chain
const std::vector<std::string>& study_names();
// The keras-batch study's --diverge-loss: Keras trains on whatever the loss, so the study stops a
// run only on NaN or a loss no run recovers from (studies.cpp says why the default 50 is too low).
inline constexpr double kKerasBatchDivergeLoss = 1e4;
// The predefined study with the published settings; quick scales it to minutes on 2 CPU cores.
// `base` supplies what the study does not fix (--data, --device, --workers, --seed, ...): the
// study overrides model, batch sizes, optimizers, epochs, and so on. Throws UsageError.
Study make_study(const std::string& name, bool quick, const TrainConfig& base);
// The batch-schedule study (batch_schedule_study.cpp): one model and data set trained with (a) a
// fixed batch and step learning-rate decay, (b) the batch grown by the decay's factor at the same
// epochs with the learning rate kept (Smith et al. 2017), (c) a hybrid (the batch grows at the
// first milestone, the learning rate decays at the second).
Study batch_schedule_study(bool quick, const TrainConfig& base);
// The conv-bn-chain study (conv_bn_chain_study.cpp): per seed, the same ResNet trained with batch
// norm and with --conv-bn-chain; its outputs put the chain's training loss curve beside the batch
// norm runs' seed-to-seed spread, and count the chain's calls that ran as fused graphs.
Study conv_bn_chain_study(bool quick, const TrainConfig& base);
// What a predefined study trains, at its published or its --quick scale.
struct StudyScale {
  std::string model;
  int64_t image_size = 0;
  std::string split;
  int64_t epochs = 0;
};
// A new run of `s`: `base` at `scale`. The study sets the rest (optimizer, batch, ..., id, group);
// the reference holds until the study's next run is added.
SweepRun& add_study_run(Study& s, const TrainConfig& base, const StudyScale& scale);
// The techniques study's optimizer, the article's ResNet-50 settings: SGD, momentum 0.9, lr 0.001,
// weight decay 1e-4 (the conv-bn-chain study trains with them too).
void use_article_sgd(TrainConfig& c);

// The study's folder under --out: <name>[-<variant>][-quick-<cpu|cuda>], e.g. utilization-amp,
// keras-batch-quick-cpu.
std::string study_folder(const Study& st, const std::string& device_kind);

// The line a sweep prints before its first run: runs (done and to run), models, optimizers,
// (effective) batches, epochs and run_setting().
std::string study_plan(const Study& st, const std::set<std::string>& done);
// What summary.md and every plot title say was run: the data (synthetic or the folder), image
// size(s), epochs and device, e.g. "synthetic, 32 px, 3 epochs, cpu". The summary adds whether the
// setting is the published one; a --quick study is "a scaled-down check, not a reproduction".
std::string run_setting(const Study& st, const std::string& device_kind);
// What summary.md's "what ran" line adds: the synthetic data's difficulty (when synthetic) and the
// number of seeds, e.g. "synthetic difficulty 0.85, 3 seeds".
std::string data_and_seeds(const Study& st);
// What summary.md's "steps" line says: eager, or replayed from CUDA graphs (in how many runs), and in
// how many of the runs that ran (`runs`: runs.jsonl's records by run id) a batch shape's capture
// did not fit and its steps ran eagerly.
std::string steps_mode(const Study& st, const std::map<std::string, nlohmann::json>& runs);
// An accuracy cell for summary.md: "0.5125 (chance)" when it is within two binomial standard
// errors of 50% (two balanced classes) for `n` evaluated images (n <= 0: within 5 points).
std::string accuracy_cell(const std::string& value, int64_t n);

// A grid over the base configuration: every combination of the lists (empty: the base's value).
Study make_grid(const TrainConfig& base, const std::vector<int64_t>& batches, const std::vector<std::string>& optimizers,
                const std::vector<std::string>& augments, const std::vector<std::string>& checkpoints);

const Row& results_header();

struct SweepOptions {
  std::filesystem::path out;             // results/<study>
  bool process_per_run = false;
  std::vector<std::string> argv;         // to respawn this program with --only ID
  std::string only;                      // run just this id (child of process_per_run)
  bool retry_failed = false;             // rerun failed rows (sweep.cpp failed_ids), replacing each
  bool verbose = true;
};

struct SweepOutcome {
  int done_before = 0;                   // skipped: already in results.csv
  int ran = 0;
  int retried = 0;                       // of `ran`: failed rows run again (retry_failed)
  bool interrupted = false;
  std::string plot_note;                 // why there is no plot ("" when there is)
};

SweepOutcome run_sweep(const Study& study, const SweepOptions& o);

// What the sweep does once a --process-per-run child has exited: `rc` its exit status, `stopped`
// whether SIGINT reached the sweep too, `wrote` whether the run's row in results.csv changed. An
// interrupted child (status 130, or the sweep stopped) ends the sweep, and counts as ran only when it
// wrote its row before the interrupt; any other child counts as ran, and one that exited non-zero
// without writing its row gets a "crashed" row so that the sweep moves on.
struct ChildVerdict {
  bool ran = false, record_crash = false, stop = false;
};
ChildVerdict child_verdict(int rc, bool stopped, bool wrote);
// Rebuilds results.json, summary.md and the plot from results.csv and runs.jsonl.
std::string write_study_outputs(const Study& study, const std::filesystem::path& out);

}  // namespace minidl::harness
