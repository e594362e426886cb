// The Keras article's offline augmentation (issue 33) against Pillow: the bicubic and bilinear
// filters on a committed pattern (exact), Keras' load_img and the article's 250 upscale + top-left
// crop on shared photos (exact, by hash), and the dataset view that doubles a set with it. The
// reference is tests/golden/data/article.safetensors from tools/make_golden_article.py (Pillow 9.4).
#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <sstream>

#include "data/article_augment.h"
#include "data/decode.h"
#include "data/loader.h"
#include "data/resize.h"
#include "data/transform.h"
#include "tests/support/e2e_golden.h"
#include "tests/support/safetensors_reader.h"

namespace minidl::data {
namespace {

const e2e::Golden& article_golden() {
  static const e2e::Golden g = [] {
    e2e::Golden r;
    r.tensors = testing::read_safetensors(testing::golden_path("data/article.safetensors"), &r.metadata);
    return r;
  }();
  return g;
}

std::vector<std::string> listed(const std::string& key) {
  std::vector<std::string> out;
  std::stringstream in(article_golden().metadata.at(key));
  for (std::string item; std::getline(in, item, ',');) out.push_back(item);
  return out;
}

Image golden_image(const std::string& prefix) {
  const e2e::Golden& g = article_golden();
  const auto shape = g.at(prefix + ".shape").to_vector();
  const Tensor& px = g.at(prefix + ".pixels");
  return {static_cast<int64_t>(shape[0]), static_cast<int64_t>(shape[1]),
          std::vector<uint8_t>(px.data<uint8_t>(), px.data<uint8_t>() + px.numel())};
}

// Keras' load_img(path, target_size=(s, s)): a squash with PIL's NEAREST.
TransformOptions keras_load(int64_t size) {
  TransformOptions t;
  t.size = size;
  t.fit = Fit::Squash;
  t.interpolation = Interpolation::Nearest;
  return t;
}

Image loaded(const Image& decoded, const TransformOptions& t) {
  Image out{t.size, t.size, std::vector<uint8_t>(static_cast<size_t>(t.size * t.size * 3))};
  apply_transform(make_base(decoded, t), t, 0, 0, out.pixels.data());
  return out;
}

TEST(ArticleAugment, BicubicAndBilinearMatchPillowExactly) {
  const Image src = golden_image("pattern");
  int checked = 0;
  for (const std::string& wh : listed("pattern_sizes")) {
    const int64_t w = std::stoll(wh.substr(0, wh.find('x'))), h = std::stoll(wh.substr(wh.find('x') + 1));
    for (const auto& [name, f] : {std::pair<std::string, ResampleFilter>{"bicubic", ResampleFilter::Bicubic},
                                  {"bilinear", ResampleFilter::Bilinear}}) {
      SCOPED_TRACE(name + " " + wh);
      Image out{h, w, std::vector<uint8_t>(static_cast<size_t>(w * h * 3))};
      resize_rgb(src.pixels.data(), src.width, src.height, src.width * 3, out.pixels.data(), w, h, f);
      e2e::expect_image(article_golden(), name + "." + wh, out);
      ++checked;
    }
  }
  EXPECT_GE(checked, 8) << "the golden lists the pattern's sizes; was tools/make_golden_article.py run?";
}

TEST(ArticleAugment, KerasLoadAndTheArticlesCropMatchPillowOnPhotos) {
  const auto photos = listed("photos");
  const auto dir = e2e::photos_dir();
  for (const auto& rel : photos)
    if (!std::filesystem::exists(dir / rel)) GTEST_SKIP() << e2e::kNoPhotos;
  const int64_t size = std::stoll(article_golden().metadata.at("size"));
  for (const std::string& rel : photos) {
    SCOPED_TRACE(rel);
    const DecodeResult r = decode_file(dir / rel);
    ASSERT_TRUE(r.ok()) << r.error;
    const Image first = loaded(*r.image, keras_load(size));
    e2e::expect_image(article_golden(), "loaded." + rel, first);
    e2e::expect_image(article_golden(), "crop." + rel, article_crop(first));
  }
}

TEST(ArticleAugment, DatasetHoldsEachImageTwiceTheSameEveryTime) {
  const auto base = synthetic_dataset(6, 24, 3);
  const TransformOptions t = keras_load(16);
  const auto d = article_augmented(base, t);
  ASSERT_EQ(d->size(), 12);
  EXPECT_EQ(d->class_names(), base->class_names());
  for (int64_t i = 0; i < 6; ++i) {
    SCOPED_TRACE(i);
    EXPECT_EQ(d->label(i), base->label(i));
    EXPECT_EQ(d->label(6 + i), base->label(i));
    const Image as_loaded = loaded(*base->load(i), t);
    EXPECT_EQ(d->load(i)->pixels, as_loaded.pixels);
    const Image crop = *d->load(6 + i);
    EXPECT_EQ(crop.pixels, article_crop(as_loaded).pixels);
    EXPECT_NE(crop.pixels, as_loaded.pixels);
    EXPECT_EQ(d->load(6 + i)->pixels, crop.pixels);  // deterministic
    EXPECT_EQ(d->describe(6 + i), base->describe(i) + " (article crop)");
  }
  TransformOptions random = t;
  random.augment = Augment::Keras;
  EXPECT_THROW(article_augmented(base, random), Error);
}

// The crop of a 4x4 image: a 5x5 bicubic upscale (round(4 * 1.25) = 5) and its top-left 4x4.
TEST(ArticleAugment, CropIsTheTopLeftCornerOfTheUpscale) {
  Image img{4, 4, std::vector<uint8_t>(48)};
  for (size_t i = 0; i < img.pixels.size(); ++i) img.pixels[i] = static_cast<uint8_t>(i * 5);
  std::vector<uint8_t> big(5 * 5 * 3);
  resize_rgb(img.pixels.data(), 4, 4, 12, big.data(), 5, 5, ResampleFilter::Bicubic);
  const Image crop = article_crop(img);
  for (int64_t y = 0; y < 4; ++y)
    for (int64_t x = 0; x < 12; ++x)
      ASSERT_EQ(crop.pixels[static_cast<size_t>(y * 12 + x)], big[static_cast<size_t>(y * 15 + x)]);
}

// Both copies are shuffled together: every epoch sees all 2n images once, in an order that mixes
// originals and crops and changes with the epoch.
TEST(ArticleAugment, LoaderShufflesBothCopiesTogether) {
  const auto d = article_augmented(synthetic_dataset(16, 20, 5), keras_load(16));
  LoaderOptions o;
  o.batch_size = 32;
  o.workers = 0;
  o.transform = keras_load(16);
  o.transform.normalize = false;
  Loader loader(d, o);
  std::vector<std::vector<double>> epochs;
  for (int64_t e = 0; e < 2; ++e) {
    loader.start_epoch(e);
    const auto b = loader.next();
    ASSERT_TRUE(b.has_value());
    ASSERT_EQ(b->images.size(0), 32);
    EXPECT_FALSE(loader.next().has_value());
    epochs.push_back(b->images.to_vector());
  }
  EXPECT_NE(epochs[0], epochs[1]);
  const int64_t per = 3 * 16 * 16;
  std::multiset<std::vector<double>> a, b;
  for (int64_t i = 0; i < 32; ++i) {
    a.insert({epochs[0].begin() + i * per, epochs[0].begin() + (i + 1) * per});
    b.insert({epochs[1].begin() + i * per, epochs[1].begin() + (i + 1) * per});
  }
  EXPECT_EQ(a, b);
  EXPECT_EQ(a.size(), 32u);
}

}  // namespace
}  // namespace minidl::data
