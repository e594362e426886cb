// The threaded prefetching loader: worker threads decode and transform samples into a bounded
// queue of batches, in an order fixed by (seed, epoch) whatever the thread count, and report how
// long the training loop waited for data ("data wait %" in the experiment programs).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/tensor.h"
#include "data/dataset.h"

namespace minidl::data {

enum class Augment {
  None,               // the deterministic resize of `fit` (evaluation, or training without augmentation)
  RandomResizedCrop,  // torchvision defaults: scale (0.08, 1), ratio (3/4, 4/3), then flip
  Keras,              // the Keras study: resize to 250, random crop 200 (`size`), flip
};

// How Augment::None brings a photo to size x size (docs/data.md, "Resizing"):
enum class Fit {
  ShorterCrop,  // shorter side to `resize` (0: size), centre crop: torchvision Resize(r) + CenterCrop(size)
  Squash,       // both sides to size, aspect ratio not kept: torchvision Resize((s, s)), Keras target_size
};

// The resampling filter of every resize (PIL's, so torchvision's and Keras' PIL paths agree).
enum class Interpolation {
  Bilinear,  // antialiased triangle filter: PIL Image.BILINEAR, torchvision's default
  Nearest,   // PIL Image.NEAREST: Keras' load_img / flow_from_directory default
};

struct TransformOptions {
  int64_t size = 224;              // output height and width
  // ShorterCrop: the shorter side before the centre crop, 0: size (an image of size x size is
  // left as it is); torchvision's ImageNet evaluation uses size * 256 / 224. Keras: the square
  // side before the random crop, 0: size * 250 / 200.
  int64_t resize = 0;
  Fit fit = Fit::ShorterCrop;
  Interpolation interpolation = Interpolation::Bilinear;
  Augment augment = Augment::None;
  bool hflip = true;               // random horizontal flip (only with an augmenting mode)
  bool normalize = true;           // ImageNet mean / std; otherwise scale to [0, 1]
  std::vector<float> mean{0.485f, 0.456f, 0.406f};
  std::vector<float> std{0.229f, 0.224f, 0.225f};
};

struct LoaderOptions {
  int64_t batch_size = 32;
  int workers = 2;                 // 0: decode on the calling thread
  int prefetch_batches = 4;        // bounded queue length
  bool shuffle = true;
  bool drop_last = false;
  uint64_t seed = 0;               // shuffle and augmentation draws depend on (seed, epoch, index)
  DType dtype = DType::f32;        // f32 or f16
  bool channels_last = false;      // [N, H, W, C] contiguous instead of [N, C, H, W]
  Device device = Device::cpu();   // batches are copied here
  bool cache = false;              // keep decoded, resized u8 images in RAM after the first epoch
  TransformOptions transform;
  // The cache stops growing at this many bytes (later images are decoded every epoch). With
  // RandomResizedCrop it keeps whole decoded photos (~0.5 MB each for cats-vs-dogs).
  int64_t cache_limit_bytes = int64_t{16} << 30;
  // When set, the epoch's samples in order (dataset indices, repeats allowed) instead of the
  // shuffle: a distributed sampler's shard (distributed::DistributedSampler). The augmentation draws stay
  // keyed by the dataset index, so a sample is augmented alike whichever rank reads it.
  // batches_per_epoch() counts epoch 0's list (a distributed sampler's lists all have one length).
  std::function<std::vector<int64_t>(int64_t epoch)> sampler;
};

struct Batch {
  Tensor images;                   // [N, 3, H, W] (or [N, H, W, 3] with channels_last)
  Tensor labels;                   // [N] i64
};

struct LoaderStats {
  int64_t images = 0;              // images delivered since the last reset
  int64_t skipped = 0;             // samples skipped as unreadable since the start
  double wall_seconds = 0;         // time since the last reset
  double wait_seconds = 0;         // time next() spent blocked waiting for a batch
  int64_t cached_images = 0;       // images held by the RAM cache now
  int64_t cached_bytes = 0;        // their pixel bytes
  double images_per_second() const { return wall_seconds > 0 ? images / wall_seconds : 0; }
  double wait_fraction() const { return wall_seconds > 0 ? wait_seconds / wall_seconds : 0; }
};

// The order of an epoch's samples: 0..n-1, shuffled (Fisher-Yates on Philox draws keyed by seed
// and epoch) when `shuffle`. Loader uses it, and so does distributed::DistributedSampler, whose shards
// therefore hold exactly the samples a one-process epoch would.
std::vector<int64_t> epoch_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch);

class Loader {
 public:
  Loader(std::shared_ptr<const Dataset> dataset, LoaderOptions options);
  ~Loader();
  Loader(const Loader&) = delete;
  Loader& operator=(const Loader&) = delete;

  int64_t batches_per_epoch() const;
  // Starts (or restarts) epoch `epoch`: the order is a function of (seed, epoch) only. On the
  // device path (pinned staging, workers > 0) the epoch after one whose end next() reported is
  // already being made; start_epoch keeps that work when `epoch` has the same batches (the next
  // epoch, or any epoch of a loader without shuffle or augmentation) and starts afresh otherwise.
  void start_epoch(int64_t epoch);
  // A new batch size from the next start_epoch() on (a batch-size schedule), on the same loader:
  // the RAM cache, the unreadable-sample list and the pinned staging buffers (made again only when
  // the batch outgrows them) are kept. The sample order does not depend on the batch size, so the
  // epoch's samples are the same, cut into batches of the new size. It ends the epoch in progress
  // (as on a new loader, next() without start_epoch() starts epoch 0). Throws for size < 1.
  void set_batch_size(int64_t size);
  // The next batch of the current epoch, or nullopt at its end. Unreadable samples are skipped,
  // so a batch can be smaller than batch_size only at the end of an epoch (without drop_last).
  std::optional<Batch> next();
  LoaderStats stats() const;
  // The dataset indices found unreadable so far (sorted): what stats().skipped counts.
  std::vector<int64_t> skipped_indices() const;
  void reset_stats();
  const LoaderOptions& options() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace minidl::data
