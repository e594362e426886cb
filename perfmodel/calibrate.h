// The calibration's join (the model phase of the lab's GPU check, lab/gpulab): per-launch GPU
// times from the real build's launch timer (kernels/cuda/launch_timer.cuh), summed per kernel with
// the model's keys, next to the modelled times of the same configuration read from the committed
// model table (lab/results/bench/gpu_model_<date>_<commit>.tsv). Plain C++: tested on the CPU.
#pragma once
#include <istream>
#include <string>
#include <vector>

namespace minidl::gpumodel {

// The model's key of a timed launch: "op / kernel", or the library call's op alone ("cuDNN conv forward").
std::string launch_key(const std::string& op, const std::string& kernel);

struct MeasuredRow {
  std::string key;
  double launches = 0;   // per step
  double us = 0;         // per step, summed over its launches
  double host_us = 0;    // the host's time inside those launches or library calls, per step
};
struct TimedLaunch {
  std::string key;
  double ms = 0;
  double host_ms = 0;
};
// Per key, per step (the launches of `steps` steps divided by steps); costliest first.
std::vector<MeasuredRow> per_kernel_measured(const std::vector<TimedLaunch>& launches, int steps);

struct ModelledRow {
  std::string key;
  double launches = 0;
  double us = 0;
};
// The rows of one configuration ("resnet50-amp-b256-i224") from a model TSV (report.h's
// per_kernel_tsv: config, key, launches, modelled_us, ...). Empty when the file lacks it.
std::vector<ModelledRow> read_modelled(std::istream& tsv, const std::string& config);

// Markdown: every key of either side, measured costliest first, with modelled and measured µs
// per step and their ratio; then the totals. `measured_step_ms` is the step's wall time (events
// around the whole step), 0 when unknown.
std::string comparison_table(const std::vector<ModelledRow>& modelled, const std::vector<MeasuredRow>& measured,
                             double measured_step_ms, double images_per_step);

// Markdown: where an eager step's host time goes. `step_host_ms` is the host's time in a whole step
// (0 when unknown); the rows' host_us are its time inside each key's launches or library calls;
// the rest is minidl's own work between them (autograd, allocator, checks, the timer's own event
// records). The `top` keys by host time are listed.
// gpu_ms: the GPU's own time a step (the gated launches' sum; 0 when not measured). With it the
// table says which side sets the pace: host-bound, the GPU idles for the difference; GPU-bound
// (its launches fill at least 90% of the wall), the host's own-work row also holds its waits for
// a full launch queue (inside the timer's event records), not work.
std::string host_table(const std::vector<MeasuredRow>& measured, double step_host_ms, double step_wall_ms, int top,
                       double gpu_ms = 0);

}  // namespace minidl::gpumodel
