// The loader's CUDA path (data/device_staging.cpp, Backend::copy_async in kernels/cuda/pinned.cu):
// device batches must equal the CPU loader's for any worker count, dtype and layout, across epochs,
// with a trimmed last batch and an epoch restarted with a copy in flight. MINIDL_PARITY_SELF_TEST=1
// runs it CPU against CPU; tests/data/device_staging_test.cpp covers the staging logic without a GPU.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>

#include "core/backend.h"
#include "core/ops.h"
#include "data/dataset.h"
#include "data/loader.h"
#include "tests/support/cuda_target.h"

namespace minidl::data {
namespace {

const Device kGpu = testing::parity_target();
using PinnedLoader = testing::CudaTargetTest;

LoaderOptions options(int workers, DType dtype, bool channels_last, Device dev) {
  LoaderOptions o;
  o.batch_size = 6;
  o.workers = workers;
  o.prefetch_batches = 2;
  o.dtype = dtype;
  o.channels_last = channels_last;
  o.device = dev;
  o.seed = 11;
  o.transform.size = 16;
  o.transform.resize = 20;
  return o;
}

void expect_same_batches(Loader& cpu, Loader& gpu, const std::string& what) {
  int64_t k = 0;
  for (;;) {
    std::optional<Batch> a = cpu.next();
    std::optional<Batch> b = gpu.next();
    ASSERT_EQ(a.has_value(), b.has_value()) << what << ": batch " << k << " exists on one loader only";
    if (!a) break;
    ASSERT_EQ(b->images.device(), kGpu) << what;
    ASSERT_EQ(b->labels.device(), kGpu) << what;
    ASSERT_EQ(a->images.shape(), b->images.shape()) << what << ": batch " << k;
    ASSERT_EQ(a->images.dtype(), b->images.dtype()) << what << ": batch " << k;
    ASSERT_EQ(a->labels.to_vector(), b->labels.to(Device::cpu()).to_vector()) << what << ": labels of batch " << k;
    const std::vector<double> x = a->images.to_vector(), y = b->images.to(Device::cpu()).to_vector();
    for (size_t i = 0; i < x.size(); ++i) {
      ASSERT_EQ(x[i], y[i]) << what << ": batch " << k << " " << a->images.meta() << " element " << i;
    }
    ++k;
  }
  // 23 images in batches of 6: 4 batches, the last one trimmed to 5.
  EXPECT_EQ(k, 4) << what;
}

TEST_F(PinnedLoader, DeviceBatchesEqualCpuBatches) {
  const auto ds = synthetic_dataset(23, 24, 5);
  for (int workers : {0, 2}) {
    for (DType dt : {DType::f32, DType::f16}) {
      for (bool cl : {false, true}) {
        const std::string what = "workers " + std::to_string(workers) + ", " + dtype_name(dt) +
                                 (cl ? ", channels_last" : ", NCHW");
        Loader cpu(ds, options(workers, dt, cl, Device::cpu()));
        Loader gpu(ds, options(workers, dt, cl, kGpu));
        for (int64_t epoch : {0, 1}) {
          cpu.start_epoch(epoch);
          gpu.start_epoch(epoch);
          expect_same_batches(cpu, gpu, what + ", epoch " + std::to_string(epoch));
          if (HasFatalFailure()) return;
        }
        // Restart in the middle of an epoch (a prefetched copy may be in flight), then a full one.
        cpu.start_epoch(2);
        gpu.start_epoch(2);
        ASSERT_TRUE(cpu.next().has_value());
        ASSERT_TRUE(gpu.next().has_value());
        cpu.start_epoch(3);
        gpu.start_epoch(3);
        expect_same_batches(cpu, gpu, what + ", epoch 3 after a restart");
        if (HasFatalFailure()) return;
      }
    }
  }
}

// Batches kept across later next() calls stay intact: their memory is not reused while alive.
TEST_F(PinnedLoader, KeptBatchesAreNotOverwritten) {
  const auto ds = synthetic_dataset(23, 24, 6);
  Loader cpu(ds, options(2, DType::f32, false, Device::cpu()));
  Loader gpu(ds, options(2, DType::f32, false, kGpu));
  std::vector<Batch> a, b;
  while (auto x = cpu.next()) a.push_back(*x);
  while (auto y = gpu.next()) b.push_back(*y);
  ASSERT_EQ(a.size(), b.size());
  for (size_t k = 0; k < a.size(); ++k) {
    EXPECT_EQ(a[k].images.to_vector(), b[k].images.to(Device::cpu()).to_vector()) << "batch " << k;
    EXPECT_EQ(a[k].labels.to_vector(), b[k].labels.to(Device::cpu()).to_vector()) << "batch " << k;
  }
}

// A batch-size schedule on the device path: the staging buffers are made again when the batch
// outgrows them (6 -> 16) and reused when it shrinks (16 -> 4), the batches still equal the CPU's.
TEST_F(PinnedLoader, BatchSizeChangesBetweenEpochs) {
  const auto ds = synthetic_dataset(23, 24, 7);
  Loader cpu(ds, options(2, DType::f32, false, Device::cpu()));
  Loader gpu(ds, options(2, DType::f32, false, kGpu));
  int64_t epoch = 0;
  for (int64_t batch : {6, 16, 4}) {
    cpu.set_batch_size(batch);
    gpu.set_batch_size(batch);
    cpu.start_epoch(epoch);
    gpu.start_epoch(epoch);
    int64_t images = 0;
    while (auto a = cpu.next()) {
      std::optional<Batch> b = gpu.next();
      ASSERT_TRUE(b.has_value()) << "batch " << batch;
      ASSERT_EQ(a->images.shape(), b->images.shape()) << "batch " << batch;
      EXPECT_EQ(a->images.to_vector(), b->images.to(Device::cpu()).to_vector()) << "batch " << batch;
      EXPECT_EQ(a->labels.to_vector(), b->labels.to(Device::cpu()).to_vector()) << "batch " << batch;
      images += a->labels.size(0);
    }
    EXPECT_FALSE(gpu.next().has_value()) << "batch " << batch;
    EXPECT_EQ(images, 23) << "batch " << batch;
    ++epoch;
  }
}

// Counts load() calls: with no cache, every sample a worker makes is one.
class CountingDataset final : public Dataset {
 public:
  explicit CountingDataset(std::shared_ptr<const Dataset> d) : d_(std::move(d)) {}
  int64_t size() const override { return d_->size(); }
  int64_t label(int64_t i) const override { return d_->label(i); }
  const std::vector<std::string>& class_names() const override { return d_->class_names(); }
  std::optional<Image> load(int64_t i) const override {
    loads_.fetch_add(1);
    return d_->load(i);
  }
  std::string describe(int64_t i) const override { return d_->describe(i); }
  int64_t loads() const { return loads_.load(); }
  // Whether loads() reaches n within 20 s.
  bool reaches(int64_t n) const {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (loads() < n && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    return loads() >= n;
  }

 private:
  std::shared_ptr<const Dataset> d_;
  mutable std::atomic<int64_t> loads_{0};
};

// Once the caller has had an epoch's last batch, the workers make the next epoch's (what a run
// does while it validates), and start_epoch keeps them when they are that epoch's batches: the
// next epoch of a shuffled loader, any epoch of one without shuffle. Another epoch starts afresh.
// 23 samples fit in what the pipeline holds ahead (2 queued batches, one assembled, 8 ring slots).
TEST_F(PinnedLoader, TheNextEpochIsMadeAheadAndKeptWhenItIsTheOneAskedFor) {
  constexpr int64_t n = 23;
  for (const bool shuffle : {true, false}) {
    const std::string what = shuffle ? "shuffled" : "not shuffled";
    const auto counting = std::make_shared<CountingDataset>(synthetic_dataset(n, 24, 8));
    LoaderOptions o = options(2, DType::f32, false, kGpu);
    o.shuffle = shuffle;
    Loader gpu(counting, o);
    o.device = Device::cpu();
    Loader cpu(synthetic_dataset(n, 24, 8), o);
    gpu.start_epoch(0);
    cpu.start_epoch(0);
    expect_same_batches(cpu, gpu, what + ", epoch 0");
    if (HasFatalFailure()) return;
    ASSERT_TRUE(counting->reaches(2 * n)) << what << ": only " << counting->loads() << " samples made, not epoch 1's";
    EXPECT_FALSE(gpu.next().has_value()) << what << ": epoch 1 is handed out only after start_epoch";
    const int64_t next_epoch = shuffle ? 1 : 0;   // an evaluation loader asks for its one epoch again
    gpu.start_epoch(next_epoch);
    cpu.start_epoch(next_epoch);
    std::optional<Batch> a = cpu.next(), b = gpu.next();
    ASSERT_TRUE(a && b) << what;
    EXPECT_EQ(counting->loads(), 2 * n) << what << ": start_epoch(" << next_epoch << ") made the samples again";
    EXPECT_EQ(a->images.to_vector(), b->images.to(Device::cpu()).to_vector()) << what;
    EXPECT_EQ(a->labels.to_vector(), b->labels.to(Device::cpu()).to_vector()) << what;
    while ((a = cpu.next())) {
      b = gpu.next();
      ASSERT_TRUE(b.has_value()) << what;
      EXPECT_EQ(a->images.to_vector(), b->images.to(Device::cpu()).to_vector()) << what;
    }
    EXPECT_FALSE(gpu.next().has_value()) << what;
    // Made ahead: the next epoch; asked for: epoch 5, which a shuffled loader starts afresh.
    ASSERT_TRUE(counting->reaches(3 * n)) << what;
    gpu.start_epoch(5);
    cpu.start_epoch(5);
    int64_t k = 0;
    while ((a = cpu.next())) {
      b = gpu.next();
      ASSERT_TRUE(b.has_value()) << what;
      EXPECT_EQ(a->labels.to_vector(), b->labels.to(Device::cpu()).to_vector()) << what << ", epoch 5 batch " << k;
      ++k;
    }
    EXPECT_EQ(k, 4) << what;
    EXPECT_EQ(counting->loads() >= 4 * n, shuffle) << what << ": " << counting->loads()
                                                   << " loads (epoch 5 of a loader without shuffle is epoch 1's)";
  }
  // On the CPU a batch is the run's own memory: nothing is made ahead of start_epoch.
  const auto counting = std::make_shared<CountingDataset>(synthetic_dataset(n, 24, 9));
  Loader cpu(counting, options(2, DType::f32, false, Device::cpu()));
  while (cpu.next()) {
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(100));
  EXPECT_EQ(counting->loads(), n);
}

}  // namespace
}  // namespace minidl::data
