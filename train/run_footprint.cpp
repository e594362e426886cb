// The run's memory besides the step (see run_footprint.h), from the same decisions make_run_data
// and data::Loader take: which source serves the batches, where it keeps them, how many it holds.
#include "train/run_footprint.h"

#include <algorithm>
#include <optional>

#include "core/allocator.h"
#include "data/loader.h"
#include "train/data_source.h"
#include "train/model.h"

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
  if (evaluation())
    s += evaluation_images < 0 ? ", an evaluation pass at the same batch"
                               : ", an evaluation pass at the same batch, up to " +
                                     std::to_string(evaluation_images) + " images";
  return s;
}

namespace {

// The images a class has in each part (train, val, test), from the split's counts or the synthetic
// set's parts; nullopt when a folder is split by fractions (known once it is read).
std::optional<std::array<int64_t, 3>> part_counts(const TrainConfig& c) {
  const SplitSpec s = parse_split(c.split);
  if (!s.counts && c.data != "synthetic") return std::nullopt;
  if (c.data == "synthetic") return synthetic_part_counts(c);
  return std::array<int64_t, 3>{static_cast<int64_t>(s.parts[0]), static_cast<int64_t>(s.parts[1]),
                                static_cast<int64_t>(s.parts[2])};
}

// A rank's share of `images` (the distributed sampler pads the ranks to the same count).
int64_t per_rank(const TrainConfig& c, int64_t images) {
  const int64_t ranks = std::max<int64_t>(1, c.world_size);
  return (images + ranks - 1) / ranks;
}

// RunFootprint::evaluation_images: from the split's counts (a folder with fewer images gives
// smaller sets, and a smaller pass), or the synthetic set's parts; sharded over the ranks.
int64_t evaluation_images(const TrainConfig& c) {
  const auto n = part_counts(c);
  if (!n) return -1;
  // --augment article adds a cropped copy of every validation image.
  const int64_t val = 2 * (*n)[1] * (c.augment == "article" ? 2 : 1), test = 2 * (*n)[2];
  return per_rank(c, std::max(val, test));
}

// RunFootprint::training_images: two classes, twice over with --augment article (its offline
// copies); -1 for a folder split by fractions, which may also hold fewer images than its counts.
int64_t training_images(const TrainConfig& c) {
  const auto n = part_counts(c);
  if (!n) return -1;
  return per_rank(c, 2 * (*n)[0] * (c.augment == "article" ? 2 : 1));
}

}  // namespace

RunFootprint run_footprint(const TrainConfig& c, Device device, int64_t image_size) {
  RunFootprint f;
  f.image_size = image_size;
  f.evaluation_images = evaluation_images(c);
  f.training_images = training_images(c);
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

int64_t optimal_recompute_limit(const TrainConfig& c, int64_t budget, int64_t parameter_bytes, const RunFootprint& f,
                                int64_t micro) {
  const double p = static_cast<double>(parameter_bytes);
  const double fixed = p * (1.0 + optimizer_state_factor(c)) + (c.amp ? p / 2 : 0.0) +
                       (c.accumulation_steps > 1 ? p : 0.0) + (c.world_size > 1 ? p : 0.0) +
                       static_cast<double>(f.resident_bytes) +
                       static_cast<double>((f.batches_held - 1) * f.batch_bytes(micro));
  const double room = std::max(0.0, 0.9 * (static_cast<double>(budget) - fixed));
  return static_cast<int64_t>(room) + micro * 3 * f.image_size * f.image_size * static_cast<int64_t>(sizeof(float));
}

}  // namespace minidl::train
