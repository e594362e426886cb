// The batch sources of data_source.h: in-memory synthetic tensors, and the threaded data::Loader
// for folders and augmentation.
#include "experiments/harness/data_source.h"

#include <algorithm>
#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <numeric>
#include <random>
#include <vector>

#include "data/article_augment.h"
#include "data/synthetic.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "data/transform.h"
#include "dist/sampler.h"

namespace minidl::harness {
namespace {

using Clock = std::chrono::steady_clock;

class TensorSource final : public BatchSource {
 public:
  TensorSource(Tensor images, Tensor labels, int64_t batch, bool shuffle, uint64_t seed, Device device, Shard shard,
               bool pad)
      : images_(images.contiguous()), labels_(labels.to(DType::i64).contiguous()), batch_(batch),
        shuffle_(shuffle), seed_(seed), device_(device), shard_(shard), pad_(pad) {
    MINIDL_CHECK(images_.dim() == 4 && images_.size(0) == labels_.size(0), "harness: tensor_source expects images "
                 "[N, C, H, W] and labels [N], got ", shape_str(images_.shape()), " and ", shape_str(labels_.shape()));
    MINIDL_CHECK(shard.world >= 1 && shard.rank >= 0 && shard.rank < shard.world, "harness: tensor_source: rank ",
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
      // of it, padded from its start, as dist::DistributedSampler does with the loader's order.
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
    MINIDL_CHECK(static_cast<int64_t>(order_.size()) >= pos_ + n, "harness: tensor_source: next() before start_epoch()");
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

// Images per class of each part for the synthetic set.
std::array<int64_t, 3> synthetic_counts(const TrainConfig& c) {
  const SplitSpec s = parse_split(c.split);
  std::array<int64_t, 3> n{};
  const int64_t per_class = c.synthetic_size > 0 ? c.synthetic_size : 1000;
  for (size_t i = 0; i < 3; ++i) {
    n[i] = s.counts ? static_cast<int64_t>(s.parts[i]) : static_cast<int64_t>(s.parts[i] * per_class);
  }
  if (n[0] <= 0) throw UsageError("--split " + c.split + " leaves no training images");
  return n;
}

class LoaderSource final : public BatchSource {
 public:
  LoaderSource(std::shared_ptr<const data::Dataset> d, data::LoaderOptions o) : loader_(std::move(d), std::move(o)) {}
  int64_t size() const override { return size_; }
  int64_t batches_per_epoch() const override { return loader_.batches_per_epoch(); }
  void start_epoch(int64_t epoch) override { loader_.start_epoch(epoch); }
  void set_batch_size(int64_t size) override { loader_.set_batch_size(size); }
  std::optional<TensorBatch> next() override {
    auto b = loader_.next();
    if (!b) return std::nullopt;
    return TensorBatch{b->images, b->labels};
  }
  double wait_seconds() const override { return loader_.stats().wait_seconds; }
  int64_t skipped() const override { return loader_.stats().skipped; }
  int64_t size_ = 0;

 private:
  data::Loader loader_;
};

// `article`: the part enters twice, as the article's offline augmentation saved it (--augment article).
std::unique_ptr<BatchSource> loader_source(std::shared_ptr<const data::Dataset> base, std::vector<int64_t> idx,
                                           const TrainConfig& c, Device device, int64_t image_size, bool training,
                                           uint64_t seed, Shard shard, bool article = false) {
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
  o.transform.size = image_size;
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
  std::shared_ptr<const data::Dataset> part = data::subset(std::move(base), std::move(idx));
  if (article) {
    // Both copies come out of the view at the final size, which the loader's squash leaves alone.
    part = data::article_augmented(std::move(part), o.transform);
    o.transform.fit = data::Fit::Squash;
    o.transform.resize = 0;
  }
  const int64_t n = part->size();
  if (training && shard.world > 1) {
    // This rank's shard of each epoch's order (dist::DistributedSampler over the loader's own
    // shuffle, padded): the union of the ranks' shards is the one-process epoch, and each sample's
    // augmentation is drawn as in the one-process run (keyed by its index, not its position).
    const dist::DistributedSampler sampler(n, shard.rank, shard.world, {o.shuffle, o.seed, dist::Tail::Pad});
    o.sampler = [sampler](int64_t epoch) { return sampler.indices(epoch); };
    auto src = std::make_unique<LoaderSource>(std::move(part), o);
    src->size_ = sampler.num_samples();
    return src;
  }
  auto src = std::make_unique<LoaderSource>(std::move(part), o);
  src->size_ = n;
  return src;
}

std::vector<int64_t> per_class(const data::Dataset& d, const std::vector<int64_t>* idx) {
  std::vector<int64_t> n(d.class_names().size(), 0);
  const int64_t count = idx ? static_cast<int64_t>(idx->size()) : d.size();
  for (int64_t k = 0; k < count; ++k) ++n[static_cast<size_t>(d.label(idx ? (*idx)[static_cast<size_t>(k)] : k))];
  return n;
}

std::string class_counts(const data::Dataset& d, const std::vector<int64_t>& n) {
  std::string s;
  for (size_t c = 0; c < n.size(); ++c) s += (c ? ", " : "") + d.class_names()[c] + " " + std::to_string(n[c]);
  return s;
}

}  // namespace

std::string resolved_resize_mode(const TrainConfig& c) {
  if (c.resize != "auto") return c.resize;
  return c.model == "smallcnn" ? "keras" : "center";
}

void check_classes(const data::Dataset& d, const std::string& what, const std::string& split,
                   const data::Split* parts) {
  const std::vector<int64_t> all = per_class(d, nullptr);
  if (all.size() < 2)
    throw UsageError("--data '" + what + "': " + std::to_string(all.size()) + " class (" + class_counts(d, all) +
                     "); training needs at least two classes (a folder per class, or a Kaggle / PetImages layout)");
  for (size_t c = 0; c < all.size(); ++c)
    if (all[c] == 0)
      throw UsageError("--data '" + what + "': class '" + d.class_names()[c] + "' has no usable images (" +
                       class_counts(d, all) + "); training needs images of every class");
  if (!parts) return;
  const std::pair<const char*, const std::vector<int64_t>*> named[] = {
      {"training", &parts->train}, {"validation", &parts->val}, {"test", &parts->test}};
  for (const auto& [name, idx] : named) {
    if (idx->empty()) continue;   // a part the split does not ask for
    const std::vector<int64_t> n = per_class(d, idx);
    for (size_t c = 0; c < n.size(); ++c)
      if (n[c] == 0)
        throw UsageError("--split " + split + " leaves class '" + d.class_names()[c] + "' without " + name +
                         " images in '" + what + "' (" + name + " part: " + class_counts(d, n) + "; usable: " +
                         class_counts(d, all) + ")");
  }
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
    const auto n = synthetic_counts(c);
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
    return r;
  }
  std::shared_ptr<data::Dataset> d;
  std::string what;
  if (c.data == "synthetic") {
    const auto n = synthetic_counts(c);
    d = data::synthetic_dataset(2 * (n[0] + n[1] + n[2]), image_size, c.seed * 4 + 1, c.synthetic_difficulty);
    what = "synthetic";
  } else {
    try {
      d = data::open_image_folder(c.data);
    } catch (const Error& e) {
      throw UsageError("--data '" + c.data + "': " + e.what());
    }
    what = c.data;
    check_classes(*d, what, c.split);
    if (c.validate_data) {
      // Every file decoded once, up front: the unreadable ones leave the dataset before the split,
      // so no part is short of images and the counts below are usable images.
      const data::ValidationReport rep = data::validate_dataset(*d, std::max(1, c.workers));
      r.validation_report = rep.text();
      if (!rep.unreadable.empty()) {
        std::vector<int64_t> keep;
        size_t u = 0;
        for (int64_t i = 0; i < d->size(); ++i) {
          if (u < rep.unreadable.size() && rep.unreadable[u].index == i) ++u;
          else keep.push_back(i);
        }
        d = data::subset(d, std::move(keep));
        check_classes(*d, what, c.split);
      }
    }
  }
  const SplitSpec s = parse_split(c.split);
  data::Split split;
  if (!c.manifest.empty() && std::filesystem::exists(c.manifest)) {
    try {
      split = data::read_manifest(c.manifest, *d);
    } catch (const Error& e) {
      throw UsageError("--manifest '" + c.manifest + "': " + e.what());
    }
  } else {
    try {
      split = s.counts ? data::split_by_counts(*d, static_cast<int64_t>(s.parts[0]), static_cast<int64_t>(s.parts[1]),
                                               static_cast<int64_t>(s.parts[2]), c.seed)
                       : data::split_by_fractions(*d, s.parts[0], s.parts[1], s.parts[2], c.seed);
    } catch (const Error& e) {
      throw UsageError("--split " + c.split + " does not fit " + what + ": " + e.what());
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
  if (c.data != "synthetic") check_classes(*d, what, c.split, &split);
  // Without --validate-data an unreadable file is only found when first read (then skipped): the
  // count is of files, not of usable images.
  const std::string counted = c.data == "synthetic" ? " images" : c.validate_data ? " usable images" : " files";
  r.description = what + " (" + std::to_string(d->size()) + counted + "), " + std::to_string(split.train.size()) +
                  " train / " + std::to_string(split.val.size()) + " val / " + std::to_string(split.test.size()) +
                  " test, augment " + c.augment + (c.augment == "article" ? " (train and val twice)" : "") +
                  ", resize " + resolved_resize_mode(c);
  // --augment article doubles the training and validation parts (data/article_augment.h), not the test part.
  const bool article = c.augment == "article";
  r.train = loader_source(d, split.train, c, device, image_size, true, c.seed, shard, article);
  r.val = loader_source(d, split.val, c, device, image_size, false, c.seed, shard, article);
  r.test = loader_source(d, split.test, c, device, image_size, false, c.seed, shard);
  if (!r.train) throw UsageError("--split " + c.split + " leaves no training images in " + what);
  return r;
}

}  // namespace minidl::harness
