// The caching allocator's bookkeeping (see caching_allocator.h for the scheme): blocks, segments,
// the cache, the budget and the out-of-memory path. Every path that changes reserved or allocated
// bytes is here or in its two companions (caching_allocator_pools.cpp: CUDA graphs' private pools;
// caching_allocator_expandable.cpp: the expandable segment), so the statistics the experiments
// report are exact and return to their earlier values after an OOM is caught and the step's tensors
// are dropped.
#include "kernels/caching_allocator.h"

#include <algorithm>
#include <functional>
#include <utility>
#include <vector>

#include "core/error.h"

namespace minidl {

void* AddressRangeSource::raw_alloc(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  if (capacity_ > 0 && held_ + bytes > capacity_) return nullptr;
  held_ += bytes;
  void* p = reinterpret_cast<void*>(next_);
  next_ += (bytes + CachingAllocator::kMinBlock - 1) / CachingAllocator::kMinBlock * CachingAllocator::kMinBlock;
  return p;
}

void AddressRangeSource::raw_free(void* /*ptr*/, size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  held_ -= bytes;
}

CachingAllocator::CachingAllocator(std::unique_ptr<SegmentSource> source, Device device)
    : source_(std::move(source)), device_(device) {}

CachingAllocator::~CachingAllocator() {
  // Only cached (free) segments can be returned safely; live blocks belong to tensors that may
  // still be released later, so their segments are leaked rather than freed under them.
  std::lock_guard<std::mutex> lock(mu_);
  release_cached();
  for (auto& [id, ps] : pools_) {   // private pools' free segments too: no graph outlives its device
    for (Pool* pool : {&ps.small, &ps.large}) {
      for (auto it = pool->begin(); it != pool->end();) {
        Block* b = *it;
        if (id == 0 || b->prev != nullptr || b->next != nullptr) {
          ++it;
          continue;
        }
        source_->raw_free(b->ptr, b->size);
        delete b;
        it = pool->erase(it);
      }
    }
  }
  release_expandable_range();
}

void CachingAllocator::absorb_next(Block* b) {
  Block* n = b->next;
  b->size += n->size;
  b->captured = b->captured || n->captured;   // a replay may write any of its bytes
  b->next = n->next;
  if (n->next != nullptr) n->next->prev = b;
  delete n;
}

CachingAllocator::Pools& CachingAllocator::pools_of(int id) { return pools_[id]; }

size_t CachingAllocator::round_size(size_t nbytes) {
  if (nbytes < kMinBlock) return kMinBlock;
  return (nbytes + kMinBlock - 1) / kMinBlock * kMinBlock;
}

size_t CachingAllocator::segment_size(size_t rounded) {
  if (rounded <= kSmallSize) return kSmallBuffer;
  if (rounded < kMinLargeAlloc) return kLargeBuffer;
  return (rounded + kRoundLarge - 1) / kRoundLarge * kRoundLarge;
}

CachingAllocator::Block* CachingAllocator::find_free(Pool& pool, size_t size) {
  Block key;
  key.size = size;
  key.segment = -1;
  auto it = pool.lower_bound(&key);   // smallest free block >= size (best fit)
  if (it == pool.end()) return nullptr;
  Block* b = *it;
  pool.erase(it);
  return b;
}

CachingAllocator::Block* CachingAllocator::new_segment(size_t rounded, bool small, int pool) {
  const size_t preferred = segment_size(rounded);
  // The preferred size first; a large request whose 20 MiB segment would break the budget may
  // still fit with a segment of exactly its own size.
  std::vector<size_t> sizes{preferred};
  if (!small && preferred != rounded) sizes.push_back(rounded);
  for (size_t seg : sizes) {
    if (s_.budget_bytes > 0 && s_.reserved_bytes + static_cast<int64_t>(seg) > s_.budget_bytes) continue;
    void* p = source_->raw_alloc(seg);
    if (p == nullptr) continue;
    ++raw_allocs_;
    ++segments_;
    s_.reserved_bytes += static_cast<int64_t>(seg);
    s_.peak_reserved_bytes = std::max(s_.peak_reserved_bytes, s_.reserved_bytes);
    Block* b =
        new Block{.ptr = static_cast<char*>(p), .size = seg, .segment = ++segments_made_, .small = small, .pool = pool};
    pools_of(pool).reserved += seg;
    return b;
  }
  return nullptr;
}

void CachingAllocator::release_cached() {
  release_free_segments(pools_of(0));   // a private pool's segments stay while its graph may replay
  unmap_free_pages();
}

void CachingAllocator::free_segment(Block* b, Pools& p, bool& synced) {
  if (!synced) {
    source_->synchronize();
    synced = true;
  }
  source_->raw_free(b->ptr, b->size);
  ++raw_frees_;
  --segments_;
  s_.reserved_bytes -= static_cast<int64_t>(b->size);
  p.reserved -= b->size;
  delete b;
}

void CachingAllocator::release_free_segments(Pools& p) {
  bool synced = false;
  for (Pool* pool : {&p.small, &p.large}) {
    for (auto it = pool->begin(); it != pool->end();) {
      Block* b = *it;
      if (b->prev == nullptr && b->next == nullptr && !b->expandable) {   // a whole segment, free
        free_segment(b, p, synced);
        it = pool->erase(it);
      } else {
        ++it;
      }
    }
  }
}

void CachingAllocator::release_block(Block* b) {
  Pools& pools = pools_of(b->pool);   // a private pool's block goes back to its pool
  Pool& pool = b->small ? pools.small : pools.large;
  // Merge with free neighbours of the same segment and pool (they are in the pool: take them out
  // first). A segment can hold blocks of two pools: free eager blocks a capture adopted, which stay
  // apart from what the capture used, so that what it did not use can go back at its end.
  const auto joins = [&b](const Block* n) {   // b as it is when asked (it may absorb its prev)
    return n != nullptr && !n->allocated && n->pool == b->pool && (!b->adopted || n->captured == b->captured);
  };
  if (joins(b->prev)) {
    b = b->prev;
    pool.erase(b);
    absorb_next(b);
  }
  if (joins(b->next)) {
    pool.erase(b->next);
    absorb_next(b);
  }
  pool.insert(b);
}

CachingAllocator::Block* CachingAllocator::take_block(size_t size, bool small) {
  Pool& pool = small ? pools_of(current_pool_).small : pools_of(current_pool_).large;
  Block* b = find_free(pool, size);
  if (b == nullptr && expandable_on_ && !small && current_pool_ == 0) b = grow_expandable(size);
  if (b == nullptr) b = new_segment(size, small, current_pool_);   // also when the range is used up
  if (b == nullptr) return nullptr;
  // Split off the remainder when it is big enough to be useful to a later request of this pool.
  const size_t remaining = b->size - size;
  if (small ? remaining >= kMinBlock : remaining > kSmallSize) {
    Block* rest = new Block;
    rest->ptr = b->ptr + size;
    rest->size = remaining;
    rest->segment = b->segment;
    rest->small = b->small;
    rest->expandable = b->expandable;
    rest->pool = b->pool;
    rest->adopted = b->adopted;
    rest->captured = b->captured;
    rest->prev = b;
    rest->next = b->next;
    if (b->next != nullptr) b->next->prev = rest;
    b->next = rest;
    b->size = size;
    pool.insert(rest);
  }
  if (b->expandable && !map_pages(b->ptr, b->size)) {
    release_block(b);
    return nullptr;
  }
  return b;
}

void CachingAllocator::throw_oom(size_t nbytes, const std::string& why) {
  ++s_.num_ooms;
  const size_t in_use = static_cast<size_t>(s_.reserved_bytes), budget = static_cast<size_t>(s_.budget_bytes);
  // After the cache was released, reserved bytes without a tensor are holes in segments that still
  // hold live blocks: what expandable segments give back. Said when they are a tenth of it or more.
  const auto holes = static_cast<size_t>(std::max<int64_t>(0, s_.reserved_bytes - s_.allocated_bytes));
  const std::string hint =
      !expandable_on_ && current_pool_ == 0 && holes > 0 && holes >= in_use / 10 && source_->page_size() > 0
          ? " " + format_bytes(holes) + " of the reserved memory holds no tensor, in segments that do: "
                "expandable segments (--expandable-segments) give such memory back to the device."
          : std::string();
  throw OutOfMemoryError("out of memory on " + device_.str() + ": tried to allocate " + format_bytes(nbytes) +
                             " with " + format_bytes(static_cast<size_t>(s_.allocated_bytes)) + " allocated, " +
                             format_bytes(in_use) + " reserved" +
                             (budget > 0 ? " and a memory budget of " + format_bytes(budget) : std::string()) +
                             " (" + why + "). Use a smaller batch, gradient accumulation or recomputation" +
                             (budget > 0 ? ", or raise the budget." : ".") + hint,
                         nbytes, in_use, budget);
}

void* CachingAllocator::allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  std::vector<std::function<bool(size_t)>> handlers;
  {
    std::lock_guard<std::mutex> lock(mu_);
    // Eager work may ask the handlers, in the eager pools or in a lent one (a CUDA graph's pool
    // may go: a lent pool's live blocks then belong to the eager pools, where the request is tried
    // again); a capture's request fails at once, since it cannot release memory.
    const bool may_ask = (current_pool_ == 0 || lending_) && !oom_handlers_.empty() && !TentativeRequests::active();
    if (void* p = allocate_locked(nbytes, !may_ask)) return p;
    for (auto it = oom_handlers_.rbegin(); it != oom_handlers_.rend(); ++it) handlers.push_back(it->second);
  }
  // Without the lock: a handler frees tensors and pools through this allocator.
  for (const auto& h : handlers)
    if (h(nbytes)) break;
  std::lock_guard<std::mutex> lock(mu_);
  return allocate_locked(nbytes, true);
}

void* CachingAllocator::allocate_locked(size_t nbytes, bool may_throw) {
  const size_t size = round_size(nbytes);
  const bool small = size <= kSmallSize;
  if (fault_current_) {
    if (fault_seen_ >= fault_request_)
      throw_oom(nbytes, "a fault injected by fail_in_capture, as a device with no memory left would refuse it");
    ++fault_seen_;
  }
  Block* b = take_block(size, small);
  if (b == nullptr && current_pool_ != 0 && !lending_) {
    // Releasing the cache synchronizes the device, which a CUDA graph capture forbids.
    throw_oom(nbytes, "while a CUDA graph is captured into a private memory pool, which cannot release the cache");
  }
  if (b == nullptr) {
    // Over the budget or refused by the device: give back what is cached, then try once more.
    ++flushes_;
    release_cached();
    b = take_block(size, small);
    if (b == nullptr && lending_) {
      // Eager work in a lent pool that still does not fit: the pool's free segments go back too,
      // as they would without the graphs, which can then no longer replay (end_lending says so).
      release_free_segments(pools_of(current_pool_));
      lent_spoiled_ = true;
      b = take_block(size, small);
    }
    if (b == nullptr) {
      if (!may_throw) return nullptr;
      const size_t least = small ? kSmallBuffer : size;   // the smallest segment new_segment asks for
      const bool over_budget = s_.budget_bytes > 0 && s_.reserved_bytes + static_cast<int64_t>(least) > s_.budget_bytes;
      throw_oom(nbytes, over_budget ? "the request would exceed the memory budget"
                                    : "the device refused the allocation");
    }
  }
  b->allocated = true;
  b->requested = nbytes;
  if (current_pool_ != 0 && !lending_) b->captured = true;
  source_->block_live(b->ptr, nbytes, b->size, b->pool != 0);
  live_[b->ptr] = b;
  if (b->pool != 0) {
    Pools& p = pools_of(b->pool);
    p.live += static_cast<int64_t>(nbytes);
    p.peak_live = std::max(p.peak_live, p.live);
  }
  s_.allocated_bytes += static_cast<int64_t>(nbytes);
  s_.peak_allocated_bytes = std::max(s_.peak_allocated_bytes, s_.allocated_bytes);
  ++s_.num_allocs;
  return b->ptr;
}

int CachingAllocator::add_out_of_memory_handler(std::function<bool(size_t)> handler) {
  std::lock_guard<std::mutex> lock(mu_);
  const int id = next_handler_++;
  oom_handlers_.emplace_back(id, std::move(handler));
  return id;
}

void CachingAllocator::remove_out_of_memory_handler(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  std::erase_if(oom_handlers_, [&](const auto& h) { return h.first == id; });
}

void CachingAllocator::deallocate(void* ptr, size_t nbytes) {
  if (ptr == nullptr) return;
  std::lock_guard<std::mutex> lock(mu_);
  auto it = live_.find(ptr);
  MINIDL_CHECK(it != live_.end(), "caching allocator (", device_.str(), "): free of ", ptr,
               " which it did not allocate (or a double free)");
  Block* b = it->second;
  MINIDL_CHECK(b->requested == nbytes, "caching allocator (", device_.str(), "): free of ", nbytes,
               " bytes for a block allocated with ", b->requested, " bytes");
  live_.erase(it);
  // A block of a graph's pool stays counted after the capture: the graph holds it (Pools).
  bool held = false;
  if (b->pool != 0) {
    Pools& p = pools_of(b->pool);
    p.live -= static_cast<int64_t>(b->requested);
    held = p.holding;
  }
  if (!held) s_.allocated_bytes -= static_cast<int64_t>(b->requested);
  ++s_.num_frees;
  b->allocated = false;
  b->requested = 0;
  source_->block_free(b->ptr, b->size, b->pool != 0);
  release_block(b);
}

CachingStats CachingAllocator::detailed_stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  CachingStats c;
  c.base = s_;
  c.fragmentation_bytes = s_.reserved_bytes - s_.allocated_bytes;
  c.segments = segments_;
  c.raw_allocs = raw_allocs_;
  c.raw_frees = raw_frees_;
  c.cache_flushes = flushes_;
  return c;
}

void CachingAllocator::empty_cache() {
  std::lock_guard<std::mutex> lock(mu_);
  release_cached();
}

}  // namespace minidl
