// The loader pipeline: N workers decode, transform and convert samples (positions of the epoch's
// order) into a ring of slots, each slot one sample as the batch holds it (dtype, layout, scaling);
// one assembler thread walks the positions in order, skips unreadable samples and copies the
// slots into batches in a bounded queue. The conversion is the workers' because the assembler is
// the one thread every image goes through: its work per image bounds the loader whatever the
// worker count, and a copy is about half a conversion's. Because only the assembler decides batch
// boundaries, and every random draw is keyed by (seed, epoch, sample index), the batches are the
// same for any worker count, bad files included. For a device with pinned memory (CUDA) the
// batches are assembled in page-locked buffers and copied while the previous batch is in use
// (data/device_staging.cpp). There, the next epoch is made ahead too: once the caller has had an
// epoch's last batch, the workers start on the following epoch's (its order and draws are known),
// so its first batches wait in the queue when the caller asks for them after validation, instead
// of the device waiting for a whole batch at every epoch's start. The staging buffers are made
// once and the device's requests come only from next(), so this changes no memory a run uses; on
// the CPU the batches are the run's own memory, and nothing is made ahead.
#include "data/loader.h"

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "core/backend.h"
#include "core/philox.h"
#include "data/base_images.h"
#include "data/device_staging.h"
#include "data/transform.h"

namespace minidl::data {

namespace {

constexpr uint64_t kShuffleStream = 0x5348554646ull;  // "SHUFF"
constexpr uint64_t kAugmentStream = 0x4155474dull;    // "AUGM"

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

}  // namespace

std::vector<int64_t> epoch_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[static_cast<size_t>(i)] = i;
  if (!shuffle) return v;
  const uint64_t key = epoch_key(seed, epoch, kShuffleStream);
  for (size_t i = v.size(); i > 1; --i) {
    const philox::U4 u = philox::draw(key, i);
    const uint64_t r = (static_cast<uint64_t>(u.x) << 32) | u.y;
    std::swap(v[i - 1], v[static_cast<size_t>(r % i)]);
  }
  return v;
}

struct Loader::Impl {
  struct Slot {
    int64_t ready_pos = -1;   // the position whose result this slot holds
    bool ok = false;
    std::vector<uint8_t> px;  // one sample as the batch holds it (BatchWriter::sample_bytes())
  };

  std::shared_ptr<const Dataset> ds;
  LoaderOptions opt;
  BatchWriter writer;
  int64_t hwc_bytes;   // a transformed sample, size x size x 3 u8

  // Shared across epochs: the RAM cache and the samples known to be unreadable.
  std::unique_ptr<BaseImages> bases;

  // The current epoch.
  bool started = false;
  int64_t epoch_now = 0;
  // The pipeline runs epoch_now, started by next() at the end of the previous epoch, not yet asked
  // for by start_epoch(): next() hands out nothing until it is.
  bool ahead = false;
  std::vector<int64_t> order;
  uint64_t aug_key = 0;
  std::mutex mu;
  std::condition_variable cv_work, cv_sample, cv_queue;
  bool stop = false;
  int64_t next_claim = 0, assembled_pos = 0;
  std::vector<Slot> ring;
  // A finished batch: the batch itself, or (device path) the staging buffer holding `count` samples.
  struct Queued {
    Batch batch;
    int pinned = -1;
    int64_t count = 0;
  };
  std::deque<Queued> queue;
  bool epoch_done = false;
  std::exception_ptr error;
  std::vector<std::thread> workers;
  std::thread assembler;
  int64_t sync_pos = 0;  // workers == 0: the next position next() reads
  int64_t handed = 0;    // samples next() has handed out this epoch

  // The device path: page-locked buffers from the device's backend, made at the first epoch (none
  // for the CPU, or a backend without pinned memory: batches are then copied with Tensor::to).
  bool staging_tried = false;
  std::unique_ptr<DeviceStaging> staging;

  // Statistics.
  Clock::time_point stats_start = Clock::now();
  int64_t delivered = 0;
  double wait = 0;

  Impl(std::shared_ptr<const Dataset> d, LoaderOptions o)
      : ds(std::move(d)), opt(std::move(o)), writer(opt.transform, opt.dtype, opt.channels_last),
        hwc_bytes(opt.transform.size * opt.transform.size * 3) {
    MINIDL_CHECK(ds != nullptr, "Loader: the dataset is null");
    MINIDL_CHECK(opt.batch_size > 0, "Loader: batch_size must be positive, got ", opt.batch_size);
    MINIDL_CHECK(opt.workers >= 0, "Loader: workers must be >= 0, got ", opt.workers);
    MINIDL_CHECK(opt.prefetch_batches >= 1, "Loader: prefetch_batches must be >= 1, got ", opt.prefetch_batches);
    MINIDL_CHECK(opt.transform.size > 0, "Loader: transform.size must be positive, got ", opt.transform.size);
    MINIDL_CHECK(opt.transform.augment == Augment::RandomResizedCrop || resolved_resize(opt.transform) >= opt.transform.size,
                 "Loader: transform.resize (", resolved_resize(opt.transform), ") is smaller than the crop size (",
                 opt.transform.size, "); use resize >= size or 0 for the default");
    bases = std::make_unique<BaseImages>(ds, opt.transform, opt.cache, opt.cache_limit_bytes);
  }

  ~Impl() {
    stop_pipeline();
    staging.reset();   // after the threads: waits for the copies still reading its buffers
  }

  // Sample `pos` of the epoch, transformed through `hwc` (hwc_bytes) and converted into `out`
  // (writer.sample_bytes()); false when it is unreadable.
  bool produce(int64_t pos, uint8_t* hwc, void* out) {
    const int64_t idx = order[static_cast<size_t>(pos)];
    const auto base = bases->get(idx);
    if (!base) return false;
    apply_transform(*base, opt.transform, aug_key, idx, hwc);
    writer.write(hwc, out, 0);
    return true;
  }

  int64_t window() const { return std::max<int64_t>(2, 4 * static_cast<int64_t>(opt.workers)); }

  Batch new_batch() const {
    const int64_t b = opt.batch_size, s = opt.transform.size;
    Batch batch;
    batch.images = opt.channels_last ? empty({b, s, s, 3}, {.dtype = opt.dtype}) : empty({b, 3, s, s}, {.dtype = opt.dtype});
    batch.labels = empty({b}, {.dtype = DType::i64});
    return batch;
  }

  static Batch trimmed(Batch b, int64_t count) {
    if (count == b.labels.size(0)) return b;
    return Batch{b.images.slice(0, 0, count), b.labels.slice(0, 0, count)};
  }

  // Where assemble() writes: a fresh CPU batch, or a free staging buffer.
  struct Target {
    Queued q;
    void* images = nullptr;
    int64_t* labels = nullptr;
  };
  Target begin_batch() {
    Target t;
    if (staging) {
      std::optional<DeviceStaging::Buffer> b = staging->acquire();
      if (!b) throw std::runtime_error("stopped");
      t.q.pinned = b->index;
      t.labels = b->labels;
      t.images = b->images;
      return t;
    }
    t.q.batch = new_batch();
    t.images = t.q.batch.images.data_ptr();
    t.labels = t.q.batch.labels.data<int64_t>();
    return t;
  }

  void release_pinned(int index) {
    if (index >= 0) staging->release(index);
  }

  // Stops the threads at their next wait (with mu held): on error or at the end of an epoch.
  void stop_locked() {
    stop = true;
    if (staging) staging->interrupt();   // an assembler waiting for a free buffer
  }

  // Assembles one batch from positions [*pos, ...) using get(pos, &px) -> ok, px the converted
  // sample; nullopt at the end.
  template <typename Get>
  std::optional<Queued> assemble(int64_t* pos, Get&& get) {
    const auto n = static_cast<int64_t>(order.size());
    std::optional<Target> t;
    int64_t count = 0;
    while (*pos < n && count < opt.batch_size) {
      const uint8_t* px = nullptr;
      const int64_t p = (*pos)++;
      if (!get(p, &px)) continue;
      if (!t) t = begin_batch();
      const auto bytes = static_cast<size_t>(writer.sample_bytes());
      std::memcpy(static_cast<uint8_t*>(t->images) + static_cast<size_t>(count) * bytes, px, bytes);
      t->labels[count] = ds->label(order[static_cast<size_t>(p)]);
      ++count;
    }
    if (count == 0 || (count < opt.batch_size && opt.drop_last)) {
      if (t) release_pinned(t->q.pinned);
      return std::nullopt;
    }
    t->q.count = count;
    if (t->q.pinned < 0) t->q.batch = trimmed(std::move(t->q.batch), count);
    return std::move(t->q);
  }

  void worker_loop() {
    try {
      std::vector<uint8_t> hwc(static_cast<size_t>(hwc_bytes));
      for (;;) {
        int64_t pos;
        Slot* slot;
        {
          std::unique_lock<std::mutex> lock(mu);
          cv_work.wait(lock, [&] {
            return stop || next_claim >= static_cast<int64_t>(order.size()) || next_claim < assembled_pos + window();
          });
          if (stop || next_claim >= static_cast<int64_t>(order.size())) return;
          pos = next_claim++;
          slot = &ring[static_cast<size_t>(pos % window())];
        }
        const bool ok = produce(pos, hwc.data(), slot->px.data());
        {
          std::lock_guard<std::mutex> lock(mu);
          slot->ok = ok;
          slot->ready_pos = pos;
        }
        cv_sample.notify_all();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!error) error = std::current_exception();
      stop_locked();
      cv_work.notify_all();
      cv_sample.notify_all();
      cv_queue.notify_all();
    }
  }

  void assembler_loop() {
    try {
      int64_t pos = 0;
      int64_t held = -1;  // the position whose slot the assembler is reading
      const auto get = [&](int64_t p, const uint8_t** px) {
        std::unique_lock<std::mutex> lock(mu);
        if (held >= 0) {  // release the previous slot to the workers
          assembled_pos = held + 1;
          cv_work.notify_all();
        }
        Slot& slot = ring[static_cast<size_t>(p % window())];
        cv_sample.wait(lock, [&] { return stop || slot.ready_pos == p; });
        if (stop) throw std::runtime_error("stopped");
        held = p;
        *px = slot.px.data();
        return slot.ok;
      };
      for (;;) {
        std::optional<Queued> b = assemble(&pos, get);
        std::unique_lock<std::mutex> lock(mu);
        if (held >= 0) {
          assembled_pos = held + 1;
          cv_work.notify_all();
        }
        if (!b) {
          epoch_done = true;
          cv_queue.notify_all();
          return;
        }
        cv_queue.wait(lock, [&] { return stop || static_cast<int64_t>(queue.size()) < opt.prefetch_batches; });
        if (stop) return;
        queue.push_back(std::move(*b));
        cv_queue.notify_all();
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (!stop && !error) error = std::current_exception();
      stop_locked();
      epoch_done = true;
      cv_work.notify_all();
      cv_queue.notify_all();
    }
  }

  void stop_pipeline() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stop_locked();
    }
    cv_work.notify_all();
    cv_sample.notify_all();
    cv_queue.notify_all();
    for (auto& t : workers) t.join();
    workers.clear();
    if (assembler.joinable()) assembler.join();
  }

  // The samples of `epoch` in order.
  std::vector<int64_t> order_of(int64_t epoch) const {
    return opt.sampler ? opt.sampler(epoch) : epoch_order(ds->size(), opt.shuffle, opt.seed, epoch);
  }

  // Whether the epoch the pipeline runs ahead has the batches `epoch` would have: the same samples
  // in the same order and, when augmenting, the same draws (an evaluation loader's epochs are all
  // alike, whatever their number).
  bool ahead_is(int64_t epoch) const {
    if (!ahead) return false;
    if (opt.transform.augment != Augment::None && epoch_key(opt.seed, epoch, kAugmentStream) != aug_key) return false;
    return order_of(epoch) == order;
  }

  // At the end of an epoch on the device path: the workers start on the next one.
  void start_ahead() {
    if (opt.workers == 0 || !staging) return;
    start(epoch_now + 1);
    ahead = true;
  }

  void start(int64_t epoch) {
    stop_pipeline();
    ahead = false;
    epoch_now = epoch;
    if (staging && staging->layout().batch_size < opt.batch_size) {
      staging.reset();         // set_batch_size() outgrew the buffers; no thread uses them now
      staging_tried = false;
    }
    if (staging) {
      staging->restart();   // no thread runs now
    } else if (!opt.device.is_cpu() && !staging_tried) {
      staging_tried = true;
      // Enough buffers that neither the assembler nor next() ever waits for one: the queue, the one
      // being assembled, the prefetched one and one spare. backend() throws, like the copy would,
      // when the device's backend is not built or not usable.
      staging = DeviceStaging::create(backend(opt.device), opt.device,
                                      {opt.batch_size, opt.transform.size, opt.dtype, opt.channels_last},
                                      opt.prefetch_batches + 3);
    }
    order = order_of(epoch);
    for (const int64_t i : order)
      MINIDL_CHECK(i >= 0 && i < ds->size(), "Loader: the sampler gave index ", i, " for a dataset of ", ds->size());
    aug_key = epoch_key(opt.seed, epoch, kAugmentStream);
    stop = false;
    epoch_done = false;
    error = nullptr;
    queue.clear();
    next_claim = 0;
    assembled_pos = 0;
    sync_pos = 0;
    handed = 0;
    started = true;
    if (opt.workers == 0) return;
    ring.assign(static_cast<size_t>(window()), Slot{});
    for (auto& s : ring) s.px.resize(static_cast<size_t>(writer.sample_bytes()));
    assembler = std::thread([this] { assembler_loop(); });
    for (int w = 0; w < opt.workers; ++w) workers.emplace_back([this] { worker_loop(); });
  }

  std::optional<Queued> take() {
    if (opt.workers == 0) {
      std::vector<uint8_t> hwc(static_cast<size_t>(hwc_bytes)), px(static_cast<size_t>(writer.sample_bytes()));
      return assemble(&sync_pos, [&](int64_t p, const uint8_t** out) {
        *out = px.data();
        return produce(p, hwc.data(), px.data());
      });
    }
    std::unique_lock<std::mutex> lock(mu);
    cv_queue.wait(lock, [&] { return !queue.empty() || epoch_done || error; });
    if (error) std::rethrow_exception(error);
    return pop_locked();
  }

  // A batch already assembled, without waiting (nullopt when none is ready, or without workers).
  std::optional<Queued> try_take() {
    if (opt.workers == 0) return std::nullopt;
    std::lock_guard<std::mutex> lock(mu);
    return pop_locked();
  }

  // The queue's first batch (nullopt when it is empty), waking the assembler waiting for room; mu held.
  std::optional<Queued> pop_locked() {
    if (queue.empty()) return std::nullopt;
    Queued b = std::move(queue.front());
    queue.pop_front();
    cv_queue.notify_all();
    return b;
  }

  // next() on the device path: the staging buffers' batches, copied one batch ahead.
  std::optional<Batch> next_staged() {
    const auto filled = [](std::optional<Queued> q) -> std::optional<DeviceStaging::Filled> {
      if (!q) return std::nullopt;
      return DeviceStaging::Filled{q->pinned, q->count};
    };
    // The batch after this one, as the epoch's order gives it (a batch short of unreadable samples
    // only makes the staging allocate again): its device tensors are made on this call either way.
    const auto n = static_cast<int64_t>(order.size()), b = opt.batch_size;
    const int64_t after = n - handed - std::min(b, n - handed);
    const int64_t next_count = opt.drop_last ? (after >= b ? b : 0) : std::min(b, after);
    std::optional<Batch> out = staging->next([&] { return filled(take()); }, [&] { return filled(try_take()); },
                                             std::max<int64_t>(next_count, 0));
    if (out) handed += out->labels.size(0);
    return out;
  }
};

Loader::Loader(std::shared_ptr<const Dataset> dataset, LoaderOptions options)
    : impl_(std::make_unique<Impl>(std::move(dataset), std::move(options))) {}

Loader::~Loader() = default;

int64_t Loader::batches_per_epoch() const {
  const int64_t n = impl_->opt.sampler ? static_cast<int64_t>(impl_->opt.sampler(0).size()) : impl_->ds->size();
  const int64_t b = impl_->opt.batch_size;
  return impl_->opt.drop_last ? n / b : (n + b - 1) / b;
}

void Loader::start_epoch(int64_t epoch) {
  if (impl_->ahead_is(epoch)) {   // made ahead already: keep what the workers have done
    impl_->ahead = false;
    impl_->epoch_now = epoch;
    return;
  }
  impl_->start(epoch);
}

void Loader::set_batch_size(int64_t size) {
  MINIDL_CHECK(size > 0, "Loader::set_batch_size: the batch size must be positive, got ", size);
  impl_->stop_pipeline();   // the running epoch's threads read opt.batch_size
  impl_->ahead = false;
  impl_->opt.batch_size = size;
  impl_->started = false;   // as a new loader: next() without start_epoch() starts epoch 0
}

std::optional<Batch> Loader::next() {
  if (!impl_->started) impl_->start(0);
  if (impl_->ahead) return std::nullopt;   // the epoch has ended; the next one waits for start_epoch()
  const auto t0 = Clock::now();
  if (impl_->staging) {
    std::optional<Batch> pb = impl_->next_staged();
    impl_->wait += seconds_since(t0);
    if (pb) {
      impl_->delivered += pb->labels.size(0);
    } else {
      impl_->start_ahead();
    }
    return pb;
  }
  std::optional<Impl::Queued> q = impl_->take();
  impl_->wait += seconds_since(t0);
  if (!q) return std::nullopt;
  std::optional<Batch> b = std::move(q->batch);
  impl_->delivered += b->labels.size(0);
  if (!impl_->opt.device.is_cpu()) {
    // A device backend without pinned memory: the backend stages the copy itself.
    b->images = b->images.to(impl_->opt.device);
    b->labels = b->labels.to(impl_->opt.device);
  }
  return b;
}

LoaderStats Loader::stats() const {
  LoaderStats s;
  s.images = impl_->delivered;
  s.skipped = impl_->bases->skipped();
  s.wall_seconds = seconds_since(impl_->stats_start);
  s.wait_seconds = impl_->wait;
  s.cached_images = impl_->bases->cached_images();
  s.cached_bytes = impl_->bases->cached_bytes();
  return s;
}

std::vector<int64_t> Loader::skipped_indices() const { return impl_->bases->skipped_indices(); }

void Loader::reset_stats() {
  impl_->stats_start = Clock::now();
  impl_->delivered = 0;
  impl_->wait = 0;
}

const LoaderOptions& Loader::options() const { return impl_->opt; }

}  // namespace minidl::data
