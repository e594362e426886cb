// The training loop on tiny configurations: it learns, writes consistent metrics, flags divergence
// instead of crashing, stops at a step boundary when asked (SIGINT), honours --max-steps and
// accumulation, and resumes from saved weights and optimizer state.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>

#include "core/allocator.h"
#include "train/run.h"
#include "nn/safetensors.h"
#include "tests/experiments/helpers.h"

namespace minidl::harness {
namespace {

TEST(ExperimentsTrain, TinyRunProducesConsistentMetrics) {
  TrainConfig c = testing::tiny_config();
  c.epochs = 2;
  c.optimizer = "adam";
  std::vector<int64_t> seen;
  RunHooks hooks;
  hooks.log = [](const std::string&) {};
  hooks.on_epoch = [&](const EpochMetrics& e) { seen.push_back(e.epoch); };
  const RunResult r = run_training(c, hooks);
  EXPECT_EQ(r.status, "ok");
  ASSERT_EQ(r.epochs.size(), 2u);
  EXPECT_EQ(seen, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(r.steps, 2 * 4);  // 32 training images / batch 8, two epochs
  EXPECT_EQ(r.epochs[0].images, 32);
  for (const auto& e : r.epochs) {
    EXPECT_TRUE(std::isfinite(e.train_loss));
    EXPECT_GE(e.val_acc, 0.0);
    EXPECT_LE(e.val_acc, 1.0);
    EXPECT_GT(e.peak_allocated, 0);
    EXPECT_GT(e.images_per_second, 0.0);
    EXPECT_TRUE(std::isnan(e.gpu_busy)) << "no GPU busy figure on the CPU";
    EXPECT_EQ(e.gpu_busy_source, "none: cpu device") << "and the column says why";
    EXPECT_GE(e.device_wait_fraction, 0.0);
    EXPECT_LE(e.data_wait_fraction + e.device_wait_fraction, 1.0);
  }
  EXPECT_GE(r.test_acc, 0.0);
  EXPECT_GE(r.best_epoch, 1);
  EXPECT_EQ(memory_stats().budget_bytes, 0) << "no budget left behind";
}

TEST(ExperimentsTrain, AccumulationAndMaxStepsCountOptimizerSteps) {
  TrainConfig c = testing::tiny_config();
  c.batch_size = 4;
  c.accumulation_steps = 2;   // 8 micro-batches -> 4 optimizer steps per epoch
  c.epochs = 3;
  c.max_steps = 6;
  const RunResult r = run_training(c, {[](const std::string&) {}, {}, {}});
  EXPECT_EQ(r.steps, 6);
  EXPECT_EQ(r.epochs.size(), 2u);
  EXPECT_EQ(r.epochs[0].steps, 4);
}

// The steady rate leaves out each epoch's first accumulation window (the warm-up): its images are
// the rest of the epoch's, its time a part of the epoch's training time.
TEST(ExperimentsTrain, SteadyRateLeavesOutTheFirstWindow) {
  TrainConfig c = testing::tiny_config();
  c.batch_size = 4;
  c.accumulation_steps = 2;   // 8 micro-batches of 4: the first window is 8 images
  c.epochs = 2;
  const RunResult r = run_training(c, {[](const std::string&) {}, {}, {}});
  ASSERT_EQ(r.epochs.size(), 2u);
  for (const auto& e : r.epochs) {
    EXPECT_EQ(e.images, 32);
    EXPECT_EQ(e.steady_images, 32 - 8);
    EXPECT_GT(e.steady_seconds, 0.0);
    EXPECT_LT(e.steady_seconds, e.train_seconds);
    EXPECT_DOUBLE_EQ(e.images_per_second_steady, 24.0 / e.steady_seconds);
  }
  EXPECT_GT(r.steady_images_per_second(), 0.0);

  // One window only: no steady part, and the figures say so instead of inventing one.
  c.batch_size = 16;
  c.accumulation_steps = 2;
  c.epochs = 1;
  const RunResult one = run_training(c, {[](const std::string&) {}, {}, {}});
  ASSERT_EQ(one.epochs.size(), 1u);
  EXPECT_EQ(one.epochs[0].steady_images, 0);
  EXPECT_TRUE(std::isnan(one.epochs[0].images_per_second_steady));
  EXPECT_TRUE(std::isnan(one.steady_images_per_second()));
  EXPECT_GT(one.mean_images_per_second(), 0.0);
}

TEST(ExperimentsTrain, DivergenceIsFlaggedNotThrown) {
  TrainConfig c = testing::tiny_config();
  c.lr = 1e6;
  c.momentum = 0.9;
  c.epochs = 3;
  const RunResult r = run_training(c, {[](const std::string&) {}, {}, {}});
  EXPECT_EQ(r.status, "diverged");
  EXPECT_TRUE(r.diverged());
  EXPECT_NE(r.note.find("training loss"), std::string::npos) << r.note;
  EXPECT_LT(r.steps, 12) << "stopped early";
}

TEST(ExperimentsTrain, StopRequestEndsAtAStepBoundary) {
  TrainConfig c = testing::tiny_config();
  c.epochs = 3;
  request_stop();
  const RunResult r = run_training(c, {[](const std::string&) {}, {}, {}});
  clear_stop();
  EXPECT_EQ(r.status, "interrupted");
  EXPECT_EQ(r.steps, 1) << "the first optimizer step completes, then the loop stops";
  ASSERT_EQ(r.epochs.size(), 1u);
  EXPECT_EQ(r.epochs[0].images, 8);
}

TEST(ExperimentsTrain, SaveThenResumeContinuesFromTheNextEpoch) {
  const auto dir = testing::temp_dir();
  TrainConfig c = testing::tiny_config();
  c.momentum = 0.9;
  c.save_weights = (dir / "w.safetensors").string();
  const RunResult first = run_training(c, {[](const std::string&) {}, {}, {}});
  ASSERT_EQ(first.status, "ok");
  const auto saved = nn::load_safetensors(c.save_weights);
  EXPECT_TRUE(saved.tensors.count("conv.weight")) << "torchvision-style names, no prefix";
  EXPECT_EQ(saved.metadata.at("epoch"), "1");
  TrainConfig c2 = testing::tiny_config();
  c2.momentum = 0.9;
  c2.epochs = 2;
  c2.resume = c.save_weights;
  const RunResult second = run_training(c2, {[](const std::string&) {}, {}, {}});
  ASSERT_EQ(second.epochs.size(), 1u);
  EXPECT_EQ(second.epochs[0].epoch, 2);
  EXPECT_EQ(second.steps, 8) << "the optimizer's step count continues from the saved state";
  std::filesystem::remove_all(dir);
}

TEST(ExperimentsTrain, WarmupAndScalingSetTheLearningRate) {
  TrainConfig c = testing::tiny_config();
  c.lr = 0.01;
  c.batch_size = 16;
  c.base_batch = 8;
  c.lr_scaling = "linear";
  c.warmup_epochs = 1;
  c.epochs = 2;
  const RunResult r = run_training(c, {[](const std::string&) {}, {}, {}});
  EXPECT_DOUBLE_EQ(r.lr, 0.02);
  EXPECT_EQ(r.warmup_steps, 2);
  ASSERT_EQ(r.epochs.size(), 2u);
  EXPECT_LT(r.epochs[0].lr, 0.02) << "still warming up at the end of epoch 1";
  EXPECT_DOUBLE_EQ(r.epochs[1].lr, 0.02);
}

TEST(ExperimentsTrain, MixedPrecisionAndOptimalRecomputationRun) {
  TrainConfig c = testing::tiny_config();
  c.amp = true;
  c.optimizer = "adam";
  const RunResult amp = run_training(c, {[](const std::string&) {}, {}, {}});
  EXPECT_EQ(amp.status, "ok");
  EXPECT_TRUE(std::isfinite(amp.epochs.at(0).train_loss));
  EXPECT_EQ(amp.steps, 4);
  TrainConfig r = testing::tiny_config();
  r.model = "resnet18-small";
  r.image_size = 16;
  r.split = "4,2,0";
  r.checkpoint = "optimal";
  r.memory_budget = "512MiB";
  const RunResult opt = run_training(r, {[](const std::string&) {}, {}, {}});
  EXPECT_EQ(opt.status, "ok");
  EXPECT_EQ(opt.steps, 1);
  EXPECT_TRUE(std::isfinite(opt.epochs.at(0).train_loss));
}

// A --conv-bn-chain run says how its conv2d_stats calls ran: on the CPU every one composes (no
// backend fuses there), forward and backward; a run without the chain makes none.
TEST(ExperimentsTrain, AChainRunCountsHowItsConvolutionsRan) {
  TrainConfig c = testing::tiny_config();
  c.model = "resnet18-small";
  c.image_size = 16;
  c.split = "4,2,0";
  std::string lines;
  const auto log = [&lines](const std::string& s) { lines += s + "\n"; };
  const RunResult plain = run_training(c, {log, {}, {}});
  EXPECT_EQ(plain.conv_stats.composed_forward + plain.conv_stats.fused_forward, 0);
  EXPECT_EQ(lines.find("conv-bn chain:"), std::string::npos) << lines;
  c.conv_bn_chain = true;
  const RunResult chain = run_training(c, {log, {}, {}});
  ASSERT_EQ(chain.status, "ok") << chain.note;
  EXPECT_EQ(chain.conv_stats.fused_forward, 0);
  EXPECT_EQ(chain.conv_stats.fused_backward, 0);
  // One training step (batch 8 of the 8 training images) and one validation batch: every convolution
  // of the ResNet-18 runs through conv2d_stats in both forwards, and in the step's backward.
  EXPECT_GT(chain.conv_stats.composed_backward, 0);
  EXPECT_EQ(chain.conv_stats.composed_forward, 2 * chain.conv_stats.composed_backward);
  EXPECT_NE(lines.find("conv-bn chain: 0 of " + std::to_string(chain.conv_stats.composed_forward) +
                       " forward and 0 of " + std::to_string(chain.conv_stats.composed_backward) + " backward"),
            std::string::npos)
      << lines;
}

// --data-cache: each photo is decoded once, and the run is the uncached run bit for bit, with the
// Keras augmentation's random crops and flips drawn anew every epoch from the cached resize.
TEST(ExperimentsTrain, TheDataCacheDecodesEachPhotoOnceAndChangesNoBatch) {
  const std::filesystem::path photos = std::filesystem::path(MINIDL_SHARED_DATA_DIR) / "catsdogs";
  if (!std::filesystem::exists(photos)) GTEST_SKIP() << "no photos at " << photos << " (../shared/data)";
  TrainConfig c = testing::tiny_config();
  c.data = photos.string();
  c.image_size = 32;
  c.split = "20,5,5";
  c.epochs = 2;
  c.augment = "keras";
  const auto train = [&](const std::string& cache) {
    TrainConfig k = c;
    k.data_cache = cache;
    return run_training(k, {[](const std::string&) {}, {}, {}});
  };
  const RunResult cached = train("4GiB"), uncached = train("0");
  ASSERT_EQ(cached.status, "ok") << cached.note;
  ASSERT_EQ(uncached.status, "ok") << uncached.note;
  EXPECT_EQ(cached.data_cached_images, 60) << "every train, val and test photo, once";
  EXPECT_GT(cached.data_cached_bytes, 60 * 32 * 32 * 3) << "the Keras augmentation's 40 px resize, before its crop";
  EXPECT_EQ(uncached.data_cached_images, 0);
  ASSERT_EQ(cached.epochs.size(), uncached.epochs.size());
  for (size_t e = 0; e < cached.epochs.size(); ++e) {
    EXPECT_EQ(cached.epochs[e].train_loss, uncached.epochs[e].train_loss) << "epoch " << e + 1;
    EXPECT_EQ(cached.epochs[e].val_loss, uncached.epochs[e].val_loss) << "epoch " << e + 1;
  }
  EXPECT_EQ(cached.test_loss, uncached.test_loss);
  // A cache too small for all of them keeps what fits and decodes the rest every epoch.
  const RunResult small = train("100KiB");
  EXPECT_GT(small.data_cached_images, 0);
  EXPECT_LT(small.data_cached_images, 60);
  EXPECT_EQ(small.test_loss, uncached.test_loss);
}

TEST(ExperimentsTrain, SummaryListsTheLayers) {
  TrainConfig c = testing::tiny_config();
  const std::string s = model_summary(c);
  EXPECT_NE(s.find("Conv2d"), std::string::npos);
  EXPECT_NE(s.find("Linear"), std::string::npos);
}

}  // namespace
}  // namespace minidl::harness
