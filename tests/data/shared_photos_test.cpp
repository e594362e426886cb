// The real cats-vs-dogs photos of ../shared/data/catsdogs (skipped with a message when absent):
// layout and counts, the Keras study's 600 / 200 / 200 split, its manifest, decoding, and loader
// determinism across worker counts on real JPEGs.
#include <gtest/gtest.h>

#include <set>

#include "data/dataset.h"
#include "data/decode.h"
#include "data/loader.h"
#include "tests/data/fixtures.h"

namespace minidl::data {
namespace {

TEST(SharedPhotos, CountsAndLayout) {
  MINIDL_REQUIRE_SHARED_PHOTOS(root);
  const auto ds = open_image_folder(root);
  EXPECT_EQ(layout_of(*ds), "class folders");
  ASSERT_EQ(ds->class_names(), (std::vector<std::string>{"cat", "dog"}));
  ASSERT_EQ(ds->size(), 2000);
  int64_t cats = 0;
  for (int64_t i = 0; i < ds->size(); ++i) cats += ds->label(i) == 0;
  EXPECT_EQ(cats, 1000);
  EXPECT_EQ(ds->key(0).substr(0, 4), "cat/");
}

TEST(SharedPhotos, KerasSplitIsStratifiedAndTheManifestRoundTrips) {
  MINIDL_REQUIRE_SHARED_PHOTOS(root);
  const auto ds = open_image_folder(root);
  const Split s = split_by_counts(*ds, 600, 200, 200, 2024);
  ASSERT_EQ(s.train.size(), 1200u);
  ASSERT_EQ(s.val.size(), 400u);
  ASSERT_EQ(s.test.size(), 400u);
  for (const auto* part : {&s.train, &s.val, &s.test}) {
    int64_t dogs = 0;
    for (int64_t i : *part) dogs += ds->label(i);
    EXPECT_EQ(dogs * 2, static_cast<int64_t>(part->size())) << "each part is half dogs";
  }
  std::set<int64_t> all(s.train.begin(), s.train.end());
  all.insert(s.val.begin(), s.val.end());
  all.insert(s.test.begin(), s.test.end());
  EXPECT_EQ(all.size(), 2000u);

  fixtures::TempDir t;
  write_manifest(t.path() / "split.tsv", *ds, s);
  const Split r = read_manifest(t.path() / "split.tsv", *ds);
  EXPECT_EQ(r.train, s.train);
  EXPECT_EQ(r.val, s.val);
  EXPECT_EQ(r.test, s.test);
  // Another seed, another split.
  EXPECT_NE(split_by_counts(*ds, 600, 200, 200, 2025).train, s.train);
}

TEST(SharedPhotos, DecodesAndLoaderIsDeterministicAcrossWorkerCounts) {
  MINIDL_REQUIRE_SHARED_PHOTOS(root);
  const auto ds = open_image_folder(root);
  const auto img = ds->load(0);
  ASSERT_TRUE(img.has_value());
  EXPECT_GT(img->height, 30);
  EXPECT_EQ(img->pixels.size(), static_cast<size_t>(img->height * img->width * 3));
  const auto part = subset(ds, {0, 1, 2, 3, 4, 5, 1000, 1001, 1002, 1003, 1004});
  std::vector<std::vector<double>> runs[3];
  const int workers[3] = {0, 1, 3};
  for (int k = 0; k < 3; ++k) {
    LoaderOptions o;
    o.batch_size = 4;
    o.workers = workers[k];
    o.seed = 5;
    o.transform.size = 64;
    o.transform.augment = Augment::RandomResizedCrop;
    Loader l(part, o);
    for (int64_t epoch : {0, 1}) {
      l.start_epoch(epoch);
      while (auto b = l.next()) {
        runs[k].push_back(b->images.to_vector());
        runs[k].push_back(b->labels.to_vector());
      }
    }
  }
  ASSERT_EQ(runs[0].size(), 12u);
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
}

}  // namespace
}  // namespace minidl::data
