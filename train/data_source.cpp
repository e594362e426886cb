// The batch sources of data_source.h: in-memory synthetic tensors, and the threaded data::Loader
// for folders and augmentation.
#include "train/data_source.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <vector>

#include "core/allocator.h"
#include "data/article_augment.h"
#include "data/synthetic.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/transform.h"
#include "distributed/process_group.h"
#include "distributed/sampler.h"
#include "train/run_footprint.h"

namespace minidl::train {
namespace {

using Clock = std::chrono::steady_clock;

class TensorSource final : public BatchSource {
 public:
  TensorSource(Tensor images, Tensor labels, int64_t batch, bool shuffle, uint64_t seed, Device device, Shard shard,
               bool pad)
      : images_(images.contiguous()), labels_(labels.to(DType::i64).contiguous()), batch_(batch),
        shuffle_(shuffle), seed_(seed), device_(device), shard_(shard), pad_(pad) {
    MINIDL_CHECK(images_.dim() == 4 && images_.size(0) == labels_.size(0), "train: tensor_source expects images "
                 "[N, C, H, W] and labels [N], got ", shape_str(images_.shape()), " and ", shape_str(labels_.shape()));
    MINIDL_CHECK(shard.world >= 1 && shard.rank >= 0 && shard.rank < shard.world, "train: tensor_source: rank ",
                 shard.rank, " is outside the world of ", shard.world);
    order_.resize(static_cast<size_t>(images_.size(0)));
  }
  // This rank's images per epoch: ceil(n / world) when padded, else its stride's count.
  int64_t size() const override {
    const int64_t n = images_.size(0), w = shard_.world;
    return pad_ ? (n + w - 1) / w : (n - shard_.rank + w - 1) / w;
  }
  int64_t batches_per_epoch() const override { return (size() + batch_ - 1) / batch_; }
  void set_batch_size(int64_t size) override { batch_ = size; }
  void start_epoch(int64_t epoch) override {
    order_.resize(static_cast<size_t>(images_.size(0)));
    std::iota(order_.begin(), order_.end(), int64_t{0});
    if (shuffle_) {
      std::mt19937_64 rng(seed_ * 1000003ULL + static_cast<uint64_t>(epoch));
      std::shuffle(order_.begin(), order_.end(), rng);
    }
    if (shard_.world > 1) {
      // The epoch's order is the same on every rank (same seed): rank r takes positions r, r + W, ...
      // of it, padded from its start, as distributed::DistributedSampler does with the loader's order.
      std::vector<int64_t> full = order_;
      const auto n = static_cast<int64_t>(full.size());
      order_.clear();
      for (int64_t p = shard_.rank; p < (pad_ ? size() * shard_.world : n); p += shard_.world)
        order_.push_back(full[static_cast<size_t>(p % n)]);
    }
    pos_ = 0;
  }
  std::optional<TensorBatch> next() override {
    const auto t0 = Clock::now();
    if (pos_ >= size()) return std::nullopt;
    const int64_t n = std::min(batch_, size() - pos_);
    MINIDL_CHECK(static_cast<int64_t>(order_.size()) >= pos_ + n, "train: tensor_source: next() before start_epoch()");
    Shape shape = images_.shape();
    shape[0] = n;
    Tensor x = empty(shape, images_.options());
    Tensor y = empty({n}, labels_.options());
    const int64_t row = images_.numel() / images_.size(0);
    const float* src = images_.data<float>();
    const int64_t* lsrc = labels_.data<int64_t>();
    float* dst = x.data<float>();
    int64_t* ldst = y.data<int64_t>();
    for (int64_t i = 0; i < n; ++i) {
      const int64_t j = order_[static_cast<size_t>(pos_ + i)];
      std::memcpy(dst + i * row, src + j * row, static_cast<size_t>(row) * sizeof(float));
      ldst[i] = lsrc[j];
    }
    pos_ += n;
    TensorBatch b{x, y};
    if (!device_.is_cpu()) b = {x.to(device_), y.to(device_)};
    wait_ += std::chrono::duration<double>(Clock::now() - t0).count();
    return b;
  }
  double wait_seconds() const override { return wait_; }

 private:
  Tensor images_, labels_;
  int64_t batch_;
  bool shuffle_;
  uint64_t seed_;
  Device device_;
  Shard shard_;
  bool pad_;
  std::vector<int64_t> order_;
  int64_t pos_ = 0;
  double wait_ = 0.0;
};


class LoaderSource final : public BatchSource {
 public:
  // part: what the loader reads; its sample k is the base dataset's sample idx[k % idx.size()]
  // (subset(base, idx), or with --augment article that subset twice over: data/article_augment.h).
  LoaderSource(std::shared_ptr<const data::Dataset> part, std::vector<int64_t> idx, data::LoaderOptions o)
      : idx_(std::move(idx)), channels_last_(o.channels_last), loader_(std::move(part), std::move(o)) {}
  int64_t size() const override { return size_; }
  int64_t batches_per_epoch() const override { return loader_.batches_per_epoch(); }
  void start_epoch(int64_t epoch) override { loader_.start_epoch(epoch); }
  void set_batch_size(int64_t size) override { loader_.set_batch_size(size); }
  std::optional<TensorBatch> next() override {
    auto b = loader_.next();
    if (!b) return std::nullopt;
    // --channels-last: the loader's [N, H, W, 3] batch seen as a channels-last [N, 3, H, W].
    return TensorBatch{channels_last_ ? b->images.permute({0, 3, 1, 2}) : b->images, b->labels};
  }
  double wait_seconds() const override { return loader_.stats().wait_seconds; }
  int64_t skipped() const override { return loader_.stats().skipped; }
  int64_t cached_images() const override { return loader_.stats().cached_images; }
  int64_t cached_bytes() const override { return loader_.stats().cached_bytes; }
  std::vector<int64_t> skipped_samples() const override {
    std::vector<int64_t> out;
    for (const int64_t k : loader_.skipped_indices()) out.push_back(idx_[static_cast<size_t>(k) % idx_.size()]);
    // Both article copies of an unreadable file fail: the file counts once.
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
    return out;
  }
  int64_t size_ = 0;

 private:
  std::vector<int64_t> idx_;
  bool channels_last_ = false;
  data::Loader loader_;
};

// `article`: the part enters twice, as the article's offline augmentation saved it (--augment article).
// cache_bytes: this part's share of --data-cache (0: no cache).
std::unique_ptr<BatchSource> loader_source(std::shared_ptr<const data::Dataset> base, std::vector<int64_t> idx,
                                           const TrainConfig& c, Device device, int64_t image_size, bool training,
                                           uint64_t seed, Shard shard, int64_t cache_bytes, bool article = false) {
  if (idx.empty()) return nullptr;
  if (!training && shard.world > 1) {
    // Evaluation: this rank's stride of the part, unpadded (every image counts once over the ranks).
    std::vector<int64_t> mine;
    for (size_t p = static_cast<size_t>(shard.rank); p < idx.size(); p += static_cast<size_t>(shard.world))
      mine.push_back(idx[p]);
    idx = std::move(mine);
    if (idx.empty()) return nullptr;
  }
  data::LoaderOptions o;
  o.batch_size = c.batch_size;
  o.workers = c.workers;
  o.shuffle = training && !c.no_shuffle;
  o.seed = seed;
  o.device = device;
  o.cache = cache_bytes > 0;
  o.cache_limit_bytes = cache_bytes;
  o.transform.size = image_size;
  o.channels_last = c.resolved_channels_last();
  o.transform.normalize = c.normalize == "imagenet";
  const std::string fit = resolved_resize_mode(c);
  o.transform.fit = fit == "squash" || fit == "keras" ? data::Fit::Squash : data::Fit::ShorterCrop;
  o.transform.interpolation = fit == "keras" ? data::Interpolation::Nearest : data::Interpolation::Bilinear;
  if (fit == "imagenet") o.transform.resize = data::imagenet_resize(image_size);
  if (training && c.augment == "keras") {
    o.transform.augment = data::Augment::Keras;
    o.transform.resize = image_size * 250 / 200;
  } else if (training && c.augment == "rrc") {
    o.transform.augment = data::Augment::RandomResizedCrop;
  }
  std::shared_ptr<const data::Dataset> part = data::subset(std::move(base), idx);   // idx: kept for the source
  if (article) {
    // Both copies come out of the view at the final size, which the loader's squash leaves alone.
    part = data::article_augmented(std::move(part), o.transform);
    o.transform.fit = data::Fit::Squash;
    o.transform.resize = 0;
  }
  const int64_t n = part->size();
  if (training && shard.world > 1) {
    // This rank's shard of each epoch's order (distributed::DistributedSampler over the loader's own
    // shuffle, padded): the union of the ranks' shards is the one-process epoch, and each sample's
    // augmentation is drawn as in the one-process run (keyed by its index, not its position).
    const distributed::DistributedSampler sampler(n, shard.rank, shard.world, {o.shuffle, o.seed, distributed::Tail::Pad});
    o.sampler = [sampler](int64_t epoch) { return sampler.indices(epoch); };
    auto src = std::make_unique<LoaderSource>(std::move(part), std::move(idx), o);
    src->size_ = sampler.num_samples();
    return src;
  }
  auto src = std::make_unique<LoaderSource>(std::move(part), std::move(idx), o);
  src->size_ = n;
  return src;
}

// Every file of the folder looked at before anything is counted: its header (cheap: catches empty,
// non-image and random-bytes files), or with --validate-data its pixels (the report goes to
// *report). The unreadable files are named on stderr (rank 0; at most kListed) and left out;
// with several ranks the list is the union of the ranks' scans, so every rank splits, shards and
// steps alike. Returns the indices of the usable files.
std::vector<int64_t> scan_folder(const data::Dataset& folder, const TrainConfig& c, Shard shard, std::string* report) {
  constexpr size_t kListed = 20;
  const data::ValidationReport rep = data::validate_dataset(
      folder, std::max(1, c.workers), c.validate_data ? data::Scan::Decode : data::Scan::Header);
  Tensor bad = zeros({folder.size()}, {.dtype = DType::u8});
  uint8_t* b = bad.data<uint8_t>();
  for (const auto& e : rep.unreadable) b[e.index] = 1;
  if (shard.world > 1 && folder.size() > 0) distributed::world().allreduce(bad, distributed::ReduceOp::Max);
  if (c.validate_data) {
    *report = rep.text();
  } else if (shard.rank == 0) {
    for (size_t k = 0; k < rep.unreadable.size() && k < kListed; ++k)
      std::fprintf(stderr, "minidl data: skipping %s: %s\n", rep.unreadable[k].what.c_str(), rep.unreadable[k].why.c_str());
    if (rep.unreadable.size() > kListed)
      std::fprintf(stderr, "minidl data: ... and %zu more unreadable files (--validate-data lists them all)\n",
                   rep.unreadable.size() - kListed);
  }
  std::vector<int64_t> usable;
  for (int64_t i = 0; i < folder.size(); ++i)
    if (b[i] == 0) usable.push_back(i);
  return usable;
}

// A split of the whole folder restricted to its usable files, as indices among them.
data::Split usable_part(const data::Split& all, const std::vector<int64_t>& usable, int64_t files) {
  std::vector<int64_t> at(static_cast<size_t>(files), -1);
  for (size_t k = 0; k < usable.size(); ++k) at[static_cast<size_t>(usable[k])] = static_cast<int64_t>(k);
  const auto keep = [&](const std::vector<int64_t>& part) {
    std::vector<int64_t> out;
    for (const int64_t i : part)
      if (at[static_cast<size_t>(i)] >= 0) out.push_back(at[static_cast<size_t>(i)]);
    return out;
  };
  return {keep(all.train), keep(all.val), keep(all.test)};
}

// The split of a folder run: --split as given, or, when it was not given, the default counts or, on a
// folder with fewer usable images in a class than they ask for, the same proportions as fractions
// (*note says so). The synthetic set is made to the split's size and keeps the counts.
std::string folder_split(const TrainConfig& c, const DataAccount& a, std::string* note) {
  if (c.split_given || c.split != kDefaultSplit) return c.split;
  const SplitSpec s = parse_split(c.split);
  const auto need = static_cast<int64_t>(s.parts[0] + s.parts[1] + s.parts[2]);
  std::string have;
  bool fits = true;
  for (size_t k = 0; k < a.classes.size(); ++k) {
    have += (k == 0 ? "" : " / ") + std::to_string(a.usable[k]) + " " + a.classes[k];
    fits = fits && a.usable[k] >= need;
  }
  if (fits) return c.split;
  std::string sum = kDefaultSplit;
  std::replace(sum.begin(), sum.end(), ',', '+');
  *note = "--split: '" + a.what + "' has " + have + " usable images, fewer than " + sum +
          " per class: using fractions " + kDefaultSplitFractions + " (give --split to choose)";
  return kDefaultSplitFractions;
}

}  // namespace

std::string resolved_resize_mode(const TrainConfig& c) {
  if (c.resize != "auto") return c.resize;
  return c.model == "smallcnn" ? "keras" : "center";
}

std::unique_ptr<BatchSource> tensor_source(Tensor images, Tensor labels, int64_t batch_size, bool shuffle,
                                           uint64_t seed, Device device, Shard shard, bool pad) {
  return std::make_unique<TensorSource>(std::move(images), std::move(labels), batch_size, shuffle, seed, device, shard,
                                        pad);
}

RunData make_run_data(const TrainConfig& c, Device device, int64_t image_size, Shard shard) {
  RunData r;
  const bool shuffle = !c.no_shuffle;
  if (c.data == "synthetic" && c.augment == "none") {
    const auto n = synthetic_part_counts(c);
    auto make = [&](int64_t per_class, uint64_t stream, bool train) -> std::unique_ptr<BatchSource> {
      if (per_class <= 0) return nullptr;
      auto s = data::make_synthetic_images(2 * per_class, image_size, c.seed * 4 + stream, c.synthetic_difficulty);
      return tensor_source(s.images, s.labels, c.batch_size, train && shuffle, c.seed * 4 + 4, device, shard, train);
    };
    r.train = make(n[0], 1, true);
    r.val = make(n[1], 2, false);
    r.test = make(n[2], 3, false);
    r.description = "synthetic " + std::to_string(image_size) + "x" + std::to_string(image_size) + ", " +
                    std::to_string(2 * n[0]) + " train / " + std::to_string(2 * n[1]) + " val / " +
                    std::to_string(2 * n[2]) + " test images";
    r.split = c.split;
    return r;
  }
  std::shared_ptr<const data::Dataset> d;
  std::string what;
  std::optional<DataAccount> account;
  std::vector<int64_t> usable;   // folder data: the indices of the usable files
  std::shared_ptr<data::Dataset> folder;
  if (c.data == "synthetic") {
    const auto n = synthetic_part_counts(c);
    d = data::synthetic_dataset(2 * (n[0] + n[1] + n[2]), image_size, c.seed * 4 + 1, c.synthetic_difficulty);
    what = "synthetic";
  } else {
    try {
      folder = data::open_image_folder(c.data);
    } catch (const Error& e) {
      throw UsageError("--data '" + c.data + "': " + e.what());
    }
    what = c.data;
    account.emplace();
    account->what = what;
    account->split = c.split;   // until folder_split() below: the messages of the checks before it
    account->classes = folder->class_names();
    account->files = account->usable = class_counts(*folder);
    check_classes(*account, false);
    usable = scan_folder(*folder, c, shard, &r.validation_report);
    account->upfront = folder->size() - static_cast<int64_t>(usable.size());
    account->usable = class_counts(*folder, &usable);
    check_classes(*account, false);
    d = static_cast<int64_t>(usable.size()) == folder->size() ? folder : data::subset(folder, usable);
  }
  const bool read_manifest = !c.manifest.empty() && std::filesystem::exists(c.manifest);
  r.split = c.split;
  if (account && !read_manifest) account->split = r.split = folder_split(c, *account, &r.split_note);
  const SplitSpec s = parse_split(r.split);
  data::Split split;
  if (read_manifest) {
    try {
      // Read against every file, so a manifest naming a file that has since become unreadable
      // still loads: that file is left out of its part, as it would be of a new split.
      split = folder ? usable_part(data::read_manifest(c.manifest, *folder), usable, folder->size())
                     : data::read_manifest(c.manifest, *d);
    } catch (const Error& e) {
      throw UsageError("--manifest '" + c.manifest + "': " + e.what());
    }
  } else {
    try {
      split = s.counts ? data::split_by_counts(*d, static_cast<int64_t>(s.parts[0]), static_cast<int64_t>(s.parts[1]),
                                               static_cast<int64_t>(s.parts[2]), c.seed)
                       : data::split_by_fractions(*d, s.parts[0], s.parts[1], s.parts[2], c.seed);
    } catch (const Error& e) {
      throw UsageError("--split " + c.split + " does not fit " + what + (account ? " (usable / files: " +
                       account->counts() + ")" : "") + ": " + e.what() +
                       (s.counts ? "; fractions fit any folder, e.g. --split " + std::string(kDefaultSplitFractions)
                                 : ""));
    }
    if (!c.manifest.empty()) {
      try {
        data::write_manifest(c.manifest, *d, split);
      } catch (const Error& e) {
        throw UsageError("--manifest '" + c.manifest + "' cannot be written (" + e.what() + "); give a path in a "
                         "writable folder");
      }
    }
  }
  if (account) {
    account->dataset = d;
    account->parts = split;
    account->late.assign(static_cast<size_t>(d->size()), 0);
    check_classes(*account, true);
  }
  const std::string counted =
      account ? " usable images, " + std::to_string(account->upfront) + " unreadable file" +
                    (account->upfront == 1 ? "" : "s") + " skipped"
              : " images";
  r.description = what + " (" + std::to_string(d->size()) + counted + "), " + std::to_string(split.train.size()) +
                  " train / " + std::to_string(split.val.size()) + " val / " + std::to_string(split.test.size()) +
                  " test, augment " + c.augment + (c.augment == "article" ? " (train and val twice)" : "") +
                  ", resize " + resolved_resize_mode(c);
  // --augment article doubles the training and validation parts (data/article_augment.h), not the test part.
  const bool article = c.augment == "article";
  // --data-cache over the parts in proportion to the images each loader reads (article: twice over).
  const int64_t copies = article ? 2 : 1;
  const auto all = static_cast<double>(copies * static_cast<int64_t>(split.train.size() + split.val.size()) +
                                       static_cast<int64_t>(split.test.size()));
  const auto share = [&](size_t images, int64_t times) {
    return static_cast<int64_t>(static_cast<double>(parse_bytes(c.data_cache)) * static_cast<double>(images) *
                                static_cast<double>(times) / std::max(1.0, all));
  };
  r.train = loader_source(d, split.train, c, device, image_size, true, c.seed, shard, share(split.train.size(), copies),
                          article);
  r.val = loader_source(d, split.val, c, device, image_size, false, c.seed, shard, share(split.val.size(), copies),
                        article);
  r.test = loader_source(d, split.test, c, device, image_size, false, c.seed, shard, share(split.test.size(), 1));
  r.account = std::move(account);
  if (!r.train) throw UsageError("--split " + r.split + " leaves no training images in " + what);
  return r;
}

}  // namespace minidl::train
