// The loader: batch shapes, dtypes and layouts, normalisation, per-epoch order fixed by (seed,
// epoch) whatever the worker count (augmentation included), drop_last, skipping of unreadable
// samples, the RAM cache, statistics and the CUDA device option in a CPU build.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <chrono>
#include <map>
#include <set>
#include <thread>

#include "core/backend.h"
#include "data/loader.h"
#include "data/transform.h"
#include "tests/support/error_of.h"

namespace minidl::data {
namespace {

// Images whose pixels encode the sample index (so a batch tells which samples it holds), some of
// them unreadable; counts load() calls.
class IndexedDataset final : public Dataset {
 public:
  IndexedDataset(int64_t n, int64_t h, int64_t w, std::set<int64_t> bad = {}) : n_(n), h_(h), w_(w), bad_(std::move(bad)) {}
  int64_t size() const override { return n_; }
  int64_t label(int64_t i) const override { return i % 2; }
  const std::vector<std::string>& class_names() const override { return names_; }
  std::optional<Image> load(int64_t i) const override {
    ++loads;
    if (bad_.count(i)) return std::nullopt;
    Image img{h_, w_, std::vector<uint8_t>(static_cast<size_t>(h_ * w_ * 3))};
    for (int64_t p = 0; p < h_ * w_; ++p) {
      img.pixels[static_cast<size_t>(p * 3)] = static_cast<uint8_t>(i);
      img.pixels[static_cast<size_t>(p * 3 + 1)] = static_cast<uint8_t>((p % w_) * 255 / std::max<int64_t>(1, w_ - 1));
      img.pixels[static_cast<size_t>(p * 3 + 2)] = static_cast<uint8_t>((p / w_) * 255 / std::max<int64_t>(1, h_ - 1));
    }
    return img;
  }
  std::string describe(int64_t i) const override { return "indexed #" + std::to_string(i); }
  mutable std::atomic<int64_t> loads{0};

 private:
  int64_t n_, h_, w_;
  std::set<int64_t> bad_;
  std::vector<std::string> names_{"even", "odd"};
};

LoaderOptions plain(int64_t batch, int workers) {
  LoaderOptions o;
  o.batch_size = batch;
  o.workers = workers;
  o.transform.size = 8;
  o.transform.resize = 8;
  o.transform.normalize = false;
  return o;
}

// The sample indices of a batch (red channel of pixel 0, unnormalised NCHW f32).
std::vector<int64_t> ids(const Batch& b) {
  std::vector<int64_t> out;
  const int64_t plane = b.images.size(2) * b.images.size(3);
  const float* p = b.images.data<float>();
  for (int64_t i = 0; i < b.images.size(0); ++i) out.push_back(std::lround(p[i * 3 * plane] * 255.0f));
  return out;
}

std::vector<std::vector<double>> epoch_values(Loader& l, int64_t epoch) {
  l.start_epoch(epoch);
  std::vector<std::vector<double>> out;
  while (auto b = l.next()) {
    out.push_back(b->images.to_vector());
    const auto lab = b->labels.to_vector();
    out.push_back(lab);
  }
  return out;
}

TEST(Loader, ShapesLabelsAndEveryIndexOncePerEpoch) {
  const auto ds = std::make_shared<IndexedDataset>(23, 8, 8);
  Loader l(ds, plain(5, 2));
  EXPECT_EQ(l.batches_per_epoch(), 5);
  l.start_epoch(0);
  std::vector<int64_t> seen;
  int64_t batches = 0;
  while (auto b = l.next()) {
    ++batches;
    ASSERT_EQ(b->images.shape(), (Shape{b->labels.size(0), 3, 8, 8}));
    EXPECT_EQ(b->images.dtype(), DType::f32);
    EXPECT_EQ(b->labels.dtype(), DType::i64);
    const auto id = ids(*b);
    for (size_t k = 0; k < id.size(); ++k) EXPECT_EQ(b->labels.to_vector()[k], static_cast<double>(id[k] % 2));
    seen.insert(seen.end(), id.begin(), id.end());
  }
  EXPECT_EQ(batches, 5);
  EXPECT_FALSE(l.next().has_value()) << "the epoch stays finished until start_epoch";
  std::vector<int64_t> sorted = seen;
  std::sort(sorted.begin(), sorted.end());
  for (int64_t i = 0; i < 23; ++i) EXPECT_EQ(sorted[static_cast<size_t>(i)], i);
  EXPECT_NE(seen, sorted) << "shuffle on: the order should not be the identity";
  EXPECT_EQ(l.stats().images, 23);
}

TEST(Loader, OrderDependsOnSeedAndEpochOnly) {
  const auto ds = std::make_shared<IndexedDataset>(40, 8, 8);
  auto order = [&](int workers, uint64_t seed, int64_t epoch, bool shuffle = true) {
    LoaderOptions o = plain(7, workers);
    o.seed = seed;
    o.shuffle = shuffle;
    Loader l(ds, o);
    l.start_epoch(epoch);
    std::vector<int64_t> v;
    while (auto b = l.next()) {
      const auto id = ids(*b);
      v.insert(v.end(), id.begin(), id.end());
    }
    return v;
  };
  const auto a = order(0, 1, 0);
  EXPECT_EQ(order(1, 1, 0), a);
  EXPECT_EQ(order(3, 1, 0), a);
  EXPECT_NE(order(2, 1, 1), a);
  EXPECT_NE(order(2, 2, 0), a);
  const auto id = order(2, 1, 0, false);
  for (int64_t i = 0; i < 40; ++i) EXPECT_EQ(id[static_cast<size_t>(i)], i);
}

TEST(Loader, AugmentedBatchesIdenticalForZeroOneAndThreeWorkers) {
  const auto ds = std::make_shared<IndexedDataset>(19, 30, 40, std::set<int64_t>{4, 11});
  for (Augment aug : {Augment::RandomResizedCrop, Augment::Keras, Augment::None}) {
    std::vector<std::vector<std::vector<double>>> runs;
    for (int workers : {0, 1, 3}) {
      LoaderOptions o = plain(4, workers);
      o.transform.augment = aug;
      o.transform.size = 16;
      o.transform.resize = aug == Augment::Keras ? 20 : 18;
      o.transform.normalize = true;
      o.seed = 77;
      o.prefetch_batches = 1;
      Loader l(ds, o);
      auto e0 = epoch_values(l, 0);
      auto e1 = epoch_values(l, 1);
      e0.insert(e0.end(), e1.begin(), e1.end());
      runs.push_back(e0);
      EXPECT_EQ(l.stats().skipped, 2);
    }
    EXPECT_EQ(runs[0], runs[1]) << "augment " << static_cast<int>(aug);
    EXPECT_EQ(runs[0], runs[2]) << "augment " << static_cast<int>(aug);
    ASSERT_EQ(runs[0].size(), 2u * 2u * 5u);  // 17 readable samples: 5 batches per epoch, images + labels
    if (aug != Augment::None) {
      EXPECT_NE(runs[0][0], runs[0][10]) << "epochs 0 and 1 should draw differently";
    }
  }
}

// LoaderOptions::sampler (a distributed sampler's shard): the loader reads exactly the given
// indices in that order, repeats included, and augments each sample as the shuffled loader does
// (the draws are keyed by the sample's index, not its position), so shards of one epoch's order
// hold the images of the one-process epoch.
TEST(Loader, SamplerGivesTheOrderAndKeepsEachSamplesAugmentation) {
  const auto ds = std::make_shared<IndexedDataset>(12, 30, 40);
  LoaderOptions o = plain(4, 2);
  o.transform.augment = Augment::RandomResizedCrop;
  o.transform.size = 16;
  o.seed = 5;
  // The shuffled epoch 1, one image per sample (batch 1), by sample index.
  LoaderOptions one = o;
  one.batch_size = 1;
  Loader full(ds, one);
  full.start_epoch(1);
  std::map<int64_t, std::vector<double>> image_of;
  while (auto b = full.next()) image_of[ids(*b)[0]] = b->images.to_vector();
  ASSERT_EQ(image_of.size(), 12u);

  const std::vector<int64_t> shard{7, 2, 11, 2, 0};   // repeats, as a padded shard has
  o.sampler = [&](int64_t epoch) { return epoch == 1 ? shard : std::vector<int64_t>{3}; };
  Loader l(ds, o);
  EXPECT_EQ(l.batches_per_epoch(), 1) << "epoch 0's list: 1 sample";
  l.start_epoch(1);
  std::vector<int64_t> seen;
  while (auto b = l.next()) {
    const int64_t plane = b->images.numel() / b->images.size(0);
    const auto v = b->images.to_vector();
    const auto id = ids(*b);
    for (size_t k = 0; k < id.size(); ++k) {
      const std::vector<double> img(v.begin() + static_cast<int64_t>(k) * plane,
                                    v.begin() + static_cast<int64_t>(k + 1) * plane);
      EXPECT_EQ(img, image_of[id[k]]) << "sample " << id[k] << " augmented differently";
    }
    seen.insert(seen.end(), id.begin(), id.end());
  }
  EXPECT_EQ(seen, shard);
  l.start_epoch(0);
  auto b = l.next();
  ASSERT_TRUE(b.has_value());
  EXPECT_EQ(ids(*b), std::vector<int64_t>{3});

  o.sampler = [](int64_t) { return std::vector<int64_t>{12}; };
  Loader bad(ds, o);
  EXPECT_THROW(bad.start_epoch(0), Error);
}

TEST(Loader, SkipsUnreadableSamplesAndDropLast) {
  const auto ds = std::make_shared<IndexedDataset>(10, 8, 8, std::set<int64_t>{0, 5, 9});
  LoaderOptions o = plain(3, 2);
  o.shuffle = false;
  Loader l(ds, o);
  std::vector<std::vector<int64_t>> got;
  l.start_epoch(0);
  while (auto b = l.next()) got.push_back(ids(*b));
  EXPECT_EQ(got, (std::vector<std::vector<int64_t>>{{1, 2, 3}, {4, 6, 7}, {8}}));
  EXPECT_EQ(l.stats().skipped, 3);
  o.drop_last = true;
  Loader d(ds, o);
  EXPECT_EQ(d.batches_per_epoch(), 3);
  got.clear();
  d.start_epoch(0);
  while (auto b = d.next()) got.push_back(ids(*b));
  EXPECT_EQ(got, (std::vector<std::vector<int64_t>>{{1, 2, 3}, {4, 6, 7}}));
}

TEST(Loader, NormalizeF16AndChannelsLast) {
  const auto ds = std::make_shared<IndexedDataset>(6, 8, 8);
  LoaderOptions o = plain(6, 1);
  o.shuffle = false;
  o.transform.normalize = true;
  Loader ref(ds, o);
  const Batch a = *ref.next();
  const float* p = a.images.data<float>();
  // Sample 3, channel 0 holds 3/255 everywhere: (3/255 - 0.485) / 0.229.
  EXPECT_NEAR(p[3 * 3 * 64 + 5], (3.0f / 255.0f - 0.485f) / 0.229f, 1e-6);
  // Channel 1 is a ramp along x: 255 at x = 7 -> (1 - 0.456) / 0.224.
  EXPECT_NEAR(p[(3 * 3 + 1) * 64 + 7], (1.0f - 0.456f) / 0.224f, 1e-6);

  o.dtype = DType::f16;
  Loader h(ds, o);
  const Batch b = *h.next();
  EXPECT_EQ(b.images.dtype(), DType::f16);
  EXPECT_TRUE(allclose(b.images.to(DType::f32), a.images, 1e-3, 1e-3));

  o.dtype = DType::f32;
  o.channels_last = true;
  Loader c(ds, o);
  const Batch n = *c.next();
  ASSERT_EQ(n.images.shape(), (Shape{6, 8, 8, 3}));
  EXPECT_TRUE(n.images.is_contiguous());
  EXPECT_EQ(n.images.permute({0, 3, 1, 2}).contiguous().to_vector(), a.images.to_vector());
}

TEST(Loader, CenterCropAndFlipGeometry) {
  // 10 x 20 image, resize 10 keeps it; the centre 8 x 8 crop starts at column 6, row 1.
  const auto ds = std::make_shared<IndexedDataset>(2, 10, 20);
  LoaderOptions o = plain(2, 0);
  o.shuffle = false;
  o.transform.resize = 10;
  Loader l(ds, o);
  const Batch b = *l.next();
  const float* p = b.images.data<float>();
  const float x0 = p[1 * 64 + 0] * 255.0f, y0 = p[2 * 64 + 0] * 255.0f;  // green = column ramp, blue = row ramp
  EXPECT_NEAR(x0, std::floor(6 * 255.0 / 19), 0.6);
  EXPECT_NEAR(y0, std::floor(1 * 255.0 / 9), 0.6);

  // With Keras augmentation of a square image the size of the crop: only the flip is random,
  // and about half the samples come out mirrored.
  const auto sq = std::make_shared<IndexedDataset>(200, 8, 8);
  LoaderOptions k = plain(200, 2);
  k.transform.augment = Augment::Keras;
  k.transform.resize = 8;
  Loader kl(sq, k);
  const Batch kb = *kl.next();
  const float* q = kb.images.data<float>();
  int flipped = 0;
  for (int64_t i = 0; i < 200; ++i) {
    const float left = q[(i * 3 + 1) * 64 + 0], right = q[(i * 3 + 1) * 64 + 7];
    ASSERT_NE(left, right);
    flipped += left > right;
  }
  EXPECT_GT(flipped, 70);
  EXPECT_LT(flipped, 130);
}

TEST(Loader, RandomResizedCropBoxesFollowTorchvisionRanges) {
  const uint64_t key = epoch_key(5, 0, 1);
  double area_sum = 0;
  for (int64_t i = 0; i < 2000; ++i) {
    const CropBox b = random_resized_crop_box(375, 500, key, i);
    ASSERT_GT(b.height, 0);
    ASSERT_GE(b.top, 0);
    ASSERT_LE(b.top + b.height, 375);
    ASSERT_LE(b.left + b.width, 500);
    const double frac = static_cast<double>(b.height * b.width) / (375.0 * 500.0);
    ASSERT_GE(frac, 0.07);
    const double ratio = static_cast<double>(b.width) / static_cast<double>(b.height);
    if (frac < 0.999) {  // not the fallback
      ASSERT_GT(ratio, 0.74);
      ASSERT_LT(ratio, 1.35);
    }
    area_sum += frac;
  }
  // Scale is uniform in (0.08, 1) before rejection; large boxes are rejected more often.
  EXPECT_GT(area_sum / 2000, 0.4);
  EXPECT_LT(area_sum / 2000, 0.56);
}

TEST(Loader, CacheDecodesOnceAndGivesTheSameBatches) {
  const auto ds = std::make_shared<IndexedDataset>(12, 20, 24, std::set<int64_t>{3});
  LoaderOptions o = plain(4, 2);
  o.transform.augment = Augment::RandomResizedCrop;
  o.cache = true;
  Loader cached(ds, o);
  const auto e0 = epoch_values(cached, 0);
  EXPECT_EQ(ds->loads.load(), 12);
  const auto e1 = epoch_values(cached, 1);
  EXPECT_EQ(ds->loads.load(), 12) << "epoch 1 should come from the cache (the bad sample is remembered too)";
  EXPECT_EQ(cached.stats().cached_images, 11);
  EXPECT_EQ(cached.stats().cached_bytes, 11 * 20 * 24 * 3);
  o.cache = false;
  Loader plain_loader(ds, o);
  EXPECT_EQ(epoch_values(plain_loader, 1), e1);
  EXPECT_NE(e0, e1);
}

TEST(Loader, StatsWaitAndRestartMidEpoch) {
  const auto ds = std::make_shared<IndexedDataset>(50, 8, 8);
  Loader l(ds, plain(5, 2));
  l.start_epoch(0);
  ASSERT_TRUE(l.next().has_value());
  l.start_epoch(0);  // restart while workers are busy: a fresh epoch 0
  int64_t n = 0;
  while (auto b = l.next()) n += b->labels.size(0);
  EXPECT_EQ(n, 50);
  const LoaderStats s = l.stats();
  EXPECT_EQ(s.images, 55);
  EXPECT_GT(s.wall_seconds, 0);
  EXPECT_GE(s.wait_seconds, 0);
  EXPECT_LE(s.wait_seconds, s.wall_seconds);
  EXPECT_GT(s.images_per_second(), 0);
  l.reset_stats();
  EXPECT_EQ(l.stats().images, 0);
}

// A batch-size schedule changes the batch between epochs on the same loader: the RAM cache is
// kept (no sample decoded twice), the order is the epoch's whatever the batch, and a set in the
// middle of an epoch ends it.
TEST(Loader, SetBatchSizeTakesEffectAtTheNextEpochAndKeepsTheCache) {
  const auto ds = std::make_shared<IndexedDataset>(30, 8, 8, std::set<int64_t>{7});
  LoaderOptions o = plain(4, 2);
  o.cache = true;
  Loader l(ds, o);
  const auto epoch = [&](int64_t e, std::vector<int64_t>* sizes) {
    l.start_epoch(e);
    std::vector<int64_t> order;
    while (auto b = l.next()) {
      sizes->push_back(b->labels.size(0));
      const auto id = ids(*b);
      order.insert(order.end(), id.begin(), id.end());
    }
    return order;
  };
  std::vector<int64_t> small, large, sized;
  const auto order4 = epoch(1, &small);
  EXPECT_EQ(small, (std::vector<int64_t>{4, 4, 4, 4, 4, 4, 4, 1})) << "29 readable samples";
  l.set_batch_size(16);
  EXPECT_EQ(l.batches_per_epoch(), 2);
  const auto order16 = epoch(1, &large);
  EXPECT_EQ(large, (std::vector<int64_t>{16, 13}));
  EXPECT_EQ(order16, order4) << "the same epoch, cut into larger batches";
  EXPECT_EQ(ds->loads.load(), 30) << "the cache survives the change";
  // Set in the middle of an epoch: that epoch ends; the next start_epoch uses the new size.
  l.start_epoch(2);
  ASSERT_TRUE(l.next().has_value());
  l.set_batch_size(8);
  epoch(2, &sized);
  EXPECT_EQ(sized, (std::vector<int64_t>{8, 8, 8, 5}));
  EXPECT_THROW(l.set_batch_size(0), Error);
}

TEST(Loader, SyntheticImagesPassThroughUnresampledAtTheirSize) {
  const auto ds = synthetic_dataset(10, 16, 4);
  LoaderOptions o = plain(10, 2);
  o.shuffle = false;
  o.transform.size = 16;
  o.transform.resize = 16;
  Loader l(ds, o);
  const Batch b = *l.next();
  ASSERT_EQ(b.images.shape(), (Shape{10, 3, 16, 16}));
  const float* p = b.images.data<float>();
  for (int64_t i = 0; i < 10; ++i) {
    EXPECT_EQ(b.labels.data<int64_t>()[i], ds->label(i));
    const Image img = *ds->load(i);
    for (int64_t c = 0; c < 3; ++c) {
      for (int64_t q = 0; q < 256; ++q) {
        ASSERT_EQ(p[(i * 3 + c) * 256 + q], static_cast<float>(img.pixels[static_cast<size_t>(q * 3 + c)]) / 255.0f);
      }
    }
  }
}

TEST(Loader, DefaultResizesFollowTorchvisionAndKeras) {
  TransformOptions t;
  t.size = 224;
  EXPECT_EQ(resolved_resize(t), 224);
  EXPECT_EQ(imagenet_resize(224), 256);
  EXPECT_EQ(imagenet_resize(64), 73);
  t.augment = Augment::Keras;
  t.size = 200;
  EXPECT_EQ(resolved_resize(t), 250);
  // None: the shorter side becomes resize, the longer one int(resize * long / short).
  t.augment = Augment::None;
  t.resize = 100;
  const Image tall = make_base(Image{300, 200, std::vector<uint8_t>(300 * 200 * 3, 9)}, t);
  EXPECT_EQ(tall.width, 100);
  EXPECT_EQ(tall.height, 150);
  t.augment = Augment::Keras;
  const Image sq = make_base(Image{300, 200, std::vector<uint8_t>(300 * 200 * 3, 9)}, t);
  EXPECT_EQ(sq.width, 100);
  EXPECT_EQ(sq.height, 100);
}

// A dataset whose load() takes `ms` milliseconds, like a slow disk.
class SlowDataset final : public Dataset {
 public:
  SlowDataset(int64_t n, int ms) : n_(n), ms_(ms) {}
  int64_t size() const override { return n_; }
  int64_t label(int64_t) const override { return 0; }
  const std::vector<std::string>& class_names() const override { return names_; }
  std::optional<Image> load(int64_t) const override {
    std::this_thread::sleep_for(std::chrono::milliseconds(ms_));
    return Image{8, 8, std::vector<uint8_t>(8 * 8 * 3, 1)};
  }
  std::string describe(int64_t i) const override { return "slow #" + std::to_string(i); }

 private:
  int64_t n_;
  int ms_;
  std::vector<std::string> names_{"only"};
};

TEST(Loader, WaitFractionSeparatesPrefetchingFromDecodingInline) {
  const auto ds = std::make_shared<SlowDataset>(32, 2);
  // Inline decoding: the training loop does nothing else, so it waits nearly all the time.
  Loader inline_loader(ds, plain(4, 0));
  while (inline_loader.next()) {
  }
  EXPECT_GT(inline_loader.stats().wait_fraction(), 0.8);
  // Two workers (8 ms of loading per batch, 4 ms each) behind a 30 ms training step: after the
  // first batch the next one is always ready (generous bounds: the machine may be loaded).
  Loader prefetching(ds, plain(4, 2));
  while (prefetching.next()) std::this_thread::sleep_for(std::chrono::milliseconds(30));
  EXPECT_LT(prefetching.stats().wait_fraction(), 0.5);
  EXPECT_EQ(prefetching.stats().images, 32);
}

TEST(Loader, OptionErrorsAndCudaDeviceWithoutCuda) {
  const auto ds = std::make_shared<IndexedDataset>(4, 8, 8);
  LoaderOptions o = plain(0, 1);
  EXPECT_NE(minidl::testing::error_of([&] { Loader l(ds, o); }).find("batch_size"), std::string::npos);
  o = plain(2, 1);
  o.transform.resize = 4;
  EXPECT_NE(minidl::testing::error_of([&] { Loader l(ds, o); }).find("smaller than the crop"), std::string::npos);
  o = plain(2, 1);
  o.dtype = DType::i32;
  EXPECT_NE(minidl::testing::error_of([&] { Loader l(ds, o); }).find("f32 or f16"), std::string::npos);
  if (cuda_available()) GTEST_SKIP() << "a CUDA device is present: the CPU-build error path does not apply";
  o = plain(2, 1);
  o.device = Device::cuda(0);
  Loader l(ds, o);
  const std::string e = minidl::testing::error_of([&] { l.next(); });
  EXPECT_FALSE(e.empty());
}

}  // namespace
}  // namespace minidl::data
