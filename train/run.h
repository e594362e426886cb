// One training run end to end (minidl-train, and each run of minidl-sweep): model, data,
// optimizer with batch scaling, warmup and schedule, gradient accumulation, memory budget,
// per-epoch evaluation, divergence detection, time-to-target accuracy, resume and weight saving.
// It stops cleanly at a step boundary on SIGINT or divergence and returns what it measured.
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/conv_bn.h"
#include "train/config.h"

namespace minidl::train {

struct EpochMetrics {
  int64_t epoch = 0;              // 1-based
  int64_t steps = 0;              // optimizer steps so far (all epochs)
  int64_t images = 0;             // training images this epoch
  double lr = 0.0;                // learning rate at the end of the epoch
  double train_loss = 0.0;
  double train_acc = 0.0;
  double val_loss = 0.0;          // NaN when there is no validation set
  double val_acc = 0.0;
  double train_seconds = 0.0;     // training only (no evaluation), device work included
  double images_per_second = 0.0; // images / train_seconds: the first (warm-up) window included
  // After the epoch's first accumulation window (the warm-up: autotuning, handles, first-touch
  // memory): images, seconds and their rate; 0, 0 and NaN when the epoch had no second window.
  int64_t steady_images = 0;
  double steady_seconds = 0.0;
  double images_per_second_steady = std::numeric_limits<double>::quiet_NaN();
  double data_wait_fraction = 0.0;
  // The time the host sat blocked on the device's work (reading each step's loss and prediction
  // count, the epoch's last synchronize) / train_seconds. With data_wait_fraction it says which
  // side sets the pace: the rest of the time the host was busy itself (launches, bookkeeping).
  // About 0 on the CPU, whose kernels run inside the calls that launch them.
  double device_wait_fraction = 0.0;
  double cpu_utilization = 0.0;   // process CPU time / (wall time x cores)
  double gpu_busy = std::numeric_limits<double>::quiet_NaN();  // busy fraction (0-1); NaN: unknown
  std::string gpu_busy_source;    // nvml | cuda-events | "none: <why>" (GpuBusyMeter)
  int64_t peak_allocated = 0;     // bytes, this epoch
  int64_t peak_reserved = 0;
  int64_t batch_size = 0;         // the epoch's micro-batch and accumulation steps (--batch-schedule
  int64_t accumulation_steps = 0; //   changes them; a batch over the budget is accumulated)
};

struct RunResult {
  std::string status = "ok";      // ok | diverged | interrupted | oom | error
  std::string note;               // why it stopped early
  std::vector<EpochMetrics> epochs;
  int64_t steps = 0;
  int64_t parameters = 0;
  double lr = 0.0;                // the base lr after batch scaling
  int64_t warmup_steps = 0;
  double best_val_acc = std::numeric_limits<double>::quiet_NaN();  // NaN: no validation result
  int64_t best_epoch = 0;         // 0 with a NaN best_val_acc
  double test_acc = 0.0;          // NaN when there is no test set (or the run diverged)
  double test_loss = 0.0;
  double time_to_target = -1.0;   // training seconds to reach --target-accuracy; -1: never
  double total_seconds = 0.0;
  double train_seconds = 0.0;
  int64_t peak_allocated = 0;
  int64_t peak_reserved = 0;
  // CUDA graphs: micro-batches replayed, and batch shapes whose capture ran out of memory and fell
  // back to eager steps (GraphedStep::fallbacks); both 0 for an eager run.
  int64_t graph_replays = 0;
  int64_t graph_fallbacks = 0;
  // --conv-bn-chain: the run's conv2d_stats calls (its dry trials' included) that ran as the
  // backend's fused graphs and that were composed (core/conv_bn.h); all 0 without the chain.
  ConvStatsCounts conv_stats;
  std::string data_description;
  std::string device_name;
  int64_t first_epoch = 1;        // > 1 (or a partial epoch) when --resume continued a saved run
  int64_t skipped_files = 0;      // folder data: unreadable files left out, up front and while loading
  // --data-cache: the images the loaders (train, val, test) kept decoded in host memory at the end,
  // and their bytes; 0 for the in-memory synthetic set, which has nothing to decode.
  int64_t data_cached_images = 0;
  int64_t data_cached_bytes = 0;
  std::string split;              // the split in force (--split, or the default's fallback to fractions)
  int64_t val_images = 0;         // images evaluated per validation / test pass, over all ranks (about:
  int64_t test_images = 0;        //   this rank's x ranks), for the chance marker's band (at_chance)
  bool diverged() const { return status == "diverged"; }
  double mean_images_per_second() const;
  double steady_images_per_second() const;   // over the epochs' steady parts; NaN when none had one
};

struct RunHooks {
  std::function<void(const std::string&)> log;                 // progress lines; null: stdout
  std::function<void(const EpochMetrics&)> on_epoch;           // after each epoch's evaluation
  std::function<void(int64_t step)> on_step;                   // after each optimizer step
};

// Runs c. With --save-weights it saves, at the end, everything --resume needs to continue the run
// exactly where it stopped (weights, optimizer and gradient-scaler state, the epoch and the
// micro-batch reached in it, the default generator, best-validation and time bookkeeping), so a
// run stopped after epoch k (or mid-epoch, at a step boundary) and resumed ends with the same
// weights as the run that never stopped. Throws UsageError for bad configuration (a budget below the model's own size, a bad
// data folder...); an OOM, divergence or SIGINT ends the run with that status instead.
RunResult run_training(const TrainConfig& c, const RunHooks& hooks = {});

// --summary: the model table for c's input size (printed by minidl-train --summary).
std::string model_summary(const TrainConfig& c);

// SIGINT asks running loops to stop at the next step boundary; a second SIGINT kills.
// Searches made of many short runs (the max-batch finder's trials) throw Interrupted instead.
struct Interrupted : std::runtime_error {
  using std::runtime_error::runtime_error;
};
// stop_signal.cpp: the flag the handler sets and the loops poll.
void install_sigint_handler();
bool stop_requested();
void request_stop();   // as SIGINT (tests)
void clear_stop();
const char* stop_signal_name();   // "SIGINT" or "SIGTERM": what asked the last stop, for a run's note

// For users' lines: v with `digits` decimals (times `scale`, then `suffix`), or "-" when v is not a
// number (no validation split, a diverged run), never "nan" or a made-up 0.
std::string value_or_dash(double v, int digits, double scale = 1.0, const char* suffix = "");
// The line that ends an epoch: "epoch 3/5 done: loss ... val acc ... img/s ... peak ...", or for an
// epoch cut short, `cut` instead of "done" ("epoch 1/5 out of memory in step 1: ..."): its figures
// are those of the micro-batches it ran.
std::string epoch_done_line(const EpochMetrics& em, int64_t epoch, int64_t epochs, const std::string& cut = "");
// "45 s", "3m05s", "1h02m": an estimated time left.
std::string format_duration(double seconds);

// "cpu: <model name> (N threads)" or the CUDA device.
std::string device_description(Device d);

}  // namespace minidl::train
