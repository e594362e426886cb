// The loader's device path without a GPU: Backend::copy_async's CPU default, and DeviceStaging on a
// fake backend whose copies finish late, as a copy stream's do, so that reusing a buffer before its
// copy is done, or handing out a batch before the compute stream waits for it, gives wrong bytes.
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <optional>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "core/backend.h"
#include "core/ops.h"
#include "data/device_staging.h"
#include "tests/support/error_of.h"

namespace minidl::data {
namespace {

TEST(CopyAsync, CpuDefaultCopiesAtOnceAndIsComplete) {
  Backend& be = backend(Device::cpu());
  const float src_f[6] = {1.5f, -2.0f, 3.25f, 0.0f, 7.0f, -0.5f};
  const int64_t src_i[3] = {7, -1, int64_t{1} << 40};
  const Tensor f = empty({2, 3}, {.dtype = DType::f32});
  const Tensor i = empty({3}, {.dtype = DType::i64});
  const Tensor none = empty({0}, {.dtype = DType::f32});
  std::unique_ptr<Backend::CopyHandle> h = be.copy_async({{src_f, f}, {src_i, i}, {nullptr, none}});
  ASSERT_NE(h, nullptr);
  // Already done before any wait: the default is synchronous.
  EXPECT_EQ(f.to_vector(), (std::vector<double>{1.5, -2.0, 3.25, 0.0, 7.0, -0.5}));
  EXPECT_EQ(i.to_vector(), (std::vector<double>{7, -1, static_cast<double>(int64_t{1} << 40)}));
  h->make_compute_wait();
  h->host_wait();
  h.reset();
  EXPECT_EQ(f.to_vector()[2], 3.25) << "dropping the handle leaves the copy in place";
  EXPECT_NE(be.copy_async({}), nullptr);

  const std::string e = minidl::testing::error_of([&] { be.copy_async({{src_f, f.transpose(0, 1)}}); });
  EXPECT_NE(e.find("contiguous"), std::string::npos) << e;
  const std::string n = minidl::testing::error_of([&] { be.copy_async({{nullptr, f}}); });
  EXPECT_NE(n.find("null source"), std::string::npos) << n;
}

TEST(DeviceStaging, NoPinnedMemoryMeansNoStaging) {
  EXPECT_EQ(DeviceStaging::create(backend(Device::cpu()), Device::cpu(), {4, 8, DType::f32, false}, 3), nullptr)
      << "the CPU backend has no pinned memory: the loader keeps its plain path";
}

// A device whose copies run "on a copy stream": nothing is copied when copy_async returns. Copies
// complete in order, up to a handle, when the host waits for it (host_wait) or when compute work
// ordered after it runs (sync_compute(), standing for the caller reading the batch). A copy reads
// its source when it completes, so a source rewritten too early arrives rewritten.
class LateCopyBackend final : public Backend {
 public:
  ~LateCopyBackend() override {
    for (auto& [p, bytes] : live_) std::free(p);
  }
  struct Record {
    std::vector<std::pair<const void*, Tensor>> copies;
    bool done = false, compute_waits = false;
  };

  class Handle final : public CopyHandle {
   public:
    Handle(LateCopyBackend* be, size_t seq) : be_(be), seq_(seq) {}
    ~Handle() override { be_->mark_compute_wait(seq_); }   // like the CUDA handle's destructor
    void make_compute_wait() override { be_->mark_compute_wait(seq_); }
    void host_wait() override { be_->complete_through(seq_); }

   private:
    LateCopyBackend* be_;
    size_t seq_;
  };

  std::unique_ptr<CopyHandle> copy_async(const std::vector<std::pair<const void*, Tensor>>& copies) override {
    std::lock_guard<std::mutex> lock(mu_);
    records_.push_back(Record{copies, false, false});
    return std::make_unique<Handle>(this, records_.size() - 1);
  }
  void* pinned_alloc(size_t bytes) override {
    void* p = std::malloc(bytes);
    std::memset(p, 0xAB, bytes);
    std::lock_guard<std::mutex> lock(mu_);
    live_[p] = bytes;
    return p;
  }
  void pinned_free(void* p) override {
    std::lock_guard<std::mutex> lock(mu_);
    // No copy may still read a buffer that is freed.
    for (const Record& r : records_) {
      for (const auto& [src, dst] : r.copies) {
        const auto* s = static_cast<const char*>(src);
        if (!r.done && s >= static_cast<char*>(p) && s < static_cast<char*>(p) + live_[p]) ++freed_while_read;
      }
    }
    live_.erase(p);
    std::free(p);
  }
  void mark_compute_wait(size_t seq) {
    std::lock_guard<std::mutex> lock(mu_);
    records_[seq].compute_waits = true;
  }
  void complete_through(size_t seq) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t k = 0; k <= seq; ++k) complete(records_[k]);
  }
  // Compute work queued now runs after every copy it was made to wait for (and those before it).
  void sync_compute() {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t k = records_.size(); k-- > 0;) {
      if (!records_[k].compute_waits) continue;
      for (size_t j = 0; j <= k; ++j) complete(records_[j]);
      return;
    }
  }
  bool compute_waits_for(const void* dst) {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Record& r : records_) {
      for (const auto& c : r.copies) {
        if (c.second.data_ptr() == dst) return r.compute_waits;
      }
    }
    ADD_FAILURE() << "no copy into " << dst;
    return false;
  }
  bool all_compute_waited() {
    std::lock_guard<std::mutex> lock(mu_);
    for (const Record& r : records_) {
      if (!r.compute_waits) return false;
    }
    return true;
  }
  size_t live_buffers() {
    std::lock_guard<std::mutex> lock(mu_);
    return live_.size();
  }
  int freed_while_read = 0;

  // Everything else is the CPU's.
  const char* name() const override { return "late-copy"; }
  Allocator& allocator(int d) override { return cpu().allocator(d); }
  void copy(const Tensor& s, const Tensor& d) override { cpu().copy(s, d); }
  void fill(const Tensor& d, double v) override { cpu().fill(d, v); }
  void unary(UnaryOp op, const Tensor& x, const Tensor& o, double s) override { cpu().unary(op, x, o, s); }
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& o, double al) override {
    cpu().binary(op, a, b, o, al);
  }
  void reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& d, const Tensor& o) override {
    cpu().reduce(op, x, d, o);
  }
  void matmul(const Tensor& a, const Tensor& b, const Tensor& o) override { cpu().matmul(a, b, o); }
  void random(RandomKind k, const Tensor& o, uint64_t s, uint64_t off, double a, double b) override {
    cpu().random(k, o, s, off, a, b);
  }
  void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& b, const Conv2dOptions& o,
                      const Tensor& y) override {
    cpu().conv2d_forward(x, w, b, o, y);
  }
  void conv2d_backward_input(const Tensor& gy, const Tensor& w, const Conv2dOptions& o, const Tensor& gx) override {
    cpu().conv2d_backward_input(gy, w, o, gx);
  }
  void conv2d_backward_weight(const Tensor& gy, const Tensor& x, const Conv2dOptions& o, const Tensor& gw) override {
    cpu().conv2d_backward_weight(gy, x, o, gw);
  }
  void max_pool2d_forward(const Tensor& x, const Pool2dOptions& o, const Tensor& y, const Tensor& i) override {
    cpu().max_pool2d_forward(x, o, y, i);
  }
  void max_pool2d_backward(const Tensor& gy, const Tensor& i, const Pool2dOptions& o, const Tensor& gx) override {
    cpu().max_pool2d_backward(gy, i, o, gx);
  }
  void avg_pool2d_forward(const Tensor& x, const Pool2dOptions& o, const Tensor& y) override {
    cpu().avg_pool2d_forward(x, o, y);
  }
  void avg_pool2d_backward(const Tensor& gy, const Pool2dOptions& o, const Tensor& gx) override {
    cpu().avg_pool2d_backward(gy, o, gx);
  }
  void batch_norm_forward_train(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& rm, const Tensor& rv,
                                double m, double eps, const Tensor& y, const Tensor& sm, const Tensor& si) override {
    cpu().batch_norm_forward_train(x, w, b, rm, rv, m, eps, y, sm, si);
  }
  void batch_norm_forward_eval(const Tensor& x, const Tensor& w, const Tensor& b, const Tensor& m, const Tensor& v,
                               double eps, const Tensor& y) override {
    cpu().batch_norm_forward_eval(x, w, b, m, v, eps, y);
  }
  void batch_norm_backward(const Tensor& gy, const Tensor& x, const Tensor& w, const Tensor& sm, const Tensor& si,
                           const Tensor& gx, const Tensor& gw, const Tensor& gb) override {
    cpu().batch_norm_backward(gy, x, w, sm, si, gx, gw, gb);
  }
  void softmax_forward(const Tensor& x, int64_t d, bool l, const Tensor& y) override { cpu().softmax_forward(x, d, l, y); }
  void softmax_backward(const Tensor& gy, const Tensor& y, int64_t d, bool l, const Tensor& gx) override {
    cpu().softmax_backward(gy, y, d, l, gx);
  }
  void nll_forward(const Tensor& lp, const Tensor& t, const Tensor& l) override { cpu().nll_forward(lp, t, l); }
  void nll_backward(const Tensor& g, const Tensor& t, const Tensor& gl) override { cpu().nll_backward(g, t, gl); }
  void cross_entropy_forward(const Tensor& x, const Tensor& t, double eps, const Tensor& l,
                             const Tensor& lse) override {
    cpu().cross_entropy_forward(x, t, eps, l, lse);
  }
  void cross_entropy_backward(const Tensor& g, const Tensor& x, const Tensor& t, const Tensor& lse, double eps,
                              const Tensor& gx) override {
    cpu().cross_entropy_backward(g, x, t, lse, eps, gx);
  }
  void bce_with_logits_forward(const Tensor& x, const Tensor& y, const Tensor& l) override {
    cpu().bce_with_logits_forward(x, y, l);
  }
  void bce_with_logits_backward(const Tensor& g, const Tensor& x, const Tensor& y, const Tensor& gx,
                                const Tensor& gy) override {
    cpu().bce_with_logits_backward(g, x, y, gx, gy);
  }

 private:
  static Backend& cpu() { return backend(Device::cpu()); }
  void complete(Record& r) {
    if (r.done) return;
    for (const auto& [src, dst] : r.copies) std::memcpy(dst.data_ptr(), src, dst.nbytes());
    r.done = true;
  }
  std::mutex mu_;
  std::deque<Record> records_;
  std::map<void*, size_t> live_;
};

// Batch k: labels 100 k + i, image values k + j / 1024 (exact in f32).
constexpr int64_t kBatch = 4, kSize = 2, kPixels = kBatch * 3 * kSize * kSize;
void fill_batch(const DeviceStaging::Buffer& b, int64_t k) {
  for (int64_t i = 0; i < kBatch; ++i) b.labels[i] = 100 * k + i;
  auto* px = static_cast<float*>(b.images);
  for (int64_t j = 0; j < kPixels; ++j) px[j] = static_cast<float>(k) + static_cast<float>(j) / 1024.0f;
}
void expect_batch(const Batch& b, int64_t k, int64_t count) {
  ASSERT_EQ(b.labels.shape(), (Shape{count})) << "batch " << k;
  ASSERT_EQ(b.images.shape(), (Shape{count, 3, kSize, kSize})) << "batch " << k;
  const std::vector<double> l = b.labels.to_vector(), x = b.images.to_vector();
  for (int64_t i = 0; i < count; ++i) ASSERT_EQ(l[static_cast<size_t>(i)], 100 * k + i) << "batch " << k;
  for (size_t j = 0; j < x.size(); ++j) ASSERT_EQ(x[j], k + static_cast<double>(j) / 1024.0) << "batch " << k;
}

// A producer thread (the loader's assembler) fills buffers as fast as they come free; the caller
// takes batches one ahead. Every batch must arrive intact although copies finish only when
// something waits for them, and buffers are reused (3 buffers, 12 batches).
TEST(DeviceStaging, BuffersAreReusedOnlyAfterTheirCopyAndBatchesArriveIntact) {
  LateCopyBackend be;
  constexpr int64_t kBatches = 12, kLast = 3;   // the last batch holds 3 samples
  {
    std::unique_ptr<DeviceStaging> st = DeviceStaging::create(be, Device::cpu(), {kBatch, kSize, DType::f32, false}, 3);
    ASSERT_NE(st, nullptr);
    EXPECT_EQ(st->buffers(), 3);
    std::mutex mu;
    std::condition_variable cv;
    std::deque<DeviceStaging::Filled> ready;
    bool finished = false;
    std::thread producer([&] {
      for (int64_t k = 0; k < kBatches; ++k) {
        std::optional<DeviceStaging::Buffer> b = st->acquire();
        ASSERT_TRUE(b.has_value());
        fill_batch(*b, k);
        std::lock_guard<std::mutex> lock(mu);
        ready.push_back({b->index, k + 1 == kBatches ? kLast : kBatch});
        cv.notify_all();
      }
      std::lock_guard<std::mutex> lock(mu);
      finished = true;
      cv.notify_all();
    });
    const auto take = [&]() -> std::optional<DeviceStaging::Filled> {
      std::unique_lock<std::mutex> lock(mu);
      cv.wait(lock, [&] { return finished || !ready.empty(); });
      if (ready.empty()) return std::nullopt;
      DeviceStaging::Filled f = ready.front();
      ready.pop_front();
      return f;
    };
    const auto try_take = [&]() -> std::optional<DeviceStaging::Filled> {
      std::lock_guard<std::mutex> lock(mu);
      if (ready.empty()) return std::nullopt;
      DeviceStaging::Filled f = ready.front();
      ready.pop_front();
      return f;
    };
    std::vector<Batch> kept;
    for (int64_t k = 0;; ++k) {
      std::optional<Batch> b = st->next(take, try_take);
      if (!b) {
        EXPECT_EQ(k, kBatches);
        break;
      }
      EXPECT_TRUE(be.compute_waits_for(b->images.data_ptr())) << "batch " << k << " handed out unordered";
      EXPECT_TRUE(be.compute_waits_for(b->labels.data_ptr())) << "batch " << k;
      be.sync_compute();   // the caller's first kernel on the batch
      expect_batch(*b, k, k + 1 == kBatches ? kLast : kBatch);
      kept.push_back(*b);
      if (k % 3 == 1) std::this_thread::sleep_for(std::chrono::milliseconds(2));   // vary the interleaving
    }
    producer.join();
    for (size_t k = 0; k < kept.size(); ++k) {
      expect_batch(kept[k], static_cast<int64_t>(k), k + 1 == kept.size() ? kLast : kBatch);
    }
  }
  EXPECT_EQ(be.live_buffers(), 0u) << "the destructor frees every buffer";
  EXPECT_EQ(be.freed_while_read, 0) << "a buffer was freed while a copy still read it";
}

// Deterministic: one buffer, so the next batch is assembled into the buffer whose copy was queued
// last; acquire() must wait for that copy, or batch 0 arrives holding batch 1's bytes.
TEST(DeviceStaging, AcquireWaitsForTheCopyReadingTheBuffer) {
  LateCopyBackend be;
  std::unique_ptr<DeviceStaging> st = DeviceStaging::create(be, Device::cpu(), {kBatch, kSize, DType::f32, false}, 1);
  ASSERT_NE(st, nullptr);
  std::deque<DeviceStaging::Filled> ready;
  const auto pop = [&]() -> std::optional<DeviceStaging::Filled> {
    if (ready.empty()) return std::nullopt;
    DeviceStaging::Filled f = ready.front();
    ready.pop_front();
    return f;
  };
  std::vector<Batch> got;
  for (int64_t k = 0; k < 3; ++k) {
    std::optional<DeviceStaging::Buffer> b = st->acquire();
    ASSERT_TRUE(b.has_value());
    EXPECT_EQ(b->index, 0);
    fill_batch(*b, k);
    ready.push_back({b->index, kBatch});
    std::optional<Batch> batch = st->next(pop, pop);   // queues the copy; nothing completes it yet
    ASSERT_TRUE(batch.has_value());
    got.push_back(*batch);
  }
  be.sync_compute();
  for (size_t k = 0; k < got.size(); ++k) expect_batch(got[k], static_cast<int64_t>(k), kBatch);
}

// interrupt() wakes an acquire() blocked on a full pool; restart() frees every buffer, and a
// prefetched batch dropped by it has the compute stream wait for its copy first.
TEST(DeviceStaging, InterruptRestartAndDroppedPrefetch) {
  LateCopyBackend be;
  std::unique_ptr<DeviceStaging> st = DeviceStaging::create(be, Device::cpu(), {kBatch, kSize, DType::f32, false}, 2);
  ASSERT_NE(st, nullptr);
  std::optional<DeviceStaging::Buffer> a = st->acquire(), b = st->acquire();
  ASSERT_TRUE(a && b);
  EXPECT_NE(a->index, b->index);
  std::thread blocked([&] { EXPECT_FALSE(st->acquire().has_value()) << "interrupt() must wake acquire()"; });
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  st->interrupt();
  blocked.join();
  EXPECT_FALSE(st->acquire().has_value()) << "interrupted until restart()";

  st->restart();
  a = st->acquire();
  b = st->acquire();
  ASSERT_TRUE(a && b) << "restart() gives every buffer back";
  fill_batch(*a, 0);
  fill_batch(*b, 1);
  std::deque<DeviceStaging::Filled> ready{{a->index, kBatch}, {b->index, 2}};
  const auto pop = [&]() -> std::optional<DeviceStaging::Filled> {
    if (ready.empty()) return std::nullopt;
    DeviceStaging::Filled f = ready.front();
    ready.pop_front();
    return f;
  };
  std::optional<Batch> first = st->next(pop, pop);   // batch 1's copy is now queued behind it
  ASSERT_TRUE(first.has_value());
  be.sync_compute();
  expect_batch(*first, 0, kBatch);
  EXPECT_FALSE(be.all_compute_waited()) << "batch 1 is prefetched: nothing waits for it yet";
  st->restart();   // drops batch 1 with its copy in flight
  EXPECT_TRUE(be.all_compute_waited()) << "the dropped batch's memory could be reused before its copy";
  const std::string e = minidl::testing::error_of([&] { st->release(7); });
  EXPECT_NE(e.find("no buffer 7"), std::string::npos) << e;
  st.reset();
  EXPECT_EQ(be.live_buffers(), 0u);
  EXPECT_EQ(be.freed_while_read, 0);
}

// The next batch's device tensors are made when the current batch is handed out, whether or not
// the workers have the next one ready (try_take has nothing here): the device's requests come in
// the same order from run to run. The next call copies into them; a batch of another count than
// the one announced gets tensors of its own, and nothing is made when no batch follows.
TEST(DeviceStaging, TheNextBatchsTensorsAreMadeWhenTheCurrentOneIsHandedOut) {
  LateCopyBackend be;
  std::unique_ptr<DeviceStaging> st = DeviceStaging::create(be, Device::cpu(), {kBatch, kSize, DType::f32, false}, 3);
  ASSERT_NE(st, nullptr);
  const std::vector<int64_t> counts{kBatch, kBatch, 2, 3};   // batch 2 comes short of the 3 announced
  size_t k = 0;
  const auto take = [&]() -> std::optional<DeviceStaging::Filled> {
    if (k == counts.size()) return std::nullopt;
    std::optional<DeviceStaging::Buffer> b = st->acquire();
    if (!b) return std::nullopt;
    fill_batch(*b, static_cast<int64_t>(k));
    return DeviceStaging::Filled{b->index, counts[k++]};
  };
  const auto none = []() -> std::optional<DeviceStaging::Filled> { return std::nullopt; };
  const auto bytes_of = [](int64_t n) { return n * (3 * kSize * kSize * static_cast<int64_t>(sizeof(float)) + 8); };
  const auto allocated = [] { return memory_stats(Device::cpu()).allocated_bytes; };
  const int64_t before = allocated();
  std::optional<Batch> b0 = st->next(take, none, kBatch);
  EXPECT_EQ(allocated() - before, 2 * bytes_of(kBatch)) << "batch 0, and batch 1's tensors";
  std::optional<Batch> b1 = st->next(take, none, 3);
  EXPECT_EQ(allocated() - before, 2 * bytes_of(kBatch) + bytes_of(3)) << "batch 1 in the tensors made for it";
  std::optional<Batch> b2 = st->next(take, none, 3);   // 2 samples came: the 3-sample tensors go
  EXPECT_EQ(allocated() - before, 2 * bytes_of(kBatch) + bytes_of(2) + bytes_of(3));
  std::optional<Batch> b3 = st->next(take, none, 0);
  EXPECT_EQ(allocated() - before, 2 * bytes_of(kBatch) + bytes_of(2) + bytes_of(3)) << "no batch follows";
  EXPECT_FALSE(st->next(take, none, 0).has_value());
  be.sync_compute();
  ASSERT_TRUE(b1 && b2 && b3);
  expect_batch(*b1, 1, kBatch);
  expect_batch(*b2, 2, 2);
  expect_batch(*b3, 3, 3);
  st.reset();
  EXPECT_EQ(be.freed_while_read, 0);
}

}  // namespace
}  // namespace minidl::data
