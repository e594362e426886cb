// The distributed sampler: shards are disjoint, cover the dataset, have equal lengths under the
// documented tail rule, and the union over ranks is the same order for every world size. The
// metric reduction is checked across the real ranks when run under mpirun.
#include <gtest/gtest.h>

#include <algorithm>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "data/dataset.h"
#include "data/loader.h"
#include "distributed/sampler.h"

namespace minidl::distributed {
namespace {

// The epoch's order rebuilt from the shards: element i of rank r's shard is position r + i * W.
std::vector<int64_t> interleave(const std::vector<std::vector<int64_t>>& shards) {
  std::vector<int64_t> out;
  for (size_t i = 0; i < shards[0].size(); ++i) {
    for (const auto& s : shards) {
      if (i < s.size()) out.push_back(s[i]);
    }
  }
  return out;
}

std::vector<std::vector<int64_t>> all_shards(int64_t n, int world, SamplerOptions o, int64_t epoch) {
  std::vector<std::vector<int64_t>> shards;
  for (int r = 0; r < world; ++r) shards.push_back(DistributedSampler(n, r, world, o).indices(epoch));
  return shards;
}

TEST(DistSampler, ShardsAreDisjointCoverTheSetAndKeepOneOrderForEveryWorldSize) {
  const int64_t n = 103;
  const auto one = DistributedSampler(n, 0, 1, {.seed = 5}).indices(2);
  ASSERT_EQ(one, DistributedSampler::epoch_order(n, true, 5, 2));
  EXPECT_NE(one, DistributedSampler::epoch_order(n, true, 5, 3)) << "the shuffle must change per epoch";
  for (int world : {2, 3, 4, 8}) {
    const auto uneven = all_shards(n, world, {.seed = 5, .tail = Tail::Uneven}, 2);
    std::set<int64_t> seen;
    size_t total = 0;
    for (const auto& s : uneven) {
      total += s.size();
      seen.insert(s.begin(), s.end());
      EXPECT_LE(s.size(), uneven[0].size());
      EXPECT_GE(s.size() + 1, uneven[0].size());
    }
    EXPECT_EQ(total, static_cast<size_t>(n)) << "world " << world << ": disjoint shards hold n samples";
    EXPECT_EQ(seen.size(), static_cast<size_t>(n)) << "world " << world << ": shards cover the set";
    EXPECT_EQ(interleave(uneven), one) << "world " << world << ": the union keeps the one-process order";

    const auto padded = all_shards(n, world, {.seed = 5, .tail = Tail::Pad}, 2);
    const int64_t per = (n + world - 1) / world;
    std::set<int64_t> pseen;
    for (const auto& s : padded) {
      EXPECT_EQ(static_cast<int64_t>(s.size()), per) << "world " << world;
      pseen.insert(s.begin(), s.end());
    }
    EXPECT_EQ(pseen.size(), static_cast<size_t>(n));
    const auto pu = interleave(padded);
    EXPECT_TRUE(std::equal(one.begin(), one.end(), pu.begin())) << "padding only appends";
    EXPECT_TRUE(std::equal(pu.begin() + n, pu.end(), one.begin())) << "padding repeats the order's start";

    const auto dropped = all_shards(n, world, {.seed = 5, .tail = Tail::Drop}, 2);
    for (const auto& s : dropped) EXPECT_EQ(static_cast<int64_t>(s.size()), n / world);
    const auto du = interleave(dropped);
    EXPECT_TRUE(std::equal(du.begin(), du.end(), one.begin())) << "drop keeps the order's head";
  }
  // No shuffle: plain strides.
  EXPECT_EQ(DistributedSampler(7, 1, 2, {.shuffle = false, .tail = Tail::Uneven}).indices(0),
            (std::vector<int64_t>{1, 3, 5}));
}

// A dataset whose label is the sample's index, to read the loader's order off its labels.
class IndexLabels final : public data::Dataset {
 public:
  explicit IndexLabels(int64_t n) : names_(static_cast<size_t>(n), "c") {}
  int64_t size() const override { return static_cast<int64_t>(names_.size()); }
  int64_t label(int64_t i) const override { return i; }
  const std::vector<std::string>& class_names() const override { return names_; }
  std::optional<data::Image> load(int64_t) const override { return data::Image{4, 4, std::vector<uint8_t>(48, 9)}; }
  std::string describe(int64_t i) const override { return "index #" + std::to_string(i); }

 private:
  std::vector<std::string> names_;
};

TEST(DistSampler, OneRankIsTheLoadersOwnShuffle) {
  auto ds = std::make_shared<IndexLabels>(37);
  data::LoaderOptions o;
  o.batch_size = 37;
  o.workers = 0;
  o.seed = 12;
  o.transform.size = 4;
  o.transform.resize = 4;
  data::Loader loader(ds, o);
  for (int64_t epoch : {0, 3}) {
    loader.start_epoch(epoch);
    const auto labels = loader.next()->labels.to_vector();
    const auto order = DistributedSampler(37, 0, 1, {.seed = 12}).indices(epoch);
    ASSERT_EQ(labels.size(), order.size());
    for (size_t i = 0; i < order.size(); ++i) EXPECT_EQ(labels[i], static_cast<double>(order[i])) << i;
  }
}

TEST(DistSampler, ShardDatasetAndReducedMetricOverTheRealRanks) {
  ProcessGroup& g = world();
  std::shared_ptr<const data::Dataset> base = data::synthetic_dataset(/*n=*/21, /*image_size=*/8, /*seed=*/1);
  DistributedSampler s(base->size(), g.rank(), g.world_size(), {.seed = 3, .tail = Tail::Uneven});
  auto mine = shard(base, s, 0);
  ASSERT_EQ(mine->size(), s.num_samples());
  // Every rank counts its shard's samples of class 1; the reduced share is the whole set's.
  double ones = 0;
  for (int64_t i = 0; i < mine->size(); ++i) ones += mine->label(i) == 1 ? 1.0 : 0.0;
  double expected = 0;
  for (int64_t i = 0; i < base->size(); ++i) expected += base->label(i) == 1 ? 1.0 : 0.0;
  expected /= static_cast<double>(base->size());
  EXPECT_GT(expected, 0.0);
  EXPECT_DOUBLE_EQ(reduce_mean(g, ones, static_cast<double>(mine->size())), expected);
  EXPECT_EQ(g.allreduce(static_cast<double>(mine->size()), ReduceOp::Sum), static_cast<double>(base->size()));
}

}  // namespace
}  // namespace minidl::distributed
