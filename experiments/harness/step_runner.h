// Runs K full training steps (at least two where the run's epoch has two; forward, backward,
// optimizer step; two micro-batches per step with gradient accumulation, and none where an epoch
// holds fewer micro-batches than a window) of a configuration at a given micro-batch on random
// inputs under the memory budget, then what the run does where an epoch ends (its trailing window
// with the smaller last batch, the evaluation pass and its last batch, and where there are such
// batches the next epoch's first steps and end), and measures peak memory and step time. Beside the
// steps it holds what the run minidl-train would make also holds on the device (run_footprint.h:
// the in-memory data set, prefetched batches), so its answer is the run's, not one step's: on a
// caching allocator where a block lands depends on every request before it, and the run's shapes
// are all among them. The finder, --profile and minidl-memest use it; an OOM inside a trial is
// caught, the step's tensors are dropped, and the runner checks that the memory statistics return
// to their level.
#pragma once
#include <algorithm>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "core/device.h"
#include "train/config.h"
#include "train/finder.h"
#include "train/model.h"
#include "train/step.h"
#include "train/run_footprint.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"

namespace minidl::harness {

using namespace ::minidl::train;   // the trainer library (train/), which the programs are built on

class StepRunner {
 public:
  // Builds the model and optimizer of c on its device (or on `device`: the meta device for a dry
  // run, see dry_run_device) and takes one warm-up step at batch 1 (so the optimizer state exists
  // before any measurement). budget_bytes 0: no budget.
  StepRunner(const TrainConfig& c, int64_t budget_bytes, std::optional<Device> device = std::nullopt);
  ~StepRunner();
  StepRunner(const StepRunner&) = delete;
  StepRunner& operator=(const StepRunner&) = delete;

  Trial run(int64_t batch, int steps);
  Model& model() { return model_; }
  Device device() const { return device_; }
  int64_t baseline_allocated() const { return baseline_; }   // weights + optimizer state
  int64_t parameter_bytes() const;
  const RunFootprint& footprint() const { return footprint_; }

 private:
  // The batches of one epoch of the run's loader: `full` batches of `size` images (INT64_MAX when
  // the set's size is not known before the data is read), then a smaller last one of `last` images
  // (0: none).
  struct Epoch {
    int64_t full = 0, size = 0, last = 0;
  };
  // The run's loader on the device over an epoch (RunFootprint::batches_held), of which a trial
  // takes `leading` full batches (the epoch's first ones, the last of them standing for the epoch's
  // last full batch) and then, with `and_last`, the epoch's smaller last one. Each batch's tensors
  // are made when the one before it is handed out, as data::DeviceStaging::next does, and freed by
  // the step that used them; what is held ahead is what the run's loader holds at that point of the
  // epoch, not the trial's next batches: two steps of an epoch of three full batches hold all three
  // during the first (the run's loader may have made the third by then).
  class Feed {
   public:
    Feed(const StepRunner& r, Epoch epoch, int64_t leading, bool and_last = false);
    std::pair<Tensor, Tensor> next();   // images and labels

   private:
    struct Made {
      int64_t images_in;
      Tensor images, labels;
    };
    int64_t size_at(int64_t position) const;
    void make(int64_t images);

    const StepRunner& r_;
    Epoch epoch_;
    std::vector<int64_t> take_;   // the epoch's positions handed out, in order
    int ahead_;
    size_t handed_ = 0;
    std::deque<Made> ready_;
  };
  // The epoch of the run's training loader at micro-batch `batch`, with at least `leading` full
  // batches (a trial asked for more steps than the epoch has runs them all at `batch`).
  Epoch training_epoch(int64_t batch, int64_t leading) const;
  // The optimizer steps of a trial at micro-batch `batch`: `first` full windows (at least `steps`)
  // in its first pass and `again` in the next epoch's, each of accumulated() micro-batches; then
  // in each pass the epoch's trailing window, when it has one (training_windows explains which).
  struct Windows {
    int64_t first = 0, again = 0;
    std::vector<int64_t> trailing;   // its micro-batches' sizes
    bool trailing_full = false;      // it begins with a full micro-batch
  };
  Windows training_windows(int64_t batch, int steps) const;
  std::vector<int64_t> full_window(int64_t batch) const;   // accumulated() micro-batches of `batch`
  // One optimizer step on the micro-batches of `window` (their sizes) from `feed`, weighted as the
  // run's plan weighs them (a full window at 1/accumulated(), replayable; any other eagerly), at
  // the run's full micro-batch `micro`. Returns the peak bytes of its forward + backward phase that
  // the batch needs (reserved on a GPU, live blocks on the CPU: see step_runner.cpp).
  int64_t step(Feed& feed, const std::vector<int64_t>& window, int64_t micro);
  // The run's evaluation pass at `batch` (its loader's epoch over the largest evaluation set): its
  // first `full_batches` full batches at most, then its smaller last one, as forwards without
  // gradients in evaluation mode, replayed from a captured forward where the run's would be
  // (train::evaluate). Returns whether the pass ran a smaller last batch.
  bool evaluate(int64_t batch, int64_t full_batches);
  // The micro-batches of a trial's step: with accumulation, a second micro-batch's backward adds
  // into gradients that already exist (temporaries of the largest parameter's size), and with
  // CUDA graphs it is the second graph on the shared pool: two cover every peak of a window.
  int64_t accumulated() const { return std::min<int64_t>(c_.accumulation_steps, 2); }
  // --checkpoint optimal under the budget: the run's limit for this micro-batch (train::
  // optimal_recompute_limit), so the trial's plan is the one the run solves at the same batch.
  void limit_recomputation(int64_t batch);

  TrainConfig c_;
  Device device_;
  Model model_;
  std::unique_ptr<optim::Optimizer> opt_;
  optim::GradScaler scaler_;
  std::unique_ptr<Step> step_;   // minidl-train's step (train/step.h)
  int64_t backward_peak_ = 0;    // the backward phase's peak (reserved on a GPU, allocated on the CPU)
  int64_t budget_ = 0;
  int64_t baseline_ = 0;
  RunFootprint footprint_;
  Tensor resident_;             // footprint_.resident_bytes, held for the runner's life
  int64_t peak_allocated_ = 0;   // over the current trial, across the phase resets
  int64_t peak_reserved_ = 0;
  bool last_stepped_ = false;   // the last step() really updated the weights (not skipped by AMP)
  int64_t limited_batch_ = 0;   // the batch limit_recomputation last set the limit for
};

// The shape-only device standing for c's device (Device::meta of its type): a StepRunner there is a
// dry run whose peaks are those of the real device's steps (docs/memory.md), without computing.
Device dry_run_device(const TrainConfig& c);

}  // namespace minidl::harness
