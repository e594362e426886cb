// The CUDA caching allocator's logic (size classes, splitting, coalescing, budget, OOM recovery)
// driven by a host-memory fake device (fake_segment_source.h), so CI checks it without a GPU. Its
// private pools for CUDA graphs: caching_allocator_pool_test.cpp.
#include <gtest/gtest.h>

#include <atomic>
#include <random>
#include <thread>
#include <vector>

#include "core/error.h"
#include "kernels/caching_allocator.h"
#include "tests/kernels/fake_segment_source.h"

namespace minidl {
namespace {

using testing::AllocatorFixture;
using testing::MiB;

TEST(CachingAllocator, SizeClassesFollowPyTorch) {
  EXPECT_EQ(CachingAllocator::round_size(1), 512u);
  EXPECT_EQ(CachingAllocator::round_size(512), 512u);
  EXPECT_EQ(CachingAllocator::round_size(513), 1024u);
  EXPECT_EQ(CachingAllocator::segment_size(512), 2 * MiB);          // small pool
  EXPECT_EQ(CachingAllocator::segment_size(MiB), 2 * MiB);
  EXPECT_EQ(CachingAllocator::segment_size(MiB + 512), 20 * MiB);   // large, under 10 MiB
  EXPECT_EQ(CachingAllocator::segment_size(10 * MiB), 10 * MiB);    // large, rounded to 2 MiB
  EXPECT_EQ(CachingAllocator::segment_size(11 * MiB), 12 * MiB);
}

TEST(CachingAllocator, SmallRequestsShareOneSegmentAndStatsAreExact) {
  AllocatorFixture f;
  std::vector<void*> ps;
  for (int i = 0; i < 100; ++i) ps.push_back(f.alloc.allocate(1000));   // 1024-byte blocks
  CachingStats s = f.alloc.detailed_stats();
  EXPECT_EQ(s.raw_allocs, 1);
  EXPECT_EQ(s.base.reserved_bytes, static_cast<int64_t>(2 * MiB));
  EXPECT_EQ(s.base.allocated_bytes, 100000);
  EXPECT_EQ(s.fragmentation_bytes, static_cast<int64_t>(2 * MiB) - 100000);
  // Distinct, non-overlapping blocks.
  for (size_t i = 1; i < ps.size(); ++i) EXPECT_EQ(static_cast<char*>(ps[i]) - static_cast<char*>(ps[i - 1]), 1024);
  for (void* p : ps) f.alloc.deallocate(p, 1000);
  s = f.alloc.detailed_stats();
  EXPECT_EQ(s.base.allocated_bytes, 0);
  EXPECT_EQ(s.base.reserved_bytes, static_cast<int64_t>(2 * MiB));   // cached, not freed
  EXPECT_EQ(s.base.num_allocs, 100);
  EXPECT_EQ(s.base.num_frees, 100);
  EXPECT_EQ(s.base.peak_allocated_bytes, 100000);
  f.alloc.empty_cache();
  s = f.alloc.detailed_stats();
  EXPECT_EQ(s.base.reserved_bytes, 0);
  EXPECT_EQ(s.raw_frees, 1);
  EXPECT_EQ(f.dev.in_use, 0u);
  EXPECT_GE(f.dev.syncs, 1);
}

TEST(CachingAllocator, SteadyStateReusesBlocksWithoutRawAllocations) {
  AllocatorFixture f;
  const std::vector<size_t> step{3 * MiB, 700, 64 * MiB, 5000, 12 * MiB + 3, 1};
  for (int iter = 0; iter < 20; ++iter) {
    std::vector<void*> ps;
    for (size_t n : step) ps.push_back(f.alloc.allocate(n));
    for (size_t i = 0; i < ps.size(); ++i) f.alloc.deallocate(ps[ps.size() - 1 - i], step[ps.size() - 1 - i]);
    if (iter == 0) continue;
    EXPECT_EQ(f.alloc.detailed_stats().raw_allocs, f.alloc.detailed_stats().segments) << "iteration " << iter;
  }
  const CachingStats s = f.alloc.detailed_stats();
  EXPECT_LE(s.raw_allocs, 4) << "the second and later steps must be served from the cache";
  EXPECT_EQ(s.raw_frees, 0);
  EXPECT_EQ(s.base.allocated_bytes, 0);
}

TEST(CachingAllocator, SplitsAndCoalescesNeighbours) {
  AllocatorFixture f;
  // Three 2 MiB blocks from one 20 MiB large segment... (a 2 MiB request is a large one).
  void* a = f.alloc.allocate(2 * MiB);
  void* b = f.alloc.allocate(2 * MiB);
  void* c = f.alloc.allocate(2 * MiB);
  EXPECT_EQ(f.alloc.detailed_stats().raw_allocs, 1);
  EXPECT_EQ(static_cast<char*>(b) - static_cast<char*>(a), static_cast<ptrdiff_t>(2 * MiB));
  EXPECT_EQ(static_cast<char*>(c) - static_cast<char*>(b), static_cast<ptrdiff_t>(2 * MiB));
  // Free the middle, then its neighbours: the three merge back with the tail into one segment,
  // which empty_cache can then return.
  f.alloc.deallocate(b, 2 * MiB);
  f.alloc.empty_cache();
  EXPECT_EQ(f.alloc.detailed_stats().raw_frees, 0) << "a partly used segment must stay";
  void* b2 = f.alloc.allocate(2 * MiB);
  EXPECT_EQ(b2, b) << "best fit reuses the hole";
  f.alloc.deallocate(b2, 2 * MiB);
  f.alloc.deallocate(a, 2 * MiB);
  f.alloc.deallocate(c, 2 * MiB);
  void* big = f.alloc.allocate(20 * MiB);
  EXPECT_EQ(big, a) << "the coalesced segment serves a request of its full size";
  EXPECT_EQ(f.alloc.detailed_stats().raw_allocs, 1);
  f.alloc.deallocate(big, 20 * MiB);
  f.alloc.empty_cache();
  EXPECT_EQ(f.alloc.detailed_stats().base.reserved_bytes, 0);
  EXPECT_EQ(f.dev.in_use, 0u);
}

// Among free blocks of the best size, the oldest segment's serves: where the device placed the
// segments does not decide, so a GPU, the emulated device and the meta device (which place them
// differently) make the same choices from the same requests. Here each segment lies below the last.
TEST(CachingAllocator, TiesGoToTheOldestSegmentWhereverTheDevicePlacesIt) {
  AllocatorFixture f;
  f.dev.descending_arena = 64 * MiB;
  void* first = f.alloc.allocate(12 * MiB);   // a segment of its own size (12 MiB) each
  void* second = f.alloc.allocate(12 * MiB);
  ASSERT_LT(second, first);
  f.alloc.deallocate(second, 12 * MiB);
  f.alloc.deallocate(first, 12 * MiB);
  void* again = f.alloc.allocate(12 * MiB);
  EXPECT_EQ(again, first);
  void* then = f.alloc.allocate(12 * MiB);
  EXPECT_EQ(then, second);
  EXPECT_EQ(f.alloc.detailed_stats().raw_allocs, 2);
  f.alloc.deallocate(again, 12 * MiB);
  f.alloc.deallocate(then, 12 * MiB);
}

TEST(CachingAllocator, BudgetFreesTheCacheThenThrows) {
  AllocatorFixture f;
  f.alloc.set_budget(30 * MiB);
  void* a = f.alloc.allocate(4 * MiB);   // 20 MiB segment
  f.alloc.deallocate(a, 4 * MiB);
  EXPECT_EQ(f.alloc.stats().reserved_bytes, static_cast<int64_t>(20 * MiB));
  // 24 MiB does not fit the cached 20 MiB block, and 20 + 24 > 30: the cache goes, then it fits.
  void* b = f.alloc.allocate(24 * MiB);
  CachingStats s = f.alloc.detailed_stats();
  EXPECT_EQ(s.base.reserved_bytes, static_cast<int64_t>(24 * MiB));
  EXPECT_EQ(s.cache_flushes, 1);
  EXPECT_EQ(s.base.num_ooms, 0);
  try {
    f.alloc.allocate(8 * MiB);
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.requested(), 8 * MiB);
    EXPECT_EQ(e.budget(), 30 * MiB);
    EXPECT_NE(std::string(e.what()).find("budget"), std::string::npos) << e.what();
  }
  EXPECT_EQ(f.alloc.stats().num_ooms, 1);
  f.alloc.deallocate(b, 24 * MiB);
}

TEST(CachingAllocator, LargeRequestFallsBackToAnExactSegmentUnderTheBudget) {
  AllocatorFixture f;
  f.alloc.set_budget(8 * MiB);
  void* a = f.alloc.allocate(3 * MiB);   // its 20 MiB segment would break the budget
  EXPECT_EQ(f.alloc.stats().reserved_bytes, static_cast<int64_t>(3 * MiB));
  f.alloc.deallocate(a, 3 * MiB);
}

// A small request that finds no free small block needs a new 2 MiB segment: when that segment is
// what passes the budget, the error says the budget, not the device, refused it.
TEST(CachingAllocator, ASmallRequestOverTheBudgetNamesTheBudget) {
  AllocatorFixture f;
  f.alloc.set_budget(25 * MiB);
  void* a = f.alloc.allocate(22 * MiB);
  void* b = f.alloc.allocate(MiB);   // a 2 MiB segment: 24 MiB reserved
  void* c = f.alloc.allocate(MiB);   // the segment's second half
  try {
    f.alloc.allocate(512 * 1024);   // 24 MiB + 512 KiB is within the budget, but its segment is 2 MiB
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("the request would exceed the memory budget"), std::string::npos)
        << e.what();
  }
  f.alloc.deallocate(c, MiB);
  f.alloc.deallocate(b, MiB);
  f.alloc.deallocate(a, 22 * MiB);
}

TEST(CachingAllocator, DeviceRefusalFlushesTheCacheThenThrows) {
  AllocatorFixture f;
  f.dev.capacity = 40 * MiB;
  void* a = f.alloc.allocate(30 * MiB);
  f.alloc.deallocate(a, 30 * MiB);   // cached
  void* b = f.alloc.allocate(32 * MiB);   // the device refuses until the cache is released
  EXPECT_EQ(f.alloc.detailed_stats().raw_frees, 1);
  EXPECT_THROW(f.alloc.allocate(16 * MiB), OutOfMemoryError);
  EXPECT_EQ(f.alloc.stats().num_ooms, 1);
  f.alloc.deallocate(b, 32 * MiB);
}

TEST(CachingAllocator, HundredOomRecoveriesInARowLeaveNoDrift) {
  AllocatorFixture f;
  f.alloc.set_budget(64 * MiB);
  void* weights = f.alloc.allocate(10 * MiB + 100);
  const MemoryStats before = f.alloc.stats();
  for (int i = 0; i < 100; ++i) {
    std::vector<std::pair<void*, size_t>> step;
    bool oomed = false;
    try {
      for (size_t n : {8 * MiB, 3000ul, 16 * MiB, 700ul, 24 * MiB, 40 * MiB}) step.push_back({f.alloc.allocate(n), n});
    } catch (const OutOfMemoryError&) {
      oomed = true;
    }
    ASSERT_TRUE(oomed) << "iteration " << i << ": the step should not fit the budget";
    for (auto& [p, n] : step) f.alloc.deallocate(p, n);
    const MemoryStats now = f.alloc.stats();
    ASSERT_EQ(now.allocated_bytes, before.allocated_bytes) << "iteration " << i;
    ASSERT_LE(now.reserved_bytes, now.budget_bytes) << "iteration " << i;
    ASSERT_EQ(now.num_ooms, i + 1);
  }
  f.alloc.empty_cache();
  const MemoryStats after = f.alloc.stats();
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes);
  f.alloc.deallocate(weights, 10 * MiB + 100);
  f.alloc.empty_cache();
  EXPECT_EQ(f.alloc.stats().reserved_bytes, 0);
  EXPECT_EQ(f.dev.in_use, 0u);
}

TEST(CachingAllocator, RejectsUnknownPointersAndWrongSizes) {
  AllocatorFixture f;
  int x = 0;
  EXPECT_THROW(f.alloc.deallocate(&x, 4), Error);
  void* p = f.alloc.allocate(100);
  EXPECT_THROW(f.alloc.deallocate(p, 200), Error);
  f.alloc.deallocate(p, 100);
  EXPECT_THROW(f.alloc.deallocate(p, 100), Error);   // double free
}

// The data loader's threads allocate device batches while the main thread runs the step: blocks
// handed out concurrently must never overlap, and the counters must add up exactly afterwards.
// Mostly small blocks, so the threads spend their time inside the allocator and really contend.
TEST(CachingAllocator, ConcurrentAllocationsNeverOverlapAndStatsStayExact) {
  AllocatorFixture f;
  constexpr int kThreads = 4, kIters = 20000;
  std::vector<std::thread> ts;
  std::vector<int> bad(kThreads, 0);
  std::atomic<int> ready{0};
  for (int t = 0; t < kThreads; ++t) {
    ts.emplace_back([&f, &bad, &ready, t] {
      std::mt19937 rng(static_cast<unsigned>(t + 1));
      const size_t sizes[] = {100, 512, 1000, 4000, 700 * 1024, 3 * MiB};
      std::vector<std::pair<unsigned char*, size_t>> live;
      ++ready;
      while (ready.load() < kThreads) {
      }
      for (int i = 0; i < kIters; ++i) {
        if (live.size() < 8 && (live.empty() || rng() % 2 == 0)) {
          const unsigned r = rng() % 32;
          const size_t n = sizes[r < 28 ? r % 4 : 4 + r % 2];
          auto* p = static_cast<unsigned char*>(f.alloc.allocate(n));
          // Blocks start on 512-byte steps of their segment, so marking every 512th byte is
          // enough for a block handed out twice to be overwritten where its owner looks.
          for (size_t j = 0; j < n; j += 512) p[j] = static_cast<unsigned char>(t + 1);
          live.push_back({p, n});
        } else {
          const size_t k = rng() % live.size();
          auto [p, n] = live[k];
          for (size_t j = 0; j < n; j += 512) bad[t] += p[j] != t + 1;
          f.alloc.deallocate(p, n);
          live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
        }
      }
      for (auto [p, n] : live) f.alloc.deallocate(p, n);
    });
  }
  for (std::thread& th : ts) th.join();
  for (int t = 0; t < kThreads; ++t) EXPECT_EQ(bad[t], 0) << "thread " << t << " saw its block overwritten";
  const CachingStats s = f.alloc.detailed_stats();
  EXPECT_EQ(s.base.allocated_bytes, 0);
  EXPECT_EQ(s.base.num_allocs, s.base.num_frees);
  EXPECT_GT(s.base.num_allocs, kThreads * kIters / 4);
  f.alloc.empty_cache();
  EXPECT_EQ(f.alloc.stats().reserved_bytes, 0) << "every segment coalesced back and was returned";
  EXPECT_EQ(f.dev.in_use, 0u);
}

TEST(CachingAllocator, PeakStatsReset) {
  AllocatorFixture f;
  void* p = f.alloc.allocate(5 * MiB);
  f.alloc.deallocate(p, 5 * MiB);
  EXPECT_EQ(f.alloc.stats().peak_allocated_bytes, static_cast<int64_t>(5 * MiB));
  f.alloc.reset_peak_stats();
  EXPECT_EQ(f.alloc.stats().peak_allocated_bytes, 0);
  EXPECT_EQ(f.alloc.stats().peak_reserved_bytes, static_cast<int64_t>(20 * MiB));
}

}  // namespace
}  // namespace minidl
