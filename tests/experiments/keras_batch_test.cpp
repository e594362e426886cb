// The keras-batch study as the article ran it (issue 33): its protocol (lines, batches, epochs,
// split, Keras' optimizer defaults, three seeds), --augment article doubling the training and
// validation parts only, and the outputs of a study with seeds: the means table with the published
// values beside ours and the plot data with error bars, from a results.csv written here.
#include <gtest/gtest.h>

#include <fstream>
#include <map>
#include <set>

#include "train/data_source.h"
#include "experiments/harness/seed_summary.h"
#include "experiments/harness/sweep.h"
#include "tests/experiments/helpers.h"

namespace minidl::harness {
namespace {

TEST(ExperimentsKerasBatch, StudyFollowsTheArticlesProtocol) {
  TrainConfig base;
  base.seed = 7;
  const Study s = make_study("keras-batch", false, base);
  EXPECT_EQ(s.seeds, 3);
  std::map<std::string, std::set<int64_t>> batches;
  std::set<std::string> ids;
  std::map<std::string, std::set<uint64_t>> seeds;
  for (const auto& r : s.runs) {
    const TrainConfig& c = r.config;
    EXPECT_TRUE(ids.insert(r.id).second) << r.id;
    batches[r.group].insert(c.batch_size);
    seeds[r.group + std::to_string(c.batch_size)].insert(c.seed);
    EXPECT_EQ(c.model, "smallcnn");
    EXPECT_EQ(c.image_size, 200);
    EXPECT_EQ(c.split, "600,200,200");
    EXPECT_EQ(c.epochs, 5);
    EXPECT_EQ(c.normalize, "imagenet") << "synthetic data keeps its scale; photos get 1/255";
    EXPECT_EQ(c.resolved_weight_decay(), 0.0);
    if (c.optimizer == "sgd") {
      EXPECT_DOUBLE_EQ(c.lr, 0.01);
      EXPECT_DOUBLE_EQ(c.momentum, 0.0);
      EXPECT_FALSE(c.nesterov);
    } else {
      EXPECT_EQ(c.optimizer, "adam");
      EXPECT_DOUBLE_EQ(c.lr, 0.001);
      EXPECT_DOUBLE_EQ(c.beta1, 0.9);
      EXPECT_DOUBLE_EQ(c.beta2, 0.999);
      EXPECT_DOUBLE_EQ(c.eps, 1e-7);
      EXPECT_EQ(c.eps_mode, "keras");
    }
  }
  EXPECT_EQ(s.runs.size(), 42u);
  EXPECT_EQ(batches["sgd, augment none"], (std::set<int64_t>{16, 32, 64, 128}));
  EXPECT_EQ(batches["adam, augment none"], (std::set<int64_t>{16, 32, 64, 128, 256}));
  EXPECT_EQ(batches["adam, augment article"], (std::set<int64_t>{16, 32, 64, 128, 256}));
  EXPECT_EQ(batches.size(), 3u);
  for (const auto& [cell, sd] : seeds) EXPECT_EQ(sd, (std::set<uint64_t>{7, 8, 9})) << cell;
  EXPECT_EQ(s.runs.front().id, "b16-sgd-none-s7");
  EXPECT_EQ(s.runs.front().config.seed, s.runs[13].config.seed) << "seeds outermost: a whole seed first";
  TrainConfig photos;
  photos.data = "/photos";
  EXPECT_EQ(make_study("keras-batch", false, photos).runs.front().config.normalize, "unit");
  ASSERT_EQ(s.published.size(), 4u);
  const Study quick = make_study("keras-batch", true, base);
  EXPECT_EQ(quick.runs.size(), 42u);
  EXPECT_EQ(quick.runs.front().config.image_size, 32);
  EXPECT_EQ(quick.runs.front().config.epochs, 3);
}

TEST(ExperimentsKerasBatch, ArticleAugmentDoublesTrainingAndValidationOnly) {
  TrainConfig c = testing::tiny_config();
  c.augment = "article";
  EXPECT_NO_THROW(validate(c));
  const RunData article = make_run_data(c, Device::cpu(), 8);
  EXPECT_EQ(article.train->size(), 64);   // 16 per class, twice
  EXPECT_EQ(article.val->size(), 32);
  EXPECT_EQ(article.test->size(), 16);
  EXPECT_NE(article.description.find("augment article (train and val twice)"), std::string::npos) << article.description;
  int64_t seen = 0;
  article.train->start_epoch(0);
  while (auto b = article.train->next()) seen += b->images.size(0);
  EXPECT_EQ(seen, 64);
  c.augment = "articles";
  EXPECT_THROW(validate(c), UsageError);
  c.augment = "none";
  c.eps_mode = "tf";
  EXPECT_THROW(validate(c), UsageError);
}

// A results.csv row with the given fields (the others empty).
Row row(const std::map<std::string, std::string>& fields) {
  Row r(results_header().size());
  for (size_t i = 0; i < r.size(); ++i) {
    const auto it = fields.find(results_header()[i]);
    if (it != fields.end()) r[i] = it->second;
  }
  return r;
}

TEST(ExperimentsKerasBatch, SeedsGiveMeansSpreadPublishedValuesAndErrorBars) {
  const auto dir = testing::temp_dir();
  Study st = make_study("keras-batch", true, TrainConfig{});
  const auto add = [&](const std::string& id, const std::string& group, const std::string& batch,
                       const std::string& acc, const std::string& status) {
    append_csv_row(dir / "results.csv", results_header(),
                   row({{"run_id", id}, {"group", group}, {"effective_batch", batch}, {"batch_size", batch},
                        {"test_acc", acc}, {"best_val_acc", acc}, {"status", status}, {"images_per_s", "100.0"}}));
  };
  add("b16-sgd-none-s0", "sgd, augment none", "16", "0.6000", "ok");
  add("b16-sgd-none-s1", "sgd, augment none", "16", "0.7000", "ok");
  add("b16-sgd-none-s2", "sgd, augment none", "16", "0.8000", "ok");
  add("b64-adam-none-s0", "adam, augment none", "64", "0.9000", "ok");
  add("b64-adam-none-s1", "adam, augment none", "64", "", "diverged");
  const std::vector<SeedCell> cells = seed_cells(st, read_csv(dir / "results.csv"));
  ASSERT_EQ(cells.size(), 14u);
  EXPECT_EQ(cells[0].group, "sgd, augment none");
  EXPECT_DOUBLE_EQ(cells[0].mean(), 0.7);
  EXPECT_NEAR(cells[0].sd(), 0.1, 1e-12);
  ASSERT_TRUE(cells[0].published.has_value());
  EXPECT_DOUBLE_EQ(*cells[0].published, 0.62);
  EXPECT_EQ(cells[6].batch, 64);
  EXPECT_EQ(cells[6].statuses, "1 diverged, 1 ok");
  EXPECT_EQ(cells[6].sd(), 0.0);

  write_study_outputs(st, dir);
  std::ifstream md(dir / "summary.md");
  const std::string summary((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  EXPECT_NE(summary.find("| sgd, augment none | 16 | 3 of 3 | 0.7000 ± 0.1000 | 0.6000 - 0.8000 | 0.7000 | 0.620 |"),
            std::string::npos) << summary;
  EXPECT_NE(summary.find("| adam, augment none | 64 | 1 of 3 | 0.9000 ± 0.0000 |"), std::string::npos) << summary;
  EXPECT_NE(summary.find("| adam, augment article | 256 | 0 of 3 | - | - | - | 0.575 | - | not run |"),
            std::string::npos) << summary;
  EXPECT_NE(summary.find("validation_data=train_it"), std::string::npos) << summary;
  std::ifstream dat(dir / "keras-batch.png.dat");
  const std::string data((std::istreambuf_iterator<char>(dat)), std::istreambuf_iterator<char>());
  EXPECT_NE(data.find("errbars=1; nlines=2; pointcolors='1 2'"), std::string::npos) << data;
  EXPECT_NE(data.find("\"sgd, augment none\" \"y\" \"error\"\n16.000000 0.700000 0.100000\n"), std::string::npos) << data;
  EXPECT_NE(data.find("\"published: adam, augment none\" \"y\" \"error\"\n64.000000 0.670000 0.000000\n"),
            std::string::npos) << data;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace minidl::harness
