// Synchronised batch norm: W ranks x batch 8 of a (small-input) ResNet-18 take the same SGD step,
// and end with the same running statistics as one process on the whole batch of 8W; per-rank
// batch norm (the default) does not. Runs as one rank in the plain suite and as two under mpirun.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <memory>
#include <utility>
#include <vector>

#include "core/generator.h"
#include "core/ops.h"
#include "distributed/data_parallel.h"
#include "distributed/sync_batch_norm.h"
#include "nn/resnet.h"
#include "optim/sgd.h"

namespace minidl::distributed {
namespace {

// The largest |a - b| / (1 + |b|) over parameters and floating buffers.
double max_rel_diff(nn::Module& a, nn::Module& b) {
  double worst = 0.0;
  auto compare = [&](const std::vector<std::pair<std::string, Tensor>>& xa,
                     const std::vector<std::pair<std::string, Tensor>>& xb) {
    for (size_t i = 0; i < xa.size(); ++i) {
      const auto va = xa[i].second.to_vector();
      const auto vb = xb[i].second.to_vector();
      for (size_t j = 0; j < va.size(); ++j) worst = std::max(worst, std::abs(va[j] - vb[j]) / (1.0 + std::abs(vb[j])));
    }
  };
  compare(a.named_parameters(), b.named_parameters());
  compare(a.named_buffers(), b.named_buffers());
  return worst;
}

// One SGD step (momentum) on 8 rows per rank of 8x8 images: the reference process on all 8W rows,
// or this rank's replica on its 8 rows with DataParallel (and, when `synchronised`, SyncBN).
std::shared_ptr<nn::ResNet> one_step(bool data_parallel, bool synchronised) {
  ProcessGroup& g = world();
  const int64_t w = g.world_size();
  const int64_t r = g.rank();
  Generator init(1);
  auto model = nn::resnet18(2, &init, false, /*small_input=*/true);
  if (synchronised) {
    EXPECT_EQ(convert_sync_batch_norm(*model, g), 20);  // ResNet-18: 17 + 3 downsample BNs
  }
  std::unique_ptr<DataParallel> dp;
  if (data_parallel) dp = std::make_unique<DataParallel>(*model, g);
  optim::SGD opt(model->parameters(), {.lr = 0.1, .momentum = 0.9});
  Generator data(7);
  const Tensor x = randn({8 * w, 3, 8, 8}, {}, &data);
  std::vector<double> labels;
  for (int64_t i = 0; i < 8 * w; ++i) labels.push_back(static_cast<double>(i % 2));
  const Tensor y = from_vector(labels, {8 * w}, {.dtype = DType::i64});
  if (data_parallel) {
    cross_entropy((*dp)(x.slice(0, 8 * r, 8 * r + 8)), y.slice(0, 8 * r, 8 * r + 8)).backward();
    dp->finish_gradient_sync();
  } else {
    cross_entropy((*model)(x), y).backward();
  }
  opt.step();
  return model;
}

TEST(DistSyncBatchNorm, RanksTimesBatchEqualOneProcessOnTheWholeBatch) {
  auto ref = one_step(false, false);
  auto sync = one_step(true, true);
  EXPECT_LT(max_rel_diff(*sync, *ref), 1e-4);
  if (world().world_size() > 1) {
    // Per-rank statistics differ from the whole batch's: the comparison above can fail.
    auto per_rank = one_step(true, false);
    EXPECT_GT(max_rel_diff(*per_rank, *ref), 1e-3);
  }
}

}  // namespace
}  // namespace minidl::distributed
