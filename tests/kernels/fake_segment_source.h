// The host-memory fake device behind the caching allocator's tests (caching_allocator_test.cpp,
// caching_allocator_pool_test.cpp): it records every raw allocation and can refuse like a full
// device, so CI checks the allocator's logic without a GPU. Its expandable segments are host
// address space reserved with mmap, pages made accessible (mapped) and inaccessible again with
// mprotect, so a block used behind an unmapped page faults.
#pragma once
#include <gtest/gtest.h>
#include <sys/mman.h>

#include <cstdlib>
#include <map>
#include <memory>
#include <set>

#include "kernels/caching_allocator.h"

namespace minidl::testing {

struct FakeDevice {
  size_t capacity = 0;   // 0: unlimited
  size_t in_use = 0;
  int syncs = 0;
  std::map<void*, size_t> segments;
  size_t page = size_t{2} << 20;   // 0: no expandable segments
  std::map<void*, size_t> ranges;  // reserved address ranges
  std::set<void*> pages;           // mapped pages
  // Each new segment below every one before it (from the top of one arena of this many bytes, never
  // reused), as a device may place them; 0: wherever malloc puts them.
  size_t descending_arena = 0;
};

class FakeSource final : public SegmentSource {
 public:
  explicit FakeSource(FakeDevice* d) : d_(d) {}
  void* raw_alloc(size_t bytes) override {
    if (d_->capacity > 0 && d_->in_use + bytes > d_->capacity) return nullptr;
    void* p = d_->descending_arena > 0 ? below_the_last(bytes) : std::malloc(bytes);
    d_->segments[p] = bytes;
    d_->in_use += bytes;
    return p;
  }
  void raw_free(void* p, size_t bytes) override {
    auto it = d_->segments.find(p);
    ASSERT_NE(it, d_->segments.end()) << "raw_free of a pointer the fake never gave out";
    ASSERT_EQ(it->second, bytes) << "raw_free with the wrong size";
    d_->in_use -= bytes;
    d_->segments.erase(it);
    if (d_->descending_arena == 0) std::free(p);
  }
  void synchronize() override { ++d_->syncs; }
  size_t page_size() const override { return d_->page; }
  AddressRange reserve_address() override {
    const size_t bytes = d_->capacity > 0 ? kExpandableRange * d_->capacity : size_t{1} << 32;
    // One page more, for a base on a page boundary, as a GPU's reservation has.
    void* m = mmap(nullptr, bytes + d_->page, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
    if (m == MAP_FAILED) return {};
    void* p = reinterpret_cast<void*>((reinterpret_cast<uintptr_t>(m) + d_->page - 1) / d_->page * d_->page);
    d_->ranges[p] = bytes;
    mmaps_[p] = m;
    return {p, bytes};
  }
  void release_address(AddressRange r) override {
    ASSERT_EQ(d_->ranges.count(r.base), 1u) << "release_address of a range the fake never reserved";
    for (void* q : d_->pages)
      ASSERT_FALSE(q >= r.base && q < static_cast<char*>(r.base) + r.bytes) << "a page still mapped";
    d_->ranges.erase(r.base);
    munmap(mmaps_[r.base], r.bytes + d_->page);
    mmaps_.erase(r.base);
  }
  bool map_page(void* p) override {
    EXPECT_EQ(reinterpret_cast<uintptr_t>(p) % d_->page, 0u) << "a page not on a page boundary";
    EXPECT_EQ(d_->pages.count(p), 0u) << "a page mapped twice";
    if (d_->capacity > 0 && d_->in_use + d_->page > d_->capacity) return false;
    mprotect(p, d_->page, PROT_READ | PROT_WRITE);
    d_->pages.insert(p);
    d_->in_use += d_->page;
    return true;
  }
  void unmap_page(void* p) override {
    ASSERT_EQ(d_->pages.erase(p), 1u) << "unmap_page of a page not mapped";
    madvise(p, d_->page, MADV_DONTNEED);
    mprotect(p, d_->page, PROT_NONE);
    d_->in_use -= d_->page;
  }

 private:
  void* below_the_last(size_t bytes) {
    if (arena_ == nullptr) {
      arena_.reset(static_cast<char*>(std::malloc(d_->descending_arena)));
      top_ = d_->descending_arena;
    }
    EXPECT_LE(bytes, top_) << "the fake's descending arena is used up";
    top_ -= bytes;
    return arena_.get() + top_;
  }

  FakeDevice* d_;
  std::map<void*, void*> mmaps_;   // range base -> what mmap returned
  struct Free {
    void operator()(char* p) const { std::free(p); }
  };
  std::unique_ptr<char, Free> arena_;   // descending_arena's
  size_t top_ = 0;
};

struct AllocatorFixture {
  FakeDevice dev;
  CachingAllocator alloc{std::make_unique<FakeSource>(&dev), Device::cuda(0)};
};

constexpr size_t MiB = size_t{1} << 20;

}  // namespace minidl::testing
