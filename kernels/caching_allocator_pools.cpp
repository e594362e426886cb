// The caching allocator's private pools (see caching_allocator.h, "Private pools"): a CUDA graph's
// capture into a pool of its own (or one it shares), the eager room it adopts and gives back, the
// lending of a live pool to eager work between replays, the fault injected into a capture for the
// tests, and the pool's release, which hands segments still holding tensors to the eager pools.
// The rest of the allocator is caching_allocator.cpp.
#include <algorithm>
#include <vector>

#include "core/error.h"
#include "kernels/caching_allocator.h"

namespace minidl {

int CachingAllocator::begin_private_pool(int share) {
  std::lock_guard<std::mutex> lock(mu_);
  MINIDL_CHECK(current_pool_ == 0, "caching allocator (", device_.str(), "): private pool ", current_pool_,
               " is still current; end_private_pool first (one CUDA graph capture at a time)");
  if (fault_skip_ >= 0 && fault_skip_-- == 0) {
    fault_current_ = true;
    fault_seen_ = 0;
  }
  // No memory can be released while the stream captures, so the eager cache goes back to the
  // device now (as torch.cuda.graph empties the cache before its capture): the pool can then grow
  // into what the eager steps held, instead of beside it.
  release_cached();
  if (share == 0) {
    current_pool_ = next_pool_++;
    pools_of(current_pool_).users = 1;
    adopt_eager_free_blocks(current_pool_);
    return current_pool_;
  }
  ++reopen(share, "share").users;
  adopt_eager_free_blocks(share);
  return share;
}

CachingAllocator::Pools& CachingAllocator::reopen(int id, const char* to) {
  auto it = pools_.find(id);
  MINIDL_CHECK(id > 0 && it != pools_.end(), "caching allocator (", device_.str(), "): no private pool ", id, " to ",
               to, " (its graphs were released, or it belongs to another device's allocator)");
  Pools& p = it->second;
  // Its blocks count as they come again: the end of the capture or lending holds the larger peak.
  if (p.holding) s_.allocated_bytes -= p.peak_live - p.live;
  p.holding = false;
  current_pool_ = id;
  return p;
}

void CachingAllocator::adopt_eager_free_blocks(int id) {
  // What release_cached left free lies in segments that also hold live tensors (the weights, the
  // optimizer's state, the batch): the capture may use it too, or a capture could only grow beside
  // those segments, and the answer would depend on where the live tensors happened to fall. What
  // the capture hands out belongs to the pool until it is released (release_private_pool gives it
  // back); the rest goes back when the capture ends (return_unused_adopted).
  // Large blocks only: the small ones stay for the eager work between replays (labels, the host's
  // reads), which could otherwise find no room left beside a pool grown to the budget.
  Pools& eager = pools_of(0);
  Pools& p = pools_of(id);
  for (auto it = eager.large.begin(); it != eager.large.end();) {
    Block* b = *it;
    if (b->expandable) {   // the expandable range's pages stay the eager pools' (unmap_free_pages)
      ++it;
      continue;
    }
    it = eager.large.erase(it);
    b->pool = id;
    b->adopted = true;
    b->captured = false;
    eager.reserved -= b->size;
    p.reserved += b->size;
    p.large.insert(b);
  }
}

void CachingAllocator::end_private_pool() {
  std::lock_guard<std::mutex> lock(mu_);
  if (current_pool_ != 0) {
    // The graph now holds its capture's peak: what is no longer live stays counted as allocated.
    Pools& p = pools_of(current_pool_);
    s_.allocated_bytes += p.peak_live - p.live;
    s_.peak_allocated_bytes = std::max(s_.peak_allocated_bytes, s_.allocated_bytes);
    p.holding = true;
    return_unused_adopted(p);
  }
  current_pool_ = 0;
  fault_current_ = false;
}

void CachingAllocator::return_unused_adopted(Pools& p) {
  // Adopted room the capture never handed out is no replay's: the eager work between replays
  // (the loader's next batch, the host's reads) has it back.
  std::vector<Block*> unused;
  for (Pool* pool : {&p.small, &p.large})
    for (Block* b : *pool)
      if (b->adopted && !b->captured) unused.push_back(b);
  for (Block* b : unused) {
    (b->small ? p.small : p.large).erase(b);
    p.reserved -= b->size;
    pools_of(0).reserved += b->size;
    to_eager(b);
  }
}

void CachingAllocator::to_eager(Block* b) {
  b->pool = 0;
  b->adopted = b->captured = false;
  release_block(b);
}

void CachingAllocator::begin_lending(int id, bool resume) {
  std::lock_guard<std::mutex> lock(mu_);
  MINIDL_CHECK(current_pool_ == 0, "caching allocator (", device_.str(), "): private pool ", current_pool_,
               " is current; end its capture or lending before lending pool ", id);
  const Pools& p = reopen(id, "lend");   // as a capture that shares the pool
  lending_ = true;
  if (!resume) {
    lent_spoiled_ = false;
    lent_live_ = p.live;
  }
}

bool CachingAllocator::end_lending() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!lending_) return true;
  Pools& p = pools_of(current_pool_);
  const bool all_free = p.live == lent_live_ && !lent_spoiled_;
  s_.allocated_bytes += p.peak_live - p.live;
  s_.peak_allocated_bytes = std::max(s_.peak_allocated_bytes, s_.allocated_bytes);
  p.holding = true;
  current_pool_ = 0;
  lending_ = false;
  return all_free;
}

void CachingAllocator::fail_in_capture(int captures_before, int64_t request) {
  MINIDL_CHECK(captures_before >= 0 && request >= 0, "caching allocator (", device_.str(), "): fail_in_capture(",
               captures_before, ", ", request, ") needs counts >= 0");
  std::lock_guard<std::mutex> lock(mu_);
  fault_skip_ = captures_before;
  fault_current_ = false;
  fault_seen_ = 0;
  fault_request_ = request;
}

bool CachingAllocator::capture_fault_armed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fault_skip_ >= 0 || fault_current_;
}

int64_t CachingAllocator::capture_fault_requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return fault_seen_;
}

int CachingAllocator::current_pool() const {
  std::lock_guard<std::mutex> lock(mu_);
  return current_pool_;
}

size_t CachingAllocator::pool_reserved_bytes(int id) const {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pools_.find(id);
  return it == pools_.end() ? 0 : it->second.reserved;
}

void CachingAllocator::release_private_pool(int id) {
  std::lock_guard<std::mutex> lock(mu_);
  auto it = pools_.find(id);
  if (id == 0 || it == pools_.end()) return;
  if (current_pool_ == id) {
    current_pool_ = 0;
    lending_ = false;
  }
  if (--it->second.users > 0) return;   // another graph still replays on the pool's blocks
  // What the graph held beyond its live blocks is free again; the live ones stay counted.
  if (it->second.holding) s_.allocated_bytes -= it->second.peak_live - it->second.live;
  Pools& eager = pools_of(0);
  // Live blocks (tensors made during the capture that are still held) belong to the eager pools
  // from now on, and so do their segments.
  for (auto& [ptr, b] : live_) {
    if (b->pool == id) {
      b->pool = 0;
      b->adopted = b->captured = false;
    }
  }
  bool synced = false;
  eager.reserved += it->second.reserved;   // what stays of its segments is the eager pools' now
  for (Pool* pool : {&it->second.small, &it->second.large}) {
    const std::vector<Block*> blocks(pool->begin(), pool->end());   // release_block may merge them
    pool->clear();
    for (Block* b : blocks) {
      if (b->prev == nullptr && b->next == nullptr) {   // a whole free segment: back to the device
        free_segment(b, eager, synced);   // a replay may still be running on it
      } else {   // beside live blocks, or eager room it adopted: merged with free eager neighbours
        to_eager(b);
      }
    }
  }
  pools_.erase(it);
}

}  // namespace minidl
