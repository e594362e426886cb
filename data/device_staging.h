// Batches for a device other than the CPU: assembled in page-locked host memory and copied through
// Backend::copy_async while the caller works on the previous batch. Split from the loader, which
// decides what goes into a batch; this decides where it lives and when its buffer may be rewritten.
#pragma once
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "core/backend.h"
#include "data/loader.h"

namespace minidl::data {

class DeviceStaging {
 public:
  // The shape of the batches: [batch_size] i64 labels, [batch_size, 3, size, size] images (or
  // [batch_size, size, size, 3] with channels_last) of dtype.
  struct Layout {
    int64_t batch_size = 0, size = 0;
    DType dtype = DType::f32;
    bool channels_last = false;
  };
  // `count` buffers from be.pinned_alloc for batches copied to `device` (one of be's devices), all
  // free; nullptr when the backend has no pinned memory (the caller then copies with Tensor::to).
  static std::unique_ptr<DeviceStaging> create(Backend& be, Device device, const Layout& layout, int count);
  // Waits for the copies still reading a buffer, then frees the buffers. Never throws.
  ~DeviceStaging();
  DeviceStaging(const DeviceStaging&) = delete;
  DeviceStaging& operator=(const DeviceStaging&) = delete;

  struct Buffer {
    int index = -1;
    int64_t* labels = nullptr;   // batch_size labels
    void* images = nullptr;      // batch_size images in the layout
  };
  // A free buffer whose last copy has completed (so it may be written); blocks until one is free.
  // nullopt once interrupt() has been called (the loader's pipeline is stopping).
  std::optional<Buffer> acquire();
  // Gives back a buffer that was not filled after all.
  void release(int index);
  void interrupt();

  // A filled buffer: its first `count` samples form a batch.
  struct Filled {
    int index = -1;
    int64_t count = 0;
  };
  using Source = std::function<std::optional<Filled>()>;
  // The batch whose copy was queued on the previous call (or now, from take(): blocking), after
  // queueing the copy of the one try_take() gives (never blocking), so that this transfer overlaps
  // the caller's work on the batch returned. The compute stream waits for the returned batch's
  // copy. nullopt when take() has nothing more.
  //
  // `next_count`: the samples the batch after the returned one will have (0: none comes). When
  // try_take() has nothing yet, its device tensors are allocated now all the same, and the next
  // call copies into them: the device's requests then come in the same order whether or not the
  // workers are ahead, so a run's memory is the same from run to run and a trial can foresee it
  // (the caching allocator places each block by the requests before it). A batch that comes with
  // another count (unreadable samples skipped) gets tensors of its own.
  std::optional<Batch> next(const Source& take, const Source& try_take, int64_t next_count = 0);

  // A new epoch, with no thread using the buffers: the prefetched batch is dropped (the compute
  // stream first waits for its copy), every buffer is free again and interrupt() is cleared.
  void restart();

  int buffers() const { return static_cast<int>(bufs_.size()); }
  const Layout& layout() const { return layout_; }

 private:
  struct Pinned {
    void* ptr = nullptr;
    std::shared_ptr<Backend::CopyHandle> last_copy;   // the copy reading it, if any
  };
  struct InFlight {
    Batch batch;
    std::shared_ptr<Backend::CopyHandle> copy;
  };
  DeviceStaging(Backend& be, Device device, const Layout& layout);
  // Device tensors for a filled buffer and their copy, queued now; the buffer goes back to the pool
  // (its next acquire() waits for this copy first).
  InFlight upload(const Filled& f);
  void drop_prefetched();
  // Device tensors for the next batch of `count` samples, allocated ahead of its data (next()).
  Batch device_batch(int64_t count) const;

  Backend& be_;
  Device device_;
  Layout layout_;
  size_t images_offset_ = 0, buffer_bytes_ = 0;
  std::vector<Pinned> bufs_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::vector<int> free_;          // guarded by mu_
  bool interrupted_ = false;       // guarded by mu_
  std::optional<InFlight> prefetched_;
  std::optional<Batch> reserved_;   // the next batch's device tensors, awaiting its data
};

}  // namespace minidl::data
