// Every byte of tensor memory goes through an Allocator, so the statistics below are exact and a
// memory budget can make any machine behave like a smaller one (the maximum-batch experiments
// rely on this). Names follow PyTorch's torch.cuda.memory_stats().
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/device.h"
#include "core/scoped_flag.h"

namespace minidl {

struct MemoryStats {
  int64_t allocated_bytes = 0;        // bytes held by live tensors (as requested)
  int64_t peak_allocated_bytes = 0;
  int64_t reserved_bytes = 0;         // bytes obtained from the system (rounded blocks + cache)
  int64_t peak_reserved_bytes = 0;
  int64_t num_allocs = 0;             // successful allocations since start
  int64_t num_frees = 0;
  int64_t num_ooms = 0;               // OutOfMemoryError thrown
  int64_t budget_bytes = 0;           // 0: no budget
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Throws OutOfMemoryError when the request would push reserved bytes past the budget.
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak_stats() = 0;
  virtual void set_budget(size_t bytes) = 0;   // 0 removes the budget
  virtual void empty_cache() {}
  virtual Device device() const = 0;
  // Expandable segments (PyTorch's expandable_segments): a CUDA device's caching allocator grows one
  // address range page by page instead of reserving fixed segments (kernels/caching_allocator.h).
  // Returns false when this allocator cannot do what is asked (only "off" is always possible).
  virtual bool set_expandable_segments(bool on) { return !on; }
  virtual bool expandable_segments() const { return false; }
  // A release of last resort: a request that does not fit even with the cache released asks the
  // handlers, newest first, on the requesting thread and without the allocator's lock, until one
  // returns true (it freed memory: a CUDA graph's private pool, train/graphed_step.h); the request
  // is then tried once more before it fails. The handler gets the request's bytes. Returns an id
  // for remove_out_of_memory_handler. Only a device's caching allocator asks them, for eager work
  // (kernels/caching_allocator.h), never inside a CUDA graph's capture; the host's never does (0: not kept).
  virtual int add_out_of_memory_handler(std::function<bool(size_t)> /*handler*/) { return 0; }
  virtual void remove_out_of_memory_handler(int /*id*/) {}
};

// The books every allocator below keeps, MemoryStats under one mutex, and the calls that only read
// or reset them; a subclass does its own accounting in s_ while holding mu_.
class StatsAllocator : public Allocator {
 public:
  MemoryStats stats() const override;
  void reset_peak_stats() override;
  void set_budget(size_t bytes) override;

 protected:
  mutable std::mutex mu_;   // guards s_ and the subclass's own books
  MemoryStats s_;
};

// The host allocator: 64-byte aligned blocks; reserved = the sizes of live blocks (a request's
// rounded size, or the cached block that served it) plus the cache. The cache exists because glibc serves blocks over 32 MiB with mmap and returns them with
// munmap, so without it every large tensor of a training step came back as fresh pages that the
// kernel faults in and zeroes (half the CPU time of the small CNN at batch 64).
// Its rules, exact so that a model of this allocator can reproduce the statistics:
//  - a freed block of at least kCacheMinBytes (rounded) stays reserved, in the cache;
//  - a request of that size first takes a cached block of exactly its rounded size (the most
//    recently freed one); failing that, when no budget is set, the smallest cached block of at
//    most kFitRatio (2) times its rounded size (the most recently freed of that size), which stays
//    that size while it is live. Without this, every change of shape (an epoch's last partial
//    batch, an evaluation batch) missed the cache, evicted the full batches' blocks and faulted
//    them back in: the small CNN at batch 256 on 1,200 photos trained at 160 images/s, half its
//    speed on a split with no partial batch, with half of its CPU time in the kernel. Under a
//    budget the sizes stay exact, so a batch fits the budget exactly when it did without the cache;
//  - otherwise, before asking the system, cached blocks are released, largest first, until the
//    large blocks (live and cached) plus the new one fit within the limit: kCacheSlack (1.5) times
//    the high-water mark, the most bytes that live large blocks held at once since the last
//    empty_cache() (at least the new block). So the cache adds at most half of that mark to
//    reserved. Exact sizes need a pool larger than the live peak, because the sizes live at the
//    peak are not all the sizes a step uses: replaying the block traces of training steps, the
//    small CNN at 200 px needs 1.14-1.24x its live peak, ResNet-18/50 1.23-1.34x; with no slack
//    each of their steps still faulted in 21-67% of its large bytes;
//  - any request that would push reserved past the budget first releases cached blocks, largest
//    first, until it fits; one that still does not fit with the cache empty throws
//    OutOfMemoryError. The budget still caps reserved, cache included, and a batch fits exactly
//    when it did without the cache;
//  - small blocks never release cached ones except under the budget; empty_cache() releases every
//    cached block and lowers the high-water mark to what is live.
// After a caught OOM, allocated returns to its earlier value; reserved may keep the step's freed
// blocks in the cache (as on CUDA) and stays within the budget. MINIDL_CPU_CACHE=0 in the
// environment turns the cache off (reserved = live blocks, every large block from the system).
// Built for the meta device (Device::meta(CPU)) it keeps the same books, cache, budget and errors
// but hands out address ranges with no memory behind them: the dry run's allocator is this class,
// not a copy of its rules, so meta:cpu's peaks (allocated and reserved) are the host's.
class CpuAllocator final : public StatsAllocator {
 public:
  static constexpr size_t kAlignment = 64;
  static constexpr size_t kCacheMinBytes = size_t{1} << 20;
  static constexpr double kCacheSlack = 1.5;
  static constexpr size_t kFitRatio = 2;
  explicit CpuAllocator(Device device = Device::cpu());
  void* allocate(size_t nbytes) override;
  void deallocate(void* ptr, size_t nbytes) override;
  void empty_cache() override;
  Device device() const override { return device_; }
  static size_t rounded(size_t nbytes) { return (nbytes + kAlignment - 1) / kAlignment * kAlignment; }
  // Bytes held by the cache (part of reserved), and the requests it served since start.
  int64_t cached_bytes() const;
  int64_t cache_hits() const;
  // The bytes of the block behind a live allocation p of nbytes: rounded(nbytes), or the larger
  // cached block that served it.
  size_t block_bytes(const void* p, size_t nbytes) const;

 private:
  // The system side: aligned_alloc/free, or for the meta device an address range (never reused,
  // never mapped, so a kernel that reads meta memory faults at once).
  void* raw_alloc(size_t block);
  void raw_free(void* p);
  // Releases cached blocks, largest first, until used + block <= limit or the cache is empty (used
  // is reserved_bytes or large_reserved_, which the release lowers). Needs mu_.
  void evict_locked(const int64_t& used, int64_t block, int64_t limit);
  [[noreturn]] void oom_locked(size_t nbytes, const char* why);
  int64_t large_limit_locked() const {
    return static_cast<int64_t>(kCacheSlack * static_cast<double>(high_water_));
  }

  Device device_;
  bool backed_ = true;
  bool cache_enabled_ = true;
  std::multimap<size_t, void*> cache_;  // rounded size -> block
  std::unordered_map<const void*, size_t> larger_;  // live blocks larger than their request's rounded size
  int64_t cached_bytes_ = 0;
  int64_t large_reserved_ = 0;          // live large blocks + the cache
  int64_t high_water_ = 0;              // most bytes of live large blocks since the last empty_cache()
  int64_t cache_hits_ = 0;
  std::atomic<uintptr_t> next_address_{uintptr_t{1} << 44};
};

CpuAllocator& cpu_allocator();
// The allocator of a device; for CUDA it comes from the CUDA backend (throws without one).
Allocator& allocator_for(Device d);

// Convenience front-ends used by the experiments and tests.
MemoryStats memory_stats(Device d = Device::cpu());
void reset_peak_stats(Device d = Device::cpu());
void set_memory_budget(Device d, size_t bytes);
// Throws when the device's allocator has no expandable segments (the CPU's), or when it holds a
// tensor: the mode is chosen before the first. The library workspaces drawn up front
// (draw_library_workspaces) do not count: when they are all it holds they are given back, the mode
// changes, and they are drawn again in the new one.
void set_expandable_segments(Device d, bool on);
void empty_cache(Device d = Device::cpu());
// While one lives on this thread, a request that does not fit fails without asking the
// out-of-memory handlers (Allocator::add_out_of_memory_handler): its caller has a leaner way on (a
// cuDNN workspace with a leaner plan after it), which costs less than what a handler would drop (a
// CUDA graph's pool, and with it the replays of every step to come).
class TentativeRequests : ScopedFlag {
 public:
  TentativeRequests() : ScopedFlag(active_, true) {}
  static bool active() { return active_; }

 private:
  static thread_local bool active_;
};
// Allocator::add_out_of_memory_handler and remove_out_of_memory_handler of the device's allocator.
int add_out_of_memory_handler(Device d, std::function<bool(size_t)> handler);
void remove_out_of_memory_handler(Device d, int id);
// DeviceServices::draw_library_workspaces of the device's backend (nothing on the CPU).
void draw_library_workspaces(Device d);
// Parses "11GiB", "512MiB", "1.5GB", "1000000" (bytes); throws on anything else.
size_t parse_bytes(const std::string& s);

}  // namespace minidl
