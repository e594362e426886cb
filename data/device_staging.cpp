// The loader's device path: page-locked batch buffers reused only after the copy reading them has
// completed, and a one-batch lookahead so that the next batch's host->device copy runs on the
// backend's copy stream while the caller computes on the current one (see device_staging.h).
#include "data/device_staging.h"

#include <cstdio>
#include <exception>
#include <utility>

#include "core/ops.h"

namespace minidl::data {

DeviceStaging::DeviceStaging(Backend& be, Device device, const Layout& layout)
    : be_(be), device_(device), layout_(layout) {
  const int64_t s = layout.size;
  const size_t labels_bytes = static_cast<size_t>(layout.batch_size) * sizeof(int64_t);
  images_offset_ = (labels_bytes + 63) / 64 * 64;
  buffer_bytes_ = images_offset_ + static_cast<size_t>(layout.batch_size * s * s * 3) * dtype_size(layout.dtype);
}

std::unique_ptr<DeviceStaging> DeviceStaging::create(Backend& be, Device device, const Layout& layout, int count) {
  MINIDL_CHECK(count >= 1 && layout.batch_size > 0 && layout.size > 0, "DeviceStaging: ", count,
               " buffers of batch ", layout.batch_size, " x ", layout.size, "^2: need at least one non-empty buffer");
  std::unique_ptr<DeviceStaging> st(new DeviceStaging(be, device, layout));
  for (int i = 0; i < count; ++i) {
    void* p = be.pinned_alloc(st->buffer_bytes_);
    if (p == nullptr) return nullptr;   // no pinned memory here: the destructor frees what was had
    st->bufs_.push_back(Pinned{p, nullptr});
  }
  st->restart();
  return st;
}

DeviceStaging::~DeviceStaging() {
  try {
    drop_prefetched();
    for (Pinned& b : bufs_) {
      if (b.last_copy) b.last_copy->host_wait();   // no DMA may still read the buffer
      b.last_copy.reset();
      be_.pinned_free(b.ptr);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "minidl: Loader: releasing pinned batches failed: %s\n", e.what());
  }
}

std::optional<DeviceStaging::Buffer> DeviceStaging::acquire() {
  int index;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return interrupted_ || !free_.empty(); });
    if (interrupted_) return std::nullopt;
    index = free_.back();
    free_.pop_back();
  }
  // Written by upload() before the buffer went back to free_ (under mu_), so safe to read here.
  Pinned& b = bufs_[static_cast<size_t>(index)];
  if (b.last_copy) b.last_copy->host_wait();   // the previous batch's DMA may still read it
  b.last_copy.reset();
  return Buffer{index, static_cast<int64_t*>(b.ptr), static_cast<char*>(b.ptr) + images_offset_};
}

void DeviceStaging::release(int index) {
  MINIDL_CHECK(index >= 0 && index < buffers(), "DeviceStaging::release: no buffer ", index, " (", buffers(),
               " buffers)");
  std::lock_guard<std::mutex> lock(mu_);
  free_.push_back(index);
  cv_.notify_all();
}

void DeviceStaging::interrupt() {
  std::lock_guard<std::mutex> lock(mu_);
  interrupted_ = true;
  cv_.notify_all();
}

void DeviceStaging::restart() {
  drop_prefetched();
  std::lock_guard<std::mutex> lock(mu_);
  interrupted_ = false;
  free_.clear();
  // Every buffer is free (a copy still reading one is waited for when it is acquired).
  for (size_t i = bufs_.size(); i-- > 0;) free_.push_back(static_cast<int>(i));
}

DeviceStaging::InFlight DeviceStaging::upload(const Filled& f) {
  MINIDL_CHECK(f.index >= 0 && f.index < buffers() && f.count >= 1 && f.count <= layout_.batch_size,
               "DeviceStaging: buffer ", f.index, " with ", f.count, " samples (", buffers(), " buffers of ",
               layout_.batch_size, ")");
  InFlight fl;
  if (reserved_ && reserved_->labels.size(0) == f.count) {
    fl.batch = std::move(*reserved_);
    reserved_.reset();
  } else {
    reserved_.reset();   // another count: its tensors go before this batch's are made
    fl.batch = device_batch(f.count);
  }
  Pinned& b = bufs_[static_cast<size_t>(f.index)];
  fl.copy = be_.copy_async({{static_cast<char*>(b.ptr) + images_offset_, fl.batch.images}, {b.ptr, fl.batch.labels}});
  b.last_copy = fl.copy;
  release(f.index);
  return fl;
}

Batch DeviceStaging::device_batch(int64_t count) const {
  const int64_t s = layout_.size, c = count;
  const TensorOptions to{.dtype = layout_.dtype, .device = device_};
  Batch batch;
  batch.images = layout_.channels_last ? empty({c, s, s, 3}, to) : empty({c, 3, s, s}, to);
  batch.labels = empty({c}, {.dtype = DType::i64, .device = device_});
  return batch;
}

// Before device tensors whose copy may be in flight are freed, the compute stream waits for it.
void DeviceStaging::drop_prefetched() {
  if (prefetched_ && prefetched_->copy) prefetched_->copy->make_compute_wait();
  prefetched_.reset();
  reserved_.reset();   // no copy has written it
}

std::optional<Batch> DeviceStaging::next(const Source& take, const Source& try_take, int64_t next_count) {
  if (!prefetched_) {
    std::optional<Filled> f = take();
    if (!f) {
      reserved_.reset();
      return std::nullopt;
    }
    prefetched_ = upload(*f);
  }
  InFlight cur = std::move(*prefetched_);
  prefetched_.reset();
  if (std::optional<Filled> f = try_take()) {
    prefetched_ = upload(*f);
  } else if (next_count > 0) {
    reserved_ = device_batch(next_count);
  }
  cur.copy->make_compute_wait();
  return std::move(cur.batch);
}

}  // namespace minidl::data
