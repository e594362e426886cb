// The pieces of the programs' multi-rank mode that one process can check: each rank's shard of
// the in-memory training and evaluation sets (the union of the ranks' k-th batches is the
// one-process k-th batch; evaluation strides cover every image once), the effective batch and the
// learning-rate rule on it, the device per rank, and the one-process error handling of
// run_program. The 2-rank behaviour runs under mpirun in tests/distributed/programs_test.sh.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "core/ops.h"
#include "train/data_source.h"
#include "experiments/harness/ranks.h"

namespace minidl::harness {
namespace {

using namespace ::minidl::train;

// Images whose first pixel is their index, labels 0..n-1.
std::vector<int64_t> epoch_batches(int64_t n, int64_t batch, Shard shard, bool pad, int64_t epoch,
                                   std::vector<std::vector<int64_t>>* batches) {
  Tensor images = zeros({n, 3, 2, 2});
  Tensor labels = zeros({n}, {DType::i64, Device::cpu(), false});
  for (int64_t i = 0; i < n; ++i) images.data<float>()[i * 12] = static_cast<float>(i), labels.data<int64_t>()[i] = i;
  auto src = tensor_source(images, labels, batch, true, 7, Device::cpu(), shard, pad);
  src->start_epoch(epoch);
  std::vector<int64_t> all;
  while (auto b = src->next()) {
    std::vector<int64_t> ids;
    for (int64_t k = 0; k < b->labels.size(0); ++k) ids.push_back(b->labels.data<int64_t>()[k]);
    batches->push_back(ids);
    all.insert(all.end(), ids.begin(), ids.end());
  }
  EXPECT_EQ(static_cast<int64_t>(all.size()), src->size());
  return all;
}

TEST(ExperimentsRanks, TrainingShardsUnionIsTheOneProcessBatch) {
  for (int64_t epoch : {0, 3}) {
    std::vector<std::vector<int64_t>> one, r0, r1;
    epoch_batches(40, 16, {0, 1}, true, epoch, &one);
    epoch_batches(40, 8, {0, 2}, true, epoch, &r0);
    epoch_batches(40, 8, {1, 2}, true, epoch, &r1);
    ASSERT_EQ(one.size(), 3u);   // 16 + 16 + 8
    ASSERT_EQ(r0.size(), 3u);
    ASSERT_EQ(r1.size(), 3u);
    for (size_t k = 0; k < one.size(); ++k) {
      std::vector<int64_t> u = r0[k];
      u.insert(u.end(), r1[k].begin(), r1[k].end());
      std::sort(u.begin(), u.end());
      std::vector<int64_t> want = one[k];
      std::sort(want.begin(), want.end());
      EXPECT_EQ(u, want) << "epoch " << epoch << " batch " << k;
    }
  }
}

TEST(ExperimentsRanks, PaddedShardsAreEqualAndEvaluationStridesCoverOnce) {
  std::vector<std::vector<int64_t>> b;
  // 11 images on 3 ranks: padded to 4 each (one image counts twice), or 4 + 4 + 3 unpadded.
  std::vector<int64_t> padded, unpadded;
  for (int r = 0; r < 3; ++r) {
    const auto p = epoch_batches(11, 2, {r, 3}, true, 1, &b);
    EXPECT_EQ(p.size(), 4u);
    padded.insert(padded.end(), p.begin(), p.end());
    const auto u = epoch_batches(11, 2, {r, 3}, false, 0, &b);
    EXPECT_EQ(u.size(), r < 2 ? 4u : 3u);
    unpadded.insert(unpadded.end(), u.begin(), u.end());
  }
  std::sort(unpadded.begin(), unpadded.end());
  for (int64_t i = 0; i < 11; ++i) EXPECT_EQ(unpadded[static_cast<size_t>(i)], i);
  std::sort(padded.begin(), padded.end());
  EXPECT_EQ(std::unique(padded.begin(), padded.end()) - padded.begin(), 11);
}

TEST(ExperimentsRanks, EffectiveBatchAndLearningRateCountTheRanks) {
  TrainConfig c;
  c.batch_size = 8;
  c.accumulation_steps = 2;
  c.world_size = 4;
  c.lr = 0.1;
  c.base_batch = 32;
  c.lr_scaling = "linear";
  EXPECT_EQ(c.effective_batch(), 64);
  EXPECT_DOUBLE_EQ(c.scaled_lr(), 0.2);
  c.lr_scaling = "sqrt";
  EXPECT_NEAR(c.scaled_lr(), 0.1 * std::sqrt(2.0), 1e-12);
  c.world_size = 0;
  EXPECT_THROW(validate(c), UsageError);
}

TEST(ExperimentsRanks, DevicePerRank) {
  EXPECT_EQ(rank_device("cuda", {1, 4, 3}), "cuda:3");
  EXPECT_EQ(rank_device("cuda", {0, 1, 0}), "cuda");
  EXPECT_EQ(rank_device("cuda:1", {1, 4, 3}), "cuda:1");
  EXPECT_EQ(rank_device("cpu", {1, 4, 3}), "cpu");
}

TEST(ExperimentsRanks, OneProcessErrorsKeepTheProgramsStatuses) {
  const bool verbose = false;
  EXPECT_EQ(run_program("minidl-test", verbose, [](const Ranks& r) { return r.world_size == 1 ? 7 : 0; }), 7);
  testing::internal::CaptureStderr();
  EXPECT_EQ(run_program("minidl-test", verbose, [](const Ranks&) -> int { throw UsageError("--x: bad"); }), 2);
  EXPECT_EQ(run_program("minidl-test", verbose, [](const Ranks&) -> int { throw std::runtime_error("broken"); }), 1);
  const std::string err = testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("minidl-test: error: --x: bad\n"), std::string::npos) << err;
  EXPECT_NE(err.find("minidl-test: error: broken\n"), std::string::npos) << err;
}

}  // namespace
}  // namespace minidl::harness
