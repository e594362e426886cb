// What a training run holds on its device besides the training step itself, so that the answers of
// minidl-maxbatch and minidl-memest hold for the whole run minidl-train makes with the same flags,
// not only for one step on random inputs: a batch that fits one step can still run out of memory
// in the run, which also keeps its data set, its prefetched batches and an evaluation pass.
// The trials (dry and real) hold these bytes beside their steps (step_runner.h); docs/memory.md
// lists what is modelled and what is not.
#pragma once
#include <algorithm>
#include <array>
#include <cstdint>
#include <string>

#include "core/device.h"
#include "train/config.h"

namespace minidl::train {

struct RunFootprint {
  // Held for the whole run: the in-memory synthetic set (images and labels of all three parts),
  // which lives in host memory, so it counts only when the run's device is the CPU.
  int64_t resident_bytes = 0;
  // Input batches alive on the device at once while a step runs: the one trained on, plus the
  // ones the loader has prefetched (on the CPU its queue, the batch being assembled and the
  // current one; on a GPU the current batch and the one copied ahead). A trial models the first
  // with its own input and holds the others beside it.
  int batches_held = 1;
  int64_t image_size = 0;
  // The largest evaluation set (validation or test) one rank holds; -1 when it is not known before
  // the data is read (a folder split by fractions): the pass then runs at the trial's batch.
  int64_t evaluation_images = -1;
  // The training images one rank reads an epoch, -1 when not known before the data is read. The
  // run's loader keeps the last, smaller batch of an epoch, whose shape the step meets once an
  // epoch: eagerly the first time, captured the next (CUDA graphs), so the trials run it too.
  int64_t training_images = -1;

  // Every trial ends with an evaluation pass (a forward without gradients, in evaluation mode) at
  // the trial's batch, or at the largest evaluation set when that is smaller: the run evaluates its
  // validation and test sets at --batch-size, so a set of 8 images is one batch of 8. None when
  // the split has no validation or test images.
  bool evaluation() const { return evaluation_images != 0; }

  // The batch of the trial's evaluation pass for a trial at `batch`.
  int64_t evaluation_batch(int64_t batch) const {
    return evaluation_images < 0 ? batch : std::min(batch, evaluation_images);
  }

  // The epoch's last, smaller batch at `batch` (a micro-batch with accumulation), 0 when the
  // epoch divides evenly or the count is not known; and the evaluation pass's, at the batch of
  // evaluation_batch (a set of 1000 at 300: 100).
  int64_t training_partial(int64_t batch) const { return training_images > batch ? training_images % batch : 0; }
  // The epoch's full batches at `batch` (micro-batches with accumulation); when the count is not
  // known, as many as any trial runs.
  int64_t training_full(int64_t batch) const { return training_images < 0 ? INT64_MAX : training_images / batch; }
  int64_t evaluation_partial(int64_t batch) const {
    return evaluation_images > batch ? evaluation_images % batch : 0;
  }

  // The bytes of one input batch of `batch` images (f32 pixels and i64 labels).
  int64_t batch_bytes(int64_t batch) const;
  // One line for the programs' reports: "data set 23.4 MiB held, 6 batches in flight, an evaluation pass".
  std::string describe() const;
};

// The footprint of the run c would make on `device` (a meta device counts as the device it stands
// for) with models of `image_size`: the same data sources as make_run_data (data_source.h).
RunFootprint run_footprint(const TrainConfig& c, Device device, int64_t image_size);

// --checkpoint optimal under a memory budget of `budget` bytes: the limit the planner solves a
// micro-batch's plan for (nn::Recomputer::set_memory_limit). It is computed from the configuration
// alone, never from what the allocator holds at the moment, so that minidl-train, the trials of
// minidl-maxbatch and minidl-memest and their dry runs solve the same plan at the same micro-batch
// (with the profile's modelled times, nn/recompute_profile.h), and a trial's verdict holds for the
// run. It is 90% of what the budget leaves beside the run's fixed memory, plus the micro-batch's
// input (which the planner's model counts). Fixed: the weights, the optimizer state, with AMP the
// autocast's half-precision weight copies, with accumulation the gradients of the window's earlier
// micro-batches, with several ranks DataParallel's gradient buckets, the resident data set and
// the loader's other batches. The 10% absorbs what the model leaves out: workspaces, the
// allocator's rounding and the blocks it cannot reuse. When the budget leaves nothing, the limit
// is the input alone: the least-memory plan runs, and the allocator decides.
int64_t optimal_recompute_limit(const TrainConfig& c, int64_t budget, int64_t parameter_bytes, const RunFootprint& f,
                                int64_t micro);

// The synthetic set's images per class in the train, val and test parts (--split as counts, or as
// fractions of --synthetic-size); throws UsageError when it leaves no training images.
std::array<int64_t, 3> synthetic_part_counts(const TrainConfig& c);

}  // namespace minidl::train
