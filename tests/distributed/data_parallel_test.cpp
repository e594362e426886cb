// DataParallel's contract, checked against one process training on the whole batch: W ranks x
// batch b give the parameters of 1 rank x batch W*b (up to reduction order) for SGD, Adam and
// gradient accumulation; micro-batches inside no_sync never communicate; every rank skips the same
// steps. Runs as one rank in the plain suite and as two under mpirun (ctest distributed.mpi2.*).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <memory>
#include <string>

#include "core/generator.h"
#include "core/ops.h"
#include "distributed/data_parallel.h"
#include "nn/layers.h"
#include "nn/recompute.h"
#include "nn/resnet.h"
#include "optim/accumulation.h"
#include "optim/adam.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"
#include "tests/support/error_of.h"

namespace minidl::distributed {
namespace {
using minidl::testing::error_of;

constexpr int64_t kPerRank = 8;

std::shared_ptr<nn::Sequential> mlp(uint64_t seed) {
  Generator gen(seed);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Linear>(8, 16, true, &gen));
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::Linear>(16, 4, true, &gen));
  return m;
}

Tensor mse(const Tensor& out, const Tensor& target) { return mean(square(out - target)); }

// The largest |a - b| / (1 + |b|) over all parameters.
double max_rel_diff(nn::Module& a, nn::Module& b) {
  const auto pa = a.parameters();
  const auto pb = b.parameters();
  double worst = 0.0;
  for (size_t i = 0; i < pa.size(); ++i) {
    const auto va = pa[i].to_vector();
    const auto vb = pb[i].to_vector();
    for (size_t j = 0; j < va.size(); ++j) worst = std::max(worst, std::abs(va[j] - vb[j]) / (1.0 + std::abs(vb[j])));
  }
  return worst;
}

// Whether every rank holds exactly the same parameters (max and min over ranks agree).
bool same_on_every_rank(ProcessGroup& g, nn::Module& m) {
  bool same = true;
  for (const Tensor& p : m.parameters()) {
    Tensor hi = p.detach().clone();
    Tensor lo = p.detach().clone();
    g.allreduce(hi, ReduceOp::Max);
    g.allreduce(lo, ReduceOp::Min);
    same = same && hi.to_vector() == lo.to_vector();
  }
  return same;
}

// Runs 5 steps on the same global batches two ways: the reference model on all W*b rows in this
// process, the data-parallel replica on this rank's b rows; returns the largest difference.
double parity(const std::function<std::unique_ptr<optim::Optimizer>(nn::Module&)>& make_opt) {
  ProcessGroup& g = world();
  const int64_t w = g.world_size();
  const int64_t r = g.rank();
  auto ref = mlp(100);
  auto replica = mlp(100 + static_cast<uint64_t>(r));  // differs off rank 0 until the broadcast
  DataParallel dp(*replica, g);
  EXPECT_EQ(max_rel_diff(*replica, *ref), 0.0) << "parameters were not broadcast from rank 0";
  auto opt_ref = make_opt(*ref);
  auto opt = make_opt(*replica);
  Generator data(7);
  for (int step = 0; step < 5; ++step) {
    const Tensor x = randn({kPerRank * w, 8}, {}, &data);
    const Tensor y = randn({kPerRank * w, 4}, {}, &data);
    mse((*ref)(x), y).backward();
    opt_ref->step();
    opt_ref->zero_grad();
    const Tensor xr = x.slice(0, r * kPerRank, (r + 1) * kPerRank);
    const Tensor yr = y.slice(0, r * kPerRank, (r + 1) * kPerRank);
    mse(dp(xr), yr).backward();
    dp.finish_gradient_sync();
    opt->step();
    opt->zero_grad();
  }
  EXPECT_TRUE(same_on_every_rank(g, *replica));
  return max_rel_diff(*replica, *ref);
}

TEST(DistDataParallel, MatchesOneProcessOnTheWholeBatchWithSgd) {
  const double d = parity([](nn::Module& m) {
    return std::make_unique<optim::SGD>(m.parameters(), optim::SgdOptions{.lr = 0.1, .momentum = 0.9});
  });
  EXPECT_LT(d, 1e-5);
}

TEST(DistDataParallel, MatchesOneProcessOnTheWholeBatchWithAdam) {
  const double d = parity([](nn::Module& m) {
    return std::make_unique<optim::Adam>(m.parameters(), optim::AdamOptions{.lr = 1e-2});
  });
  EXPECT_LT(d, 1e-5);
}

// W ranks x micro-batch 4 x accumulation 2 == one process on 8W rows; the micro-batch that does not
// step makes no collective call, the one that steps makes one per bucket.
TEST(DistDataParallel, AccumulationSynchronisesOncePerEffectiveBatch) {
  ProcessGroup& g = world();
  const int64_t w = g.world_size();
  const int64_t r = g.rank();
  auto ref = mlp(3);
  auto replica = mlp(3);
  DataParallel dp(*replica, g, {.bucket_cap_mib = 1e-4});  // ~100 bytes: one bucket per parameter
  ASSERT_EQ(dp.buckets().size(), 4u);
  EXPECT_EQ(dp.buckets().front(), std::vector<size_t>{3});  // reverse order: the last bias first
  optim::SGD opt_ref(ref->parameters(), {.lr = 0.05, .momentum = 0.9});
  optim::SGD opt(replica->parameters(), {.lr = 0.05, .momentum = 0.9});
  optim::AccumulatingTrainer trainer(opt, {.sync = &dp});
  const auto plan = optim::plan_accumulation({4, 4}, 2);
  Generator data(11);
  for (int step = 0; step < 5; ++step) {
    const Tensor x = randn({kPerRank * w, 8}, {}, &data);
    const Tensor y = randn({kPerRank * w, 4}, {}, &data);
    mse((*ref)(x), y).backward();
    opt_ref.step();
    opt_ref.zero_grad();
    for (int64_t m = 0; m < 2; ++m) {
      const int64_t lo = r * kPerRank + 4 * m;
      g.reset_counters();
      const bool stepped = trainer.micro_batch(mse(dp(x.slice(0, lo, lo + 4)), y.slice(0, lo, lo + 4)), plan[m]);
      EXPECT_EQ(stepped, m == 1);
      EXPECT_EQ(g.counters().allreduce, m == 1 ? 4 : 0) << "micro-batch " << m << " of step " << step;
    }
  }
  EXPECT_LT(max_rel_diff(*replica, *ref), 1e-5);
  EXPECT_TRUE(same_on_every_rank(g, *replica));
}

// --checkpoint optimal under data parallelism: the plan's profile at the first step runs backwards
// of its own, which DataParallel's gradient hooks must not hear of (they would average the
// profile's gradients, then refuse the step's as a second backward). The step under a plan that
// recomputes gives every rank the parameters of the same step without recomputation.
TEST(DistDataParallel, OptimalRecomputationTrainsAsWithoutIt) {
  ProcessGroup& g = world();
  Generator data(40 + static_cast<uint64_t>(g.rank()));
  const Tensor x = randn({2, 3, 8, 8}, {}, &data);
  std::vector<std::vector<double>> after[2];
  for (const bool optimal : {false, true}) {
    Generator init(31);
    auto m = nn::resnet18(4, &init, false, true);
    DataParallel dp(*m, g);
    int64_t limit = 0;
    if (optimal) {   // a third of the way from the least peak any plan reaches to keeping everything
      const nn::ChainProfile p = nn::profile_chain(m->chain(), x);
      const int64_t least = nn::least_peak_bytes(p.stages, p.input_bytes);
      const std::vector<nn::StageMode> all(p.stages.size(), nn::StageMode::KeepAll);
      limit = least + (nn::evaluate(p.stages, p.input_bytes, all).predicted_peak_bytes - least) / 3;
    }
    nn::Recomputer rc(*m, nn::RecomputeMode::parse(optimal ? "optimal" : "none"), limit);
    optim::SGD opt(m->parameters(), {.lr = 0.1});
    dp.sync_buffers();
    mean(rc.forward(x)).backward();
    dp.finish_gradient_sync();
    opt.step();
    if (optimal) {
      ASSERT_NE(rc.plan(), nullptr);
      EXPECT_TRUE(std::any_of(rc.plan()->modes.begin(), rc.plan()->modes.end(),
                              [](nn::StageMode s) { return s != nn::StageMode::KeepAll; }))
          << rc.describe();
    }
    EXPECT_TRUE(same_on_every_rank(g, *m));
    for (const Tensor& p : m->parameters()) after[optimal].push_back(p.to_vector());
  }
  EXPECT_EQ(after[0], after[1]);
}

TEST(DistDataParallel, BucketsStartDuringBackwardUnlessOverlapIsOff) {
  ProcessGroup& g = world();
  for (bool overlap : {true, false}) {
    auto m = mlp(5);
    DataParallel dp(*m, g, {.bucket_cap_mib = 1e-4, .overlap = overlap});
    g.reset_counters();
    mse(dp(ones({2, 8})), zeros({2, 4})).backward();
    EXPECT_EQ(g.counters().allreduce, overlap ? 4 : 0) << "overlap " << overlap;
    dp.finish_gradient_sync();
    EXPECT_EQ(g.counters().allreduce, 4);
    dp.finish_gradient_sync();  // nothing left to do: no new collective
    EXPECT_EQ(g.counters().allreduce, 4);
  }
}

TEST(DistDataParallel, NoSyncAccumulatesLocallyAndASecondSynchronisedBackwardIsAnError) {
  ProcessGroup& g = world();
  auto m = mlp(9);
  DataParallel dp(*m, g);
  g.reset_counters();
  {
    auto guard = dp.no_sync();
    mse(dp(ones({2, 8})), zeros({2, 4})).backward();
    dp.finish_gradient_sync();  // inside no_sync: nothing
  }
  EXPECT_EQ(g.counters().allreduce, 0);
  mse(dp(ones({2, 8})), zeros({2, 4})).backward();
  const std::string e = error_of([&] { mse(dp(ones({2, 8})), zeros({2, 4})).backward(); });
  EXPECT_NE(e.find("no_sync()"), std::string::npos) << e;
  dp.finish_gradient_sync();
}

// Every rank takes the same decision: a non-finite gradient on the last rank alone skips the step
// (and backs the scale off) everywhere; so does a before_step refusal on rank 0 alone.
TEST(DistDataParallel, EveryRankSkipsTogether) {
  ProcessGroup& g = world();
  const bool last = g.rank() == g.world_size() - 1;
  auto m = mlp(21);
  DataParallel dp(*m, g);
  optim::SGD opt(m->parameters(), {.lr = 0.1});
  optim::GradScaler scaler({.init_scale = 1024.0});
  bool refuse = false;
  optim::AccumulatingTrainer trainer(opt, {.before_step = [&] { return !(refuse && g.rank() == 0); },
                                           .scaler = &scaler,
                                           .sync = &dp});
  const auto before = m->parameters()[0].detach().clone();
  Tensor x = ones({2, 8});
  if (last) x = x * INFINITY;
  EXPECT_FALSE(trainer.micro_batch(mse(dp(x), zeros({2, 4})), {.loss_weight = 1.0, .steps = true, .samples = 2}));
  EXPECT_EQ(trainer.skipped_steps(), 1);
  EXPECT_EQ(scaler.get_scale(), 512.0);
  EXPECT_EQ(m->parameters()[0].to_vector(), before.to_vector());
  refuse = true;
  EXPECT_FALSE(trainer.micro_batch(mse(dp(ones({2, 8})), zeros({2, 4})), {.loss_weight = 1.0, .steps = true, .samples = 2}));
  EXPECT_EQ(trainer.skipped_steps(), 2);
  refuse = false;
  EXPECT_TRUE(trainer.micro_batch(mse(dp(ones({2, 8})), zeros({2, 4})), {.loss_weight = 1.0, .steps = true, .samples = 2}));
  EXPECT_EQ(trainer.optimizer_steps(), 1);
  EXPECT_TRUE(same_on_every_rank(g, *m));
}

// The clip norm is one number on every rank, so every rank scales its gradients alike.
TEST(DistDataParallel, ClipNormIsTheSameOnEveryRank) {
  ProcessGroup& g = world();
  auto m = mlp(33);
  DataParallel dp(*m, g);
  optim::SGD opt(m->parameters(), {.lr = 0.1});
  optim::AccumulatingTrainer trainer(opt, {.max_grad_norm = 1e-3, .sync = &dp});
  const Tensor x = full({2, 8}, 1.0 + g.rank());
  trainer.micro_batch(mse(dp(x), zeros({2, 4})), {.loss_weight = 1.0, .steps = true, .samples = 2});
  const double norm = trainer.last_grad_norm();
  EXPECT_GT(norm, 1e-3);
  EXPECT_EQ(g.allreduce(norm, ReduceOp::Max), g.allreduce(norm, ReduceOp::Min));
  EXPECT_TRUE(same_on_every_rank(g, *m));
}

}  // namespace
}  // namespace minidl::distributed
