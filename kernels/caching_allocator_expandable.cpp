// The caching allocator's expandable segment (see caching_allocator.h, "Expandable segments"): one
// address range reserved from the segment source, laid out as blocks like any segment, with the
// source's pages mapped behind the blocks handed out and unmapped from free ones when the cache is
// released; and the shape-only device's address ranges with pages (AddressRangeSource), so a dry
// run on meta:cuda keeps the same books. The rest of the allocator is caching_allocator.cpp.
#include <algorithm>

#include "core/error.h"
#include "kernels/caching_allocator.h"

namespace minidl {

SegmentSource::AddressRange AddressRangeSource::reserve_address() {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t page = page_size();
  AddressRange r;
  r.bytes = capacity_ > 0 ? (kExpandableRange * capacity_ + page - 1) / page * page : size_t{1} << 40;
  next_ = (next_ + page - 1) / page * page;
  r.base = reinterpret_cast<void*>(next_);
  next_ += r.bytes;
  return r;
}

bool AddressRangeSource::map_page(void* /*p*/) {
  std::lock_guard<std::mutex> lock(mu_);
  if (capacity_ > 0 && held_ + page_size() > capacity_) return false;
  held_ += page_size();
  return true;
}

void AddressRangeSource::unmap_page(void* /*p*/) {
  std::lock_guard<std::mutex> lock(mu_);
  held_ -= page_size();
}

bool CachingAllocator::set_expandable_segments(bool on) {
  std::lock_guard<std::mutex> lock(mu_);
  if (on && source_->page_size() == 0) return false;
  if (on == expandable_on_) return true;
  // Blocks already handed out would stay where the other mode put them, and with them the layout
  // that decides what fits later: a dry run and a device switched at different points would no
  // longer agree. So the mode changes only on an allocator that holds no tensor, and starts afresh.
  MINIDL_CHECK(live_.empty(), "expandable segments: ", device_.str(), " already holds ", live_.size(),
               " blocks (", format_bytes(static_cast<size_t>(s_.allocated_bytes)), "); choose the mode before its "
               "first tensor (minidl's programs apply --expandable-segments to a whole process)");
  release_cached();
  release_expandable_range();
  expandable_on_ = on;
  return true;
}

bool CachingAllocator::expandable_segments() const {
  std::lock_guard<std::mutex> lock(mu_);
  return expandable_on_;
}

CachingAllocator::Block* CachingAllocator::grow_expandable(size_t size) {
  if (ex_.range.base == nullptr) {
    ex_.page = source_->page_size();
    if (ex_.page == 0) return nullptr;
    ex_.range = source_->reserve_address();
    if (ex_.range.base == nullptr) return nullptr;
    ++segments_;
  }
  Block* tail = ex_.first;
  while (tail != nullptr && tail->next != nullptr) tail = tail->next;
  // A free last block is smaller than `size` (find_free found none as large): it grows by the rest.
  const bool extend = tail != nullptr && !tail->allocated;
  const size_t grow = (size - (extend ? tail->size : 0) + ex_.page - 1) / ex_.page * ex_.page;
  if (ex_.end + grow > ex_.range.bytes) return nullptr;
  Block* b = tail;
  if (extend) {
    pools_of(0).large.erase(tail);
    tail->size += grow;
  } else {
    b = new Block;
    b->ptr = static_cast<char*>(ex_.range.base) + ex_.end;
    b->size = grow;
    b->expandable = true;
    b->prev = tail;
    (tail != nullptr ? tail->next : ex_.first) = b;
  }
  ex_.end += grow;
  ex_.mapped.resize(ex_.end / ex_.page, false);
  return b;
}

bool CachingAllocator::map_pages(const char* p, size_t n) {
  const char* base = static_cast<const char*>(ex_.range.base);
  const size_t first = static_cast<size_t>(p - base) / ex_.page;
  const size_t last = (static_cast<size_t>(p - base) + n + ex_.page - 1) / ex_.page;
  size_t missing = 0;
  for (size_t i = first; i < last; ++i) missing += ex_.mapped[i] ? 0 : 1;
  const auto adds = static_cast<int64_t>(missing * ex_.page);
  if (s_.budget_bytes > 0 && s_.reserved_bytes + adds > s_.budget_bytes) return false;
  for (size_t i = first; i < last; ++i) {
    if (ex_.mapped[i]) continue;
    if (!source_->map_page(static_cast<char*>(ex_.range.base) + i * ex_.page)) return false;
    ex_.mapped[i] = true;
    ++raw_allocs_;
    s_.reserved_bytes += static_cast<int64_t>(ex_.page);
    s_.peak_reserved_bytes = std::max(s_.peak_reserved_bytes, s_.reserved_bytes);
    pools_of(0).reserved += ex_.page;
  }
  return true;
}

void CachingAllocator::unmap_free_pages() {
  bool synced = false;
  const char* base = static_cast<const char*>(ex_.range.base);
  for (Block* b = ex_.first; b != nullptr; b = b->next) {
    if (b->allocated) continue;
    // The pages wholly inside the free block: one it shares with a neighbour holds that one's bytes.
    const size_t first = (static_cast<size_t>(b->ptr - base) + ex_.page - 1) / ex_.page;
    const size_t last = (static_cast<size_t>(b->ptr - base) + b->size) / ex_.page;
    for (size_t i = first; i < last; ++i) {
      if (!ex_.mapped[i]) continue;
      if (!synced) {
        source_->synchronize();   // the device must be done with the pages
        synced = true;
      }
      source_->unmap_page(static_cast<char*>(ex_.range.base) + i * ex_.page);
      ex_.mapped[i] = false;
      ++raw_frees_;
      s_.reserved_bytes -= static_cast<int64_t>(ex_.page);
      pools_of(0).reserved -= ex_.page;
    }
  }
}

void CachingAllocator::release_expandable_range() {
  // With no live block the segment is one free block (freed blocks merge), its pages unmapped by
  // release_cached; otherwise it stays.
  Block* f = ex_.first;
  if (f == nullptr || f->next != nullptr || f->allocated) return;
  pools_of(0).large.erase(f);
  delete f;
  source_->release_address(ex_.range);
  --segments_;
  ex_ = Expandable{};
}

}  // namespace minidl
