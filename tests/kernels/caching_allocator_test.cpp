// The CUDA caching allocator's logic (size classes, splitting, coalescing, budget, OOM recovery)
// driven by a host-memory fake device, so CI checks it without a GPU. The fake records every raw
// allocation and can refuse like a full device.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <map>
#include <random>
#include <thread>
#include <vector>

#include "core/error.h"
#include "kernels/caching_allocator.h"

namespace minidl {
namespace {

struct FakeDevice {
  size_t capacity = 0;   // 0: unlimited
  size_t in_use = 0;
  int syncs = 0;
  std::map<void*, size_t> segments;
};

class FakeSource final : public SegmentSource {
 public:
  explicit FakeSource(FakeDevice* d) : d_(d) {}
  void* raw_alloc(size_t bytes) override {
    if (d_->capacity > 0 && d_->in_use + bytes > d_->capacity) return nullptr;
    void* p = std::malloc(bytes);
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
    std::free(p);
  }
  void synchronize() override { ++d_->syncs; }

 private:
  FakeDevice* d_;
};

struct Fixture {
  FakeDevice dev;
  CachingAllocator alloc{std::make_unique<FakeSource>(&dev), Device::cuda(0)};
};

constexpr size_t MiB = size_t{1} << 20;

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
  Fixture f;
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
  Fixture f;
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
  Fixture f;
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

TEST(CachingAllocator, BudgetFreesTheCacheThenThrows) {
  Fixture f;
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
  Fixture f;
  f.alloc.set_budget(8 * MiB);
  void* a = f.alloc.allocate(3 * MiB);   // its 20 MiB segment would break the budget
  EXPECT_EQ(f.alloc.stats().reserved_bytes, static_cast<int64_t>(3 * MiB));
  f.alloc.deallocate(a, 3 * MiB);
}

TEST(CachingAllocator, DeviceRefusalFlushesTheCacheThenThrows) {
  Fixture f;
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
  Fixture f;
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
  Fixture f;
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
  Fixture f;
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
  Fixture f;
  void* p = f.alloc.allocate(5 * MiB);
  f.alloc.deallocate(p, 5 * MiB);
  EXPECT_EQ(f.alloc.stats().peak_allocated_bytes, static_cast<int64_t>(5 * MiB));
  f.alloc.reset_peak_stats();
  EXPECT_EQ(f.alloc.stats().peak_allocated_bytes, 0);
  EXPECT_EQ(f.alloc.stats().peak_reserved_bytes, static_cast<int64_t>(20 * MiB));
}

// ---- private pools (CUDA graphs) ----

bool inside(const FakeDevice& d, const void* p, const std::vector<void*>& segments) {
  for (void* seg : segments) {
    const auto* b = static_cast<const char*>(seg);
    if (p >= seg && static_cast<const char*>(p) < b + d.segments.at(seg)) return true;
  }
  return false;
}

std::vector<void*> new_segments(const FakeDevice& d, const std::map<void*, size_t>& before) {
  std::vector<void*> v;
  for (const auto& [p, n] : d.segments)
    if (before.count(p) == 0) v.push_back(p);
  return v;
}

TEST(CachingAllocatorPrivatePool, EagerAllocationsNeverReuseTheCapturedBlocks) {
  Fixture f;
  void* eager = f.alloc.allocate(1000);   // an eager small segment with room to spare
  const auto before = f.dev.segments;
  const int pool = f.alloc.begin_private_pool();
  EXPECT_GT(pool, 0);
  EXPECT_EQ(f.alloc.current_pool(), pool);
  void* a = f.alloc.allocate(1000);       // a new segment, although the eager one has room
  void* big = f.alloc.allocate(3 * MiB);
  f.alloc.deallocate(a, 1000);            // freed during the capture: reused within it
  void* b = f.alloc.allocate(1000);
  EXPECT_EQ(b, a);
  f.alloc.end_private_pool();
  EXPECT_EQ(f.alloc.current_pool(), 0);
  const std::vector<void*> pool_segments = new_segments(f.dev, before);
  ASSERT_EQ(pool_segments.size(), 2u);   // one small, one large
  EXPECT_TRUE(inside(f.dev, a, pool_segments));
  EXPECT_FALSE(inside(f.dev, eager, pool_segments));
  EXPECT_EQ(f.alloc.pool_reserved_bytes(pool), 22 * MiB);
  // The graph's temporaries, freed after the capture, stay the pool's: eager requests of every
  // size go elsewhere.
  f.alloc.deallocate(b, 1000);
  f.alloc.deallocate(big, 3 * MiB);
  std::vector<std::pair<void*, size_t>> later;
  for (size_t n : {size_t{1000}, size_t{512}, 3 * MiB, 2 * MiB}) later.emplace_back(f.alloc.allocate(n), n);
  for (const auto& [p, n] : later) EXPECT_FALSE(inside(f.dev, p, pool_segments)) << n;
  // Statistics stay exact: reserved counts the pool's segments too, and allocated what the graph
  // holds (its capture's peak, 1000 + 3 MiB, though b and big were freed) beside the eager blocks.
  const CachingStats s = f.alloc.detailed_stats();
  EXPECT_EQ(s.base.allocated_bytes,
            static_cast<int64_t>(1000 + (1000 + 3 * MiB) + (1000 + 512 + 3 * MiB + 2 * MiB)));
  EXPECT_EQ(static_cast<size_t>(s.base.reserved_bytes), f.dev.in_use);
  // empty_cache leaves a live pool's segments alone (a replay still writes there).
  for (const auto& [p, n] : later) f.alloc.deallocate(p, n);
  f.alloc.empty_cache();
  EXPECT_EQ(f.alloc.pool_reserved_bytes(pool), 22 * MiB);
  for (void* seg : pool_segments) EXPECT_EQ(f.dev.segments.count(seg), 1u);
  f.alloc.deallocate(eager, 1000);
}

// A graph holds what its capture used: allocated counts the capture's peak of the pool's live
// blocks from the end of the capture until the release, whatever the captured tensors do meanwhile
// (a replay writes every block again), and the release leaves the blocks still alive counted.
TEST(CachingAllocatorPrivatePool, AllocatedCountsWhatTheGraphHolds) {
  Fixture f;
  void* eager = f.alloc.allocate(2000);
  const int pool = f.alloc.begin_private_pool();
  void* out = f.alloc.allocate(4000);        // an output kept after the capture
  void* tmp = f.alloc.allocate(5 * MiB);     // a temporary, freed inside the capture
  f.alloc.deallocate(tmp, 5 * MiB);
  EXPECT_EQ(f.alloc.stats().allocated_bytes, 2000 + 4000) << "during the capture: the live blocks";
  f.alloc.end_private_pool();
  const int64_t held = 4000 + 5 * static_cast<int64_t>(MiB);   // the capture's peak in the pool
  EXPECT_EQ(f.alloc.stats().allocated_bytes, 2000 + held);
  EXPECT_EQ(f.alloc.stats().peak_allocated_bytes, 2000 + held);
  f.alloc.deallocate(out, 4000);             // the graph still holds its block
  EXPECT_EQ(f.alloc.stats().allocated_bytes, 2000 + held);
  void* out2 = nullptr;
  {
    // A second graph whose output outlives it.
    f.alloc.end_private_pool();              // no capture current: nothing changes
    const int second = f.alloc.begin_private_pool();
    out2 = f.alloc.allocate(3000);
    f.alloc.end_private_pool();
    EXPECT_EQ(f.alloc.stats().allocated_bytes, 2000 + held + 3000);
    f.alloc.release_private_pool(second);
    EXPECT_EQ(f.alloc.stats().allocated_bytes, 2000 + held + 3000) << "out2 is still alive";
  }
  f.alloc.release_private_pool(pool);
  EXPECT_EQ(f.alloc.stats().allocated_bytes, 2000 + 3000);
  f.alloc.deallocate(out2, 3000);
  f.alloc.deallocate(eager, 2000);
  EXPECT_EQ(f.alloc.stats().allocated_bytes, 0);
}

TEST(CachingAllocatorPrivatePool, ReleasingThePoolReturnsItsMemoryAndKeepsLiveBlocks) {
  Fixture f;
  const int pool = f.alloc.begin_private_pool();
  void* out = f.alloc.allocate(4000);    // an output the caller keeps after the graph is gone
  void* tmp = f.alloc.allocate(5 * MiB);
  f.alloc.end_private_pool();
  f.alloc.deallocate(tmp, 5 * MiB);
  const int64_t frees = f.alloc.detailed_stats().raw_frees;
  f.alloc.release_private_pool(pool);
  EXPECT_EQ(f.alloc.pool_reserved_bytes(pool), 0u);
  // The wholly free large segment went back to the device; the small one holds `out`.
  EXPECT_EQ(f.alloc.detailed_stats().raw_frees, frees + 1);
  EXPECT_EQ(f.alloc.stats().reserved_bytes, static_cast<int64_t>(2 * MiB));
  EXPECT_EQ(f.dev.in_use, 2 * MiB);
  // Its segment is an eager one now: eager requests use the rest of it, and once `out` is freed
  // empty_cache returns it.
  void* e = f.alloc.allocate(1000);
  EXPECT_EQ(f.alloc.detailed_stats().raw_allocs, 2);
  f.alloc.deallocate(e, 1000);
  f.alloc.deallocate(out, 4000);
  f.alloc.empty_cache();
  EXPECT_EQ(f.alloc.stats().reserved_bytes, 0);
  EXPECT_EQ(f.alloc.stats().allocated_bytes, 0);
  EXPECT_TRUE(f.dev.segments.empty());
}

// Two graphs on one pool (an accumulation window's micro-batch graphs): the second capture reuses
// the first's freed temporaries, never its live outputs; the pool holds the larger peak of the two
// captures, once; and it lives until the second graph that uses it is released.
TEST(CachingAllocatorPrivatePool, ASharedPoolHoldsTheLargerPeakOnceAndLivesUntilItsLastGraph) {
  Fixture f;
  const int pool = f.alloc.begin_private_pool();
  void* out_a = f.alloc.allocate(4000);        // the first graph's output, kept
  void* tmp_a = f.alloc.allocate(5 * MiB);     // its temporary
  f.alloc.deallocate(tmp_a, 5 * MiB);
  f.alloc.end_private_pool();
  const int64_t peak_a = 4000 + 5 * static_cast<int64_t>(MiB);
  EXPECT_EQ(f.alloc.stats().allocated_bytes, peak_a);
  const size_t reserved = f.alloc.pool_reserved_bytes(pool);
  EXPECT_EQ(f.alloc.begin_private_pool(pool), pool);
  void* tmp_b = f.alloc.allocate(5 * MiB);     // the first graph's temporary: reused
  EXPECT_EQ(tmp_b, tmp_a);
  void* out_b = f.alloc.allocate(4000);        // not the first graph's live output
  EXPECT_NE(out_b, out_a);
  f.alloc.deallocate(tmp_b, 5 * MiB);
  f.alloc.end_private_pool();
  EXPECT_EQ(f.alloc.pool_reserved_bytes(pool), reserved) << "no new segment";
  // Held once: the pool's largest peak of live blocks (both outputs and a temporary).
  const int64_t peak = 4000 + 4000 + 5 * static_cast<int64_t>(MiB);
  EXPECT_EQ(f.alloc.stats().allocated_bytes, peak);
  EXPECT_EQ(f.alloc.stats().peak_allocated_bytes, peak);
  f.alloc.deallocate(out_a, 4000);
  f.alloc.deallocate(out_b, 4000);
  f.alloc.release_private_pool(pool);          // the first graph: the second still replays there
  EXPECT_EQ(f.alloc.pool_reserved_bytes(pool), reserved);
  EXPECT_EQ(f.alloc.stats().allocated_bytes, peak);
  f.alloc.release_private_pool(pool);          // the last: the pool's memory goes back
  EXPECT_EQ(f.alloc.pool_reserved_bytes(pool), 0u);
  EXPECT_EQ(f.alloc.stats().allocated_bytes, 0);
  EXPECT_THROW(f.alloc.begin_private_pool(pool), Error) << "a released pool cannot be shared";
}

TEST(CachingAllocatorPrivatePool, AnOomDuringACaptureDoesNotReleaseTheCache) {
  Fixture f;
  f.dev.capacity = 22 * MiB;
  void* eager = f.alloc.allocate(3 * MiB);   // a 20 MiB eager segment
  f.alloc.deallocate(eager, 3 * MiB);        // cached
  f.alloc.begin_private_pool();
  const int syncs = f.dev.syncs;
  try {
    f.alloc.allocate(5 * MiB);
    FAIL() << "expected an OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA graph"), std::string::npos) << e.what();
  }
  EXPECT_EQ(f.dev.syncs, syncs);   // releasing the cache would synchronize inside the capture
  f.alloc.end_private_pool();
  EXPECT_EQ(f.alloc.stats().reserved_bytes, static_cast<int64_t>(20 * MiB));
  f.alloc.begin_private_pool();
  EXPECT_THROW(f.alloc.begin_private_pool(), Error) << "one capture at a time";
  f.alloc.end_private_pool();
}

// fail_in_capture: the eager pools and the captures it lets pass never see it; in the one it names,
// the named request and every later one throw OutOfMemoryError, even from a freed block of a shared
// pool (which no budget refuses); the pool's books stay whole, and the next capture is served.
TEST(CachingAllocatorPrivatePool, AnInjectedFaultFailsTheNamedRequestOfTheNamedCapture) {
  Fixture f;
  const int pool = f.alloc.begin_private_pool();
  void* temp = f.alloc.allocate(MiB);   // a temporary of the first capture: a freed block of the pool
  f.alloc.deallocate(temp, MiB);
  f.alloc.end_private_pool();
  f.alloc.fail_in_capture(1, 1);
  EXPECT_TRUE(f.alloc.capture_fault_armed());
  void* eager = f.alloc.allocate(MiB);   // eager requests never count
  const int other = f.alloc.begin_private_pool();   // the capture it lets pass
  void* passed = f.alloc.allocate(MiB);
  f.alloc.deallocate(passed, MiB);
  f.alloc.end_private_pool();
  const MemoryStats before = f.alloc.stats();
  EXPECT_EQ(f.alloc.begin_private_pool(pool), pool);   // the faulting capture, sharing the first pool
  void* first = f.alloc.allocate(MiB / 2);             // request 0 is served
  try {
    f.alloc.allocate(MiB / 4);
    FAIL() << "expected an OutOfMemoryError at request 1";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("fail_in_capture"), std::string::npos) << e.what();
  }
  EXPECT_THROW(f.alloc.allocate(512), OutOfMemoryError) << "a smaller request is refused too";
  EXPECT_TRUE(f.alloc.capture_fault_armed()) << "until the capture ends";
  EXPECT_EQ(f.alloc.capture_fault_requests(), 1) << "served before it fired";
  f.alloc.deallocate(first, MiB / 2);
  f.alloc.end_private_pool();
  EXPECT_FALSE(f.alloc.capture_fault_armed());
  EXPECT_EQ(f.alloc.stats().reserved_bytes, before.reserved_bytes) << "served from the pool's freed block";
  EXPECT_EQ(f.alloc.begin_private_pool(pool), pool);   // the next capture is served
  void* again = f.alloc.allocate(MiB / 4);
  f.alloc.deallocate(again, MiB / 4);
  f.alloc.end_private_pool();
  for (int id : {pool, pool, pool, other}) f.alloc.release_private_pool(id);   // pool: its three graphs
  f.alloc.fail_in_capture(0, 5);   // a capture that ends before its request 5 disarms it
  const int last = f.alloc.begin_private_pool();
  void* one = f.alloc.allocate(MiB);
  f.alloc.deallocate(one, MiB);
  f.alloc.end_private_pool();
  EXPECT_FALSE(f.alloc.capture_fault_armed());
  EXPECT_EQ(f.alloc.capture_fault_requests(), 1) << "all the capture made";
  f.alloc.release_private_pool(last);
  f.alloc.deallocate(eager, MiB);
  EXPECT_THROW(f.alloc.fail_in_capture(-1, 0), Error);
}

}  // namespace
}  // namespace minidl
