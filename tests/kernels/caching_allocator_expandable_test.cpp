// The caching allocator's expandable segments (kernels/caching_allocator.h) on the host fake
// device, whose pages are host memory made accessible and inaccessible again (fake_segment_source.h):
// memory freed between live blocks goes back to the device, which fixed segments cannot do, the
// books stay exact through OOMs and random use, and CUDA graphs' private pools keep fixed segments.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "core/error.h"
#include "kernels/caching_allocator.h"
#include "tests/kernels/fake_segment_source.h"

namespace minidl {
namespace {

using testing::AllocatorFixture;
using testing::FakeDevice;
using testing::FakeSource;
using testing::MiB;

// Four 5 MiB blocks, the second freed: a hole between live blocks. A 12 MiB request under a 30 MiB
// budget then needs the hole's memory back.
struct HoleThenLarger {
  std::vector<void*> live;
  void* large = nullptr;
  explicit HoleThenLarger(CachingAllocator& a) {
    for (int i = 0; i < 4; ++i) live.push_back(a.allocate(5 * MiB));
    a.deallocate(live[1], 5 * MiB);
    live.erase(live.begin() + 1);
    large = a.allocate(12 * MiB);
  }
};

TEST(CachingAllocatorExpandable, MemoryFreedBetweenLiveBlocksGoesBackToTheDevice) {
  {
    AllocatorFixture fixed;
    fixed.alloc.set_budget(30 * MiB);
    // One 20 MiB segment holds the four blocks; the hole stays in it, and 20 + 12 > 30. The error
    // names the hole and the mode that returns it.
    try {
      HoleThenLarger h(fixed.alloc);
      ADD_FAILURE() << "no OOM";
    } catch (const OutOfMemoryError& e) {
      EXPECT_NE(std::string(e.what()).find("5.0 MiB of the reserved memory holds no tensor"), std::string::npos)
          << e.what();
      EXPECT_NE(std::string(e.what()).find("--expandable-segments"), std::string::npos) << e.what();
    }
  }
  AllocatorFixture f;
  ASSERT_TRUE(f.alloc.set_expandable_segments(true));
  f.alloc.set_budget(30 * MiB);
  const HoleThenLarger h(f.alloc);
  const CachingStats s = f.alloc.detailed_stats();
  EXPECT_EQ(s.base.allocated_bytes, static_cast<int64_t>(27 * MiB));
  // Each 5 MiB block took 3 pages (6 MiB: its slack is under the 1 MiB split threshold); the hole's
  // 3 pages were unmapped before the 12 MiB block's 6 were mapped.
  EXPECT_EQ(s.base.reserved_bytes, static_cast<int64_t>(30 * MiB));
  EXPECT_EQ(s.base.peak_reserved_bytes, static_cast<int64_t>(30 * MiB)) << "never over the budget";
  EXPECT_EQ(s.raw_allocs, 18) << "pages mapped: 4 x 3, then 6";
  EXPECT_EQ(s.raw_frees, 3);
  EXPECT_EQ(s.cache_flushes, 1);
  EXPECT_EQ(s.segments, 1);
  EXPECT_EQ(f.dev.segments.size(), 0u) << "no fixed segment";
  EXPECT_EQ(f.dev.in_use, 30 * MiB);
  // Every live block is usable memory (a block behind an unmapped page would fault).
  for (void* p : h.live) std::memset(p, 1, 5 * MiB);
  std::memset(h.large, 2, 12 * MiB);
  for (void* p : h.live) f.alloc.deallocate(p, 5 * MiB);
  f.alloc.deallocate(h.large, 12 * MiB);
  EXPECT_EQ(f.alloc.detailed_stats().base.reserved_bytes, static_cast<int64_t>(30 * MiB)) << "cached";
  f.alloc.empty_cache();
  EXPECT_EQ(f.alloc.detailed_stats().base.reserved_bytes, 0);
  EXPECT_EQ(f.dev.in_use, 0u);
  EXPECT_TRUE(f.dev.pages.empty());
  EXPECT_EQ(f.dev.ranges.size(), 1u) << "the address range stays reserved while the allocator lives";
}

TEST(CachingAllocatorExpandable, AFreeLastBlockGrowsAndUnmappedPagesAreMappedAgain) {
  AllocatorFixture f;
  ASSERT_TRUE(f.alloc.set_expandable_segments(true));
  void* a = f.alloc.allocate(4 * MiB);
  void* b = f.alloc.allocate(3 * MiB);   // 4 MiB: 1 MiB of slack is not split off
  f.alloc.deallocate(b, 3 * MiB);
  // The free last block (4 MiB) grows by 6 MiB for a 10 MiB request, in place.
  void* c = f.alloc.allocate(10 * MiB);
  EXPECT_EQ(c, b);
  EXPECT_EQ(f.alloc.detailed_stats().base.reserved_bytes, static_cast<int64_t>(14 * MiB));
  std::memset(c, 3, 10 * MiB);
  f.alloc.deallocate(c, 10 * MiB);
  f.alloc.empty_cache();   // c's pages go, a's stay
  EXPECT_EQ(f.alloc.detailed_stats().base.reserved_bytes, static_cast<int64_t>(4 * MiB));
  void* d = f.alloc.allocate(6 * MiB);   // best fit: c's old place, mapped again
  EXPECT_EQ(d, b);
  std::memset(d, 4, 6 * MiB);
  EXPECT_EQ(f.alloc.detailed_stats().base.reserved_bytes, static_cast<int64_t>(10 * MiB));
  f.alloc.deallocate(d, 6 * MiB);
  f.alloc.deallocate(a, 4 * MiB);
}

// A device that refuses a page: the cache is released and the request tried again; when it still
// does not fit, the OOM leaves the books as they were.
TEST(CachingAllocatorExpandable, ADeviceThatRefusesAPageIsAnOomThatLeavesTheBooksAlone) {
  AllocatorFixture f;
  f.dev.capacity = 20 * MiB;
  ASSERT_TRUE(f.alloc.set_expandable_segments(true));
  void* a = f.alloc.allocate(8 * MiB);
  void* b = f.alloc.allocate(8 * MiB);
  f.alloc.deallocate(a, 8 * MiB);
  const CachingStats before = f.alloc.detailed_stats();
  try {
    f.alloc.allocate(14 * MiB);   // 8 live + 14 > 20, even with a's pages back
    ADD_FAILURE() << "no OOM";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("the device refused the allocation"), std::string::npos) << e.what();
  }
  const CachingStats after = f.alloc.detailed_stats();
  EXPECT_EQ(after.base.allocated_bytes, before.base.allocated_bytes);
  EXPECT_EQ(after.base.reserved_bytes, static_cast<int64_t>(f.dev.in_use)) << "reserved is what the device holds";
  void* c = f.alloc.allocate(12 * MiB);   // 8 + 12 = 20 fits once a's pages are back
  std::memset(c, 5, 12 * MiB);
  std::memset(b, 6, 8 * MiB);
  EXPECT_EQ(f.dev.in_use, 20 * MiB);
  f.alloc.deallocate(b, 8 * MiB);
  f.alloc.deallocate(c, 12 * MiB);
}

// Random use under a budget: live blocks never overlap and stay writable, reserved is exactly the
// pages the device holds (plus the small pool's fixed segments), never over the budget, and
// allocated is the sum of the live requests.
TEST(CachingAllocatorExpandable, RandomUseKeepsExactBooksUnderABudget) {
  FakeDevice dev;
  auto alloc = std::make_unique<CachingAllocator>(std::make_unique<FakeSource>(&dev), Device::cuda(0));
  ASSERT_TRUE(alloc->set_expandable_segments(true));
  alloc->set_budget(96 * MiB);
  std::mt19937 rng(7);
  std::vector<std::pair<char*, size_t>> live;
  int64_t allocated = 0;
  int ooms = 0;
  for (int step = 0; step < 3000; ++step) {
    if (!live.empty() && (rng() % 2 == 0 || live.size() > 40)) {
      const size_t i = rng() % live.size();
      alloc->deallocate(live[i].first, live[i].second);
      allocated -= static_cast<int64_t>(live[i].second);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(i));
    } else {
      const size_t n = rng() % 4 == 0 ? 1 + rng() % 200000 : 1 + rng() % (24 * MiB);
      try {
        char* p = static_cast<char*>(alloc->allocate(n));
        p[0] = 1;
        p[n - 1] = 1;
        for (const auto& [q, m] : live) ASSERT_TRUE(p + n <= q || q + m <= p) << "overlapping blocks at step " << step;
        live.emplace_back(p, n);
        allocated += static_cast<int64_t>(n);
      } catch (const OutOfMemoryError&) {
        ++ooms;
      }
    }
    const CachingStats s = alloc->detailed_stats();
    ASSERT_EQ(s.base.allocated_bytes, allocated) << "step " << step;
    ASSERT_EQ(s.base.reserved_bytes, static_cast<int64_t>(dev.in_use)) << "step " << step;
    ASSERT_LE(s.base.reserved_bytes, static_cast<int64_t>(96 * MiB)) << "step " << step;
  }
  EXPECT_GT(ooms, 0) << "the budget was never reached: the test does not test the OOM path";
  for (const auto& [p, n] : live) alloc->deallocate(p, n);
  alloc->empty_cache();
  EXPECT_EQ(dev.in_use, 0u);
  alloc.reset();
  EXPECT_TRUE(dev.ranges.empty()) << "the range is released with the allocator";
}

TEST(CachingAllocatorExpandable, GraphsPrivatePoolsKeepFixedSegments) {
  AllocatorFixture f;
  ASSERT_TRUE(f.alloc.set_expandable_segments(true));
  void* eager = f.alloc.allocate(12 * MiB);
  const int pool = f.alloc.begin_private_pool();
  void* captured = f.alloc.allocate(12 * MiB);
  f.alloc.end_private_pool();
  EXPECT_EQ(f.dev.segments.size(), 1u) << "the capture's block is in a fixed segment of its pool";
  EXPECT_EQ(f.dev.pages.size(), 6u) << "the eager block's pages alone";
  EXPECT_EQ(f.alloc.pool_reserved_bytes(pool), 12 * MiB);
  f.alloc.deallocate(captured, 12 * MiB);
  f.alloc.release_private_pool(pool);
  f.alloc.deallocate(eager, 12 * MiB);
  f.alloc.empty_cache();
  EXPECT_EQ(f.dev.in_use, 0u);
}

// The mode is chosen before the first tensor: a change with a live block is refused (it would stay
// where the other mode put it), one without starts the allocator afresh.
TEST(CachingAllocatorExpandable, TheModeChangesOnlyOnAnAllocatorThatHoldsNoTensor) {
  FakeDevice none;
  none.page = 0;
  CachingAllocator a(std::make_unique<FakeSource>(&none), Device::cuda(0));
  EXPECT_FALSE(a.set_expandable_segments(true)) << "a source without pages";
  EXPECT_TRUE(a.set_expandable_segments(false));
  AllocatorFixture f;
  ASSERT_TRUE(f.alloc.set_expandable_segments(true));
  void* x = f.alloc.allocate(12 * MiB);
  void* small = f.alloc.allocate(1000);
  try {
    f.alloc.set_expandable_segments(false);
    ADD_FAILURE() << "switched with live blocks";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("choose the mode before its first tensor"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(f.alloc.set_expandable_segments(true)) << "the same mode again is no change";
  f.alloc.deallocate(x, 12 * MiB);
  f.alloc.deallocate(small, 1000);
  ASSERT_TRUE(f.alloc.set_expandable_segments(false));
  EXPECT_EQ(f.alloc.detailed_stats().base.reserved_bytes, 0) << "the cache released";
  EXPECT_TRUE(f.dev.ranges.empty()) << "the address range released";
  EXPECT_EQ(f.alloc.detailed_stats().segments, 0);
  void* y = f.alloc.allocate(12 * MiB);   // a fixed segment now
  EXPECT_EQ(f.dev.segments.size(), 1u);
  EXPECT_TRUE(f.dev.pages.empty());
  f.alloc.deallocate(y, 12 * MiB);
}

}  // namespace
}  // namespace minidl
