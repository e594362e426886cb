// Where a run's batches come from: the training loop sees one interface whether the images are
// the built-in synthetic set held as tensors (fast; what tests and the quick studies use) or a
// folder / augmented set decoded by the threaded data::Loader. Both report the time the loop
// waited for data, for the "data wait %" of the progress line.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/tensor.h"
#include "data/dataset.h"
#include "train/config.h"
#include "train/data_account.h"

namespace minidl::train {

struct TensorBatch {
  Tensor images;  // [N, 3, S, S] f32 on the run's device
  Tensor labels;  // [N] i64 on the run's device
};

class BatchSource {
 public:
  virtual ~BatchSource() = default;
  virtual int64_t size() const = 0;                 // images per epoch
  virtual int64_t batches_per_epoch() const = 0;
  virtual void start_epoch(int64_t epoch) = 0;
  // Batches of `size` from the next start_epoch() on (a batch-size schedule); the same source, so
  // the loader keeps its cache and staging buffers.
  virtual void set_batch_size(int64_t size) = 0;
  virtual std::optional<TensorBatch> next() = 0;
  virtual double wait_seconds() const = 0;          // cumulative time next() spent
  virtual int64_t skipped() const { return 0; }     // unreadable samples (folder data)
  // Those samples as indices into the run's usable dataset (DataAccount::dataset).
  virtual std::vector<int64_t> skipped_samples() const { return {}; }
  // --data-cache: the decoded images the loader keeps in host memory now, and their bytes.
  virtual int64_t cached_images() const { return 0; }
  virtual int64_t cached_bytes() const { return 0; }
};

// This process's part of the data when several ranks train together (mpirun -np N): training
// takes positions rank, rank + world, ... of each epoch's order, padded with the order's first
// samples to ceil(n / world) on every rank (distributed::Tail::Pad, so every rank steps as often);
// evaluation takes the same stride without padding (distributed::Tail::Uneven: every image counts once,
// the metrics are summed over the ranks). The union of the ranks' k-th batches of b is then the
// one-process k-th batch of world x b. world 1: all of it, as before.
struct Shard {
  int rank = 0;
  int world = 1;
};

// In-memory tensors [N, 3, S, S] f32 and [N] i64 on the CPU; batches are gathered in a seeded
// per-epoch order (or in order), restricted to `shard` (padded when `pad`), and copied to `device`.
std::unique_ptr<BatchSource> tensor_source(Tensor images, Tensor labels, int64_t batch_size, bool shuffle,
                                           uint64_t seed, Device device, Shard shard = {}, bool pad = true);

struct RunData {
  std::unique_ptr<BatchSource> train, val, test;  // val / test may hold 0 images (then null)
  std::string description;                        // one line for the log
  std::string validation_report;                  // --validate-data's report ("" without it)
  std::string split;                              // the split in force: --split, or the default's fallback
  std::string split_note;                         // why the default split fell back to fractions ("": it did not)
  std::optional<DataAccount> account;             // folder data: files, usable images, the split
};

// The --resize mode in force: the flag, or for auto the convention of the model's world (keras
// for the Keras study's smallcnn, center for the torchvision ResNets).
std::string resolved_resize_mode(const TrainConfig& c);

// The train / val / test sources of a run per c (--data, --split, --augment, ...), batches of
// c.batch_size (evaluation uses the same size). A folder's files are all looked at first (their
// headers; every pixel with --validate-data) and the unreadable ones left out before anything is
// counted or split; with several ranks they agree on that list. Throws UsageError, one line naming
// the folder and the counts, for a missing or empty folder, fewer than two classes, a class left
// with no usable image or a split that leaves a class without images in a part that asks for some.
RunData make_run_data(const TrainConfig& c, Device device, int64_t image_size, Shard shard = {});

}  // namespace minidl::train
