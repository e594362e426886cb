// Datasets: the three folder layouts (detected, sorted classes, case-insensitive extensions), the
// lazily generated synthetic set, subsets, stratified seeded splits and the manifest round trip.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "data/dataset.h"
#include "data/synthetic.h"
#include "tests/data/fixtures.h"
#include "tests/support/error_of.h"

namespace minidl::data {
namespace {

using fixtures::encode_jpeg;
using fixtures::pattern;
using fixtures::TempDir;
using fixtures::write_bytes;

std::vector<uint8_t> small_jpeg(int seed) { return encode_jpeg(pattern(12, 16, seed)); }

TEST(SyntheticDataset, RendersTheSameImagesAsMakeSyntheticImagesQuantised) {
  const int64_t n = 9, s = 16;
  const auto ds = synthetic_dataset(n, s, 5);
  const auto ref = make_synthetic_images(n, s, 5);
  ASSERT_EQ(ds->size(), n);
  ASSERT_EQ(ds->class_names().size(), 2u);
  const float* f = ref.images.data<float>();
  const int64_t* labels = ref.labels.data<int64_t>();
  int64_t zeros = 0;
  for (int64_t i = 0; i < n; ++i) {
    EXPECT_EQ(ds->label(i), labels[i]);
    zeros += ds->label(i) == 0;
    const auto img = ds->load(i);
    ASSERT_TRUE(img.has_value());
    ASSERT_EQ(img->height, s);
    ASSERT_EQ(img->width, s);
    for (int64_t p = 0; p < s * s; ++p) {
      for (int64_t c = 0; c < 3; ++c) {
        const double v = std::clamp(127.5 + 42.5 * f[(i * 3 + c) * s * s + p], 0.0, 255.0);
        ASSERT_NEAR(img->pixels[static_cast<size_t>(p * 3 + c)], v, 0.51) << "image " << i << " pixel " << p;
      }
    }
  }
  EXPECT_EQ(zeros, (n + 1) / 2);
  EXPECT_EQ(ds->describe(3), "synthetic #3");
  // The second load comes from the dataset's memo: the same pixels.
  EXPECT_EQ(ds->load(4)->pixels, synthetic_dataset(n, s, 5)->load(4)->pixels);
}

TEST(SyntheticDataset, DependsOnTheSeed) {
  const auto a = synthetic_dataset(4, 16, 1), b = synthetic_dataset(4, 16, 2), c = synthetic_dataset(4, 16, 1);
  EXPECT_EQ(a->load(2)->pixels, c->load(2)->pixels);
  EXPECT_NE(a->load(2)->pixels, b->load(2)->pixels);
}

TEST(ImageFolder, ClassFoldersSortedWithAnyExtensionCase) {
  TempDir t;
  write_bytes(t.path() / "zebra" / "a.JPG", small_jpeg(1));
  write_bytes(t.path() / "zebra" / "sub" / "b.jpeg", small_jpeg(2));
  write_bytes(t.path() / "ant" / "c.Jpg", small_jpeg(3));
  write_bytes(t.path() / "ant" / "notes.txt", {'h', 'i'});
  write_bytes(t.path() / "empty_class" / "readme.md", {'x'});
  const auto ds = open_image_folder(t.path());
  EXPECT_EQ(layout_of(*ds), "class folders");
  ASSERT_EQ(ds->class_names(), (std::vector<std::string>{"ant", "zebra"}));
  ASSERT_EQ(ds->size(), 3);
  EXPECT_EQ(ds->label(0), 0);
  EXPECT_EQ(ds->key(0), "ant/c.Jpg");
  EXPECT_EQ(ds->key(1), "zebra/a.JPG");
  EXPECT_EQ(ds->key(2), "zebra/sub/b.jpeg");
  EXPECT_EQ(ds->label(2), 1);
  const auto img = ds->load(1);
  ASSERT_TRUE(img.has_value());
  EXPECT_EQ(img->height, 12);
  EXPECT_EQ(img->width, 16);
}

TEST(ImageFolder, KaggleFlatTakesLabelsFromNames) {
  TempDir t;
  write_bytes(t.path() / "train" / "dog.1.jpg", small_jpeg(1));
  write_bytes(t.path() / "train" / "cat.2.JPG", small_jpeg(2));
  write_bytes(t.path() / "train" / "cat.10.jpg", small_jpeg(3));
  for (const auto& root : {t.path() / "train", t.path()}) {
    const auto ds = open_image_folder(root);
    EXPECT_EQ(layout_of(*ds), "Kaggle flat");
    ASSERT_EQ(ds->class_names(), (std::vector<std::string>{"cat", "dog"}));
    ASSERT_EQ(ds->size(), 3);
    EXPECT_EQ(ds->label(0), 0);
    EXPECT_EQ(ds->label(1), 0);
    EXPECT_EQ(ds->label(2), 1);
    EXPECT_EQ(ds->key(2), "dog.1.jpg");
  }
}

TEST(ImageFolder, MicrosoftPetImages) {
  TempDir t;
  write_bytes(t.path() / "PetImages" / "Dog" / "1.jpg", small_jpeg(1));
  write_bytes(t.path() / "PetImages" / "Cat" / "1.jpg", small_jpeg(2));
  write_bytes(t.path() / "PetImages" / "Cat" / "Thumbs.db", {1, 2, 3});
  for (const auto& root : {t.path(), t.path() / "PetImages"}) {
    const auto ds = open_image_folder(root);
    EXPECT_EQ(layout_of(*ds), "PetImages");
    ASSERT_EQ(ds->class_names(), (std::vector<std::string>{"Cat", "Dog"}));
    ASSERT_EQ(ds->size(), 2);
    EXPECT_EQ(ds->key(1), "Dog/1.jpg");
  }
}

TEST(ImageFolder, NoImagesIsAClearError) {
  TempDir t;
  write_bytes(t.path() / "a" / "x.txt", {'x'});
  const std::string e = minidl::testing::error_of([&] { open_image_folder(t.path()); });
  EXPECT_NE(e.find("no images found"), std::string::npos) << e;
  EXPECT_NE(e.find("PetImages"), std::string::npos) << e;
  EXPECT_NE(minidl::testing::error_of([&] { open_image_folder(t.path() / "missing"); }).find("is not a folder"), std::string::npos);
  write_bytes(t.path() / "photo.jpg", small_jpeg(1));
  EXPECT_NE(minidl::testing::error_of([&] { open_image_folder(t.path()); }).find("<class>.<n>.<ext>"), std::string::npos);
}

TEST(Subset, RestrictsAndReorders) {
  const auto base = synthetic_dataset(10, 8, 3);
  const auto s = subset(base, {7, 2, 2});
  ASSERT_EQ(s->size(), 3);
  EXPECT_EQ(s->label(0), base->label(7));
  EXPECT_EQ(s->describe(0), "synthetic #7");
  EXPECT_EQ(s->load(1)->pixels, base->load(2)->pixels);
  EXPECT_NE(minidl::testing::error_of([&] { subset(base, {10}); }).find("out of range"), std::string::npos);
}

// Labels: class c for indices with i % 3 == c (three unequal classes when n is not a multiple).
class LabelledDataset final : public Dataset {
 public:
  explicit LabelledDataset(int64_t n) : n_(n) {}
  int64_t size() const override { return n_; }
  int64_t label(int64_t i) const override { return i % 3; }
  const std::vector<std::string>& class_names() const override { return names_; }
  std::optional<Image> load(int64_t) const override { return std::nullopt; }
  std::string describe(int64_t i) const override { return "item/" + std::to_string(i); }

 private:
  int64_t n_;
  std::vector<std::string> names_{"a", "b", "c"};
};

void expect_disjoint_and_stratified(const Dataset& d, const Split& s, int64_t tr, int64_t va, int64_t te) {
  std::set<int64_t> all;
  for (const auto* part : {&s.train, &s.val, &s.test}) all.insert(part->begin(), part->end());
  EXPECT_EQ(all.size(), s.train.size() + s.val.size() + s.test.size()) << "parts overlap";
  const auto per_class = [&](const std::vector<int64_t>& v) {
    std::vector<int64_t> c(d.class_names().size());
    for (int64_t i : v) ++c[static_cast<size_t>(d.label(i))];
    return c;
  };
  for (int64_t c : per_class(s.train)) EXPECT_EQ(c, tr);
  for (int64_t c : per_class(s.val)) EXPECT_EQ(c, va);
  for (int64_t c : per_class(s.test)) EXPECT_EQ(c, te);
}

TEST(Split, ByCountsIsStratifiedSeededAndDisjoint) {
  const LabelledDataset d(100);  // 34 / 33 / 33 per class
  const Split a = split_by_counts(d, 20, 6, 7, 42);
  expect_disjoint_and_stratified(d, a, 20, 6, 7);
  const Split b = split_by_counts(d, 20, 6, 7, 42);
  EXPECT_EQ(a.train, b.train);
  EXPECT_EQ(a.test, b.test);
  const Split c = split_by_counts(d, 20, 6, 7, 43);
  EXPECT_NE(a.train, c.train);
  const std::string e = minidl::testing::error_of([&] { split_by_counts(d, 30, 3, 1, 0); });
  EXPECT_NE(e.find("has 33 samples"), std::string::npos) << e;
}

TEST(Split, ByFractionsFloorsPerClass) {
  const LabelledDataset d(300);  // 100 per class
  const Split s = split_by_fractions(d, 0.6, 0.2, 0.2, 1);
  expect_disjoint_and_stratified(d, s, 60, 20, 20);
  EXPECT_NE(minidl::testing::error_of([&] { split_by_fractions(d, 0.7, 0.2, 0.2, 1); }).find("sum to at most 1"), std::string::npos);
}

TEST(Manifest, RoundTripAndMismatchesAreErrors) {
  TempDir t;
  const LabelledDataset d(30);
  const Split s = split_by_counts(d, 5, 2, 3, 9);
  const auto file = t.path() / "split.tsv";
  write_manifest(file, d, s);
  const Split r = read_manifest(file, d);
  EXPECT_EQ(r.train, s.train);
  EXPECT_EQ(r.val, s.val);
  EXPECT_EQ(r.test, s.test);

  const LabelledDataset smaller(20);  // items 20..29 are gone (the split uses every item)
  const std::string missing = minidl::testing::error_of([&] { read_manifest(file, smaller); });
  EXPECT_NE(missing.find("is not in the dataset"), std::string::npos) << missing;

  std::string text;
  {
    const auto bytes = fixtures::read_bytes(file);
    text.assign(bytes.begin(), bytes.end());
  }
  const size_t at = text.find("train\t");
  text[at + 6] = text[at + 6] == '0' ? '1' : '0';  // flip one label
  fixtures::write_bytes(t.path() / "bad.tsv", std::vector<uint8_t>(text.begin(), text.end()));
  EXPECT_NE(minidl::testing::error_of([&] { read_manifest(t.path() / "bad.tsv", d); }).find("in the manifest but"), std::string::npos);
  fixtures::write_bytes(t.path() / "junk.tsv", {'h', 'i', '\n'});
  EXPECT_NE(minidl::testing::error_of([&] { read_manifest(t.path() / "junk.tsv", d); }).find("minidl split manifest"), std::string::npos);
}

}  // namespace
}  // namespace minidl::data
