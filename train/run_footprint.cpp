// The run's memory besides the step (see run_footprint.h), from the same decisions make_run_data
// and data::Loader take: which source serves the batches, where it keeps them, how many it holds.
#include "train/run_footprint.h"

#include "core/allocator.h"
#include "data/loader.h"
#include "train/data_source.h"

namespace minidl::train {

std::array<int64_t, 3> synthetic_part_counts(const TrainConfig& c) {
  const SplitSpec s = parse_split(c.split);
  std::array<int64_t, 3> n{};
  const int64_t per_class = c.synthetic_size > 0 ? c.synthetic_size : 1000;
  for (size_t i = 0; i < 3; ++i)
    n[i] = s.counts ? static_cast<int64_t>(s.parts[i]) : static_cast<int64_t>(s.parts[i] * per_class);
  if (n[0] <= 0) throw UsageError("--split " + c.split + " leaves no training images");
  return n;
}

int64_t RunFootprint::batch_bytes(int64_t batch) const {
  return batch * (3 * image_size * image_size * static_cast<int64_t>(sizeof(float)) +
                  static_cast<int64_t>(sizeof(int64_t)));
}

std::string RunFootprint::describe() const {
  std::string s = resident_bytes > 0 ? "the in-memory data set (" + format_bytes(static_cast<size_t>(resident_bytes)) +
                                           ") held throughout, "
                                     : "";
  s += std::to_string(batches_held) + (batches_held == 1 ? " input batch" : " input batches") +
       " on the device at once";
  if (evaluation) s += ", an evaluation pass at the same batch";
  return s;
}

RunFootprint run_footprint(const TrainConfig& c, Device device, int64_t image_size) {
  RunFootprint f;
  f.image_size = image_size;
  const bool on_cpu = device.target() == DeviceType::CPU;
  if (c.data == "synthetic" && c.augment == "none") {
    // tensor_source: every part's images as one f32 tensor and its labels as i64, in host memory;
    // a batch is gathered on the host and copied to a GPU, one at a time.
    if (on_cpu)
      for (const int64_t per_class : synthetic_part_counts(c)) f.resident_bytes += f.batch_bytes(2 * per_class);
    f.batches_held = 1;
    return f;
  }
  // data::Loader. Without workers it assembles each batch when asked: one at a time. With workers,
  // on the CPU its queue (prefetch_batches), the batch its assembler holds while waiting for room in
  // the queue, and the one handed out; on a GPU the batches wait in pinned host memory, and the
  // device holds the one handed out and the one whose copy was queued ahead of it.
  const data::LoaderOptions defaults;
  if (c.workers == 0) f.batches_held = 1;
  else f.batches_held = on_cpu ? defaults.prefetch_batches + 2 : 2;
  return f;
}

}  // namespace minidl::train
