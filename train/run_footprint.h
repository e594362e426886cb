// What a training run holds on its device besides the training step itself, so that the answers of
// minidl-maxbatch and minidl-memest hold for the whole run minidl-train makes with the same flags,
// not only for one step on random inputs: a batch that fits one step can still run out of memory
// in the run, which also keeps its data set, its prefetched batches and an evaluation pass.
// The trials (dry and real) hold these bytes beside their steps (step_runner.h); docs/memory.md
// lists what is modelled and what is not.
#pragma once
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
  // Every trial ends with an evaluation pass (a forward without gradients, in evaluation mode) at
  // the trial's batch: the run evaluates at --batch-size after every epoch.
  bool evaluation = true;

  // The bytes of one input batch of `batch` images (f32 pixels and i64 labels).
  int64_t batch_bytes(int64_t batch) const;
  // One line for the programs' reports: "data set 23.4 MiB held, 6 batches in flight, an evaluation pass".
  std::string describe() const;
};

// The footprint of the run c would make on `device` (a meta device counts as the device it stands
// for) with models of `image_size`: the same data sources as make_run_data (data_source.h).
RunFootprint run_footprint(const TrainConfig& c, Device device, int64_t image_size);

// The synthetic set's images per class in the train, val and test parts (--split as counts, or as
// fractions of --synthetic-size); throws UsageError when it leaves no training images.
std::array<int64_t, 3> synthetic_part_counts(const TrainConfig& c);

}  // namespace minidl::train
