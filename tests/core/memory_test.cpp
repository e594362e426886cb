// Exact memory accounting on the CPU allocator: known allocation sequences give known statistics,
// the budget throws OutOfMemoryError with the numbers in the message, and everything returns to
// its earlier values after the caller drops its tensors (the maximum-batch finder relies on it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "core/tensor.h"

namespace minidl {
namespace {

class Memory : public ::testing::Test {
 protected:
  void SetUp() override {
    set_memory_budget(Device::cpu(), 0);
    reset_peak_stats();
    base_ = memory_stats();
  }
  void TearDown() override { set_memory_budget(Device::cpu(), 0); }
  MemoryStats base_;
};

TEST_F(Memory, StatisticsAreExactForAKnownSequence) {
  {
    Tensor a = empty({1000});                        // 4000 bytes, block 4032
    Tensor b = empty({10}, {.dtype = DType::f64});    // 80 bytes, block 128
    MemoryStats s = memory_stats();
    EXPECT_EQ(s.allocated_bytes - base_.allocated_bytes, 4080);
    EXPECT_EQ(s.reserved_bytes - base_.reserved_bytes, 4032 + 128);
    EXPECT_EQ(s.num_allocs - base_.num_allocs, 2);
    Tensor v = a.view({10, 100});  // views allocate nothing
    EXPECT_EQ(memory_stats().num_allocs - base_.num_allocs, 2);
    {
      Tensor c = empty({250});  // 1000 bytes
      EXPECT_EQ(memory_stats().peak_allocated_bytes - base_.allocated_bytes, 5080);
    }
    s = memory_stats();
    EXPECT_EQ(s.allocated_bytes - base_.allocated_bytes, 4080);
    EXPECT_EQ(s.peak_allocated_bytes - base_.allocated_bytes, 5080);
    EXPECT_EQ(s.num_frees - base_.num_frees, 1);
  }
  MemoryStats s = memory_stats();
  EXPECT_EQ(s.allocated_bytes, base_.allocated_bytes);
  EXPECT_EQ(s.reserved_bytes, base_.reserved_bytes);
  reset_peak_stats();
  EXPECT_EQ(memory_stats().peak_allocated_bytes, base_.allocated_bytes);
}

TEST_F(Memory, BudgetThrowsWithNumbersAndRecovers) {
  set_memory_budget(Device::cpu(), static_cast<size_t>(base_.reserved_bytes) + 1024 * 1024);
  Tensor keep = empty({128 * 1024});  // 512 KiB: fits
  const MemoryStats before = memory_stats();
  try {
    Tensor big = empty({256 * 1024});  // 1 MiB more: over
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("1.0 MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("memory budget"), std::string::npos) << msg;
    EXPECT_EQ(e.requested(), 1024u * 1024u);
    EXPECT_EQ(e.in_use(), static_cast<size_t>(before.reserved_bytes));
  }
  MemoryStats after = memory_stats();
  EXPECT_EQ(after.num_ooms - before.num_ooms, 1);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes);
  // An OutOfMemoryError is a minidl::Error.
  EXPECT_THROW(empty({1024 * 1024}), Error);
}

TEST_F(Memory, TrainingStepOomLeavesNoDrift) {
  // A forward/backward that runs out of memory midway; after catching, the statistics return to
  // where they were, a hundred times in a row.
  Tensor w = randn({256, 256}).set_requires_grad(true);
  const MemoryStats start = memory_stats();
  set_memory_budget(Device::cpu(), static_cast<size_t>(start.reserved_bytes) + 3 * 256 * 1024);
  for (int i = 0; i < 100; ++i) {
    try {
      Tensor x = ones({256, 256});
      Tensor h = relu(matmul(x, w));
      Tensor y = relu(matmul(h, w));
      Tensor loss = sum(matmul(y, w));
      loss.backward();
      FAIL() << "expected OutOfMemoryError";
    } catch (const OutOfMemoryError&) {
    }
    w.zero_grad();
    const MemoryStats now = memory_stats();
    ASSERT_EQ(now.allocated_bytes, start.allocated_bytes) << "iteration " << i;
    ASSERT_EQ(now.reserved_bytes, start.reserved_bytes) << "iteration " << i;
  }
}

TEST_F(Memory, ParseBytes) {
  EXPECT_EQ(parse_bytes("11GiB"), 11ull << 30);
  EXPECT_EQ(parse_bytes("512MiB"), 512ull << 20);
  EXPECT_EQ(parse_bytes("1.5GB"), 1500000000ull);
  EXPECT_EQ(parse_bytes("4096"), 4096ull);
  EXPECT_THROW(parse_bytes("lots"), Error);
  EXPECT_THROW(parse_bytes("3 parsecs"), Error);
}

// The cache of large host blocks (core/allocator.h), on private allocators so the sequence is known.
constexpr size_t kMiB = size_t{1} << 20;

TEST(CpuAllocatorCache, FreedLargeBlockStaysReservedAndIsReused) {
  CpuAllocator a;
  void* p = a.allocate(4 * kMiB);
  a.deallocate(p, 4 * kMiB);
  EXPECT_EQ(a.stats().allocated_bytes, 0);
  EXPECT_EQ(a.stats().reserved_bytes, static_cast<int64_t>(4 * kMiB));
  EXPECT_EQ(a.cached_bytes(), static_cast<int64_t>(4 * kMiB));
  void* q = a.allocate(4 * kMiB - 10);  // the same rounded size: the same block, no new pages
  EXPECT_EQ(q, p);
  EXPECT_EQ(a.cache_hits(), 1);
  EXPECT_EQ(a.stats().allocated_bytes, static_cast<int64_t>(4 * kMiB - 10));
  EXPECT_EQ(a.stats().reserved_bytes, static_cast<int64_t>(4 * kMiB));
  EXPECT_EQ(a.cached_bytes(), 0);
  a.deallocate(q, 4 * kMiB - 10);
  void* small = a.allocate(1000);  // small blocks are not cached and leave the cache alone
  a.deallocate(small, 1000);
  EXPECT_EQ(a.cached_bytes(), static_cast<int64_t>(4 * kMiB));
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes, 0);
  EXPECT_EQ(a.cached_bytes(), 0);
}

TEST(CpuAllocatorCache, ReservedStaysWithinHalfAgainTheLiveHighWaterMark) {
  CpuAllocator a;
  void* p9 = a.allocate(9 * kMiB);
  a.deallocate(p9, 9 * kMiB);
  // 9 MiB cached (more than twice 4 MiB: it cannot serve the request) + 4 MiB new fits in 1.5 x
  // the live peak (9 MiB): the cached block stays.
  void* p4 = a.allocate(4 * kMiB);
  EXPECT_EQ(a.stats().reserved_bytes, static_cast<int64_t>(13 * kMiB));
  // 2 MiB more would not: the largest cached block goes back to the system.
  void* r2 = a.allocate(2 * kMiB);
  EXPECT_EQ(a.stats().reserved_bytes, static_cast<int64_t>(6 * kMiB));
  EXPECT_EQ(a.cached_bytes(), 0);
  EXPECT_EQ(a.stats().peak_reserved_bytes, static_cast<int64_t>(13 * kMiB));
  a.deallocate(p4, 4 * kMiB);
  a.deallocate(r2, 2 * kMiB);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes, 0);
}

TEST(CpuAllocatorCache, ALargerCachedBlockServesASmallerShapeWithoutABudgetOnly) {
  // An epoch's last, partial batch asks for smaller versions of every large tensor: the cached
  // blocks of the full batches serve them (up to twice the size) instead of being evicted.
  CpuAllocator a;
  void* full = a.allocate(8 * kMiB);
  a.deallocate(full, 8 * kMiB);
  void* part = a.allocate(5 * kMiB);
  EXPECT_EQ(part, full);
  EXPECT_EQ(a.cache_hits(), 1);
  EXPECT_EQ(a.block_bytes(part, 5 * kMiB), 8 * kMiB);
  EXPECT_EQ(a.stats().allocated_bytes, static_cast<int64_t>(5 * kMiB));
  EXPECT_EQ(a.stats().reserved_bytes, static_cast<int64_t>(8 * kMiB));
  a.deallocate(part, 5 * kMiB);  // back as the 8 MiB block it is
  EXPECT_EQ(a.cached_bytes(), static_cast<int64_t>(8 * kMiB));
  void* again = a.allocate(8 * kMiB);  // the next full batch: an exact hit
  EXPECT_EQ(again, full);
  EXPECT_EQ(a.block_bytes(again, 8 * kMiB), 8 * kMiB);
  a.deallocate(again, 8 * kMiB);
  // More than twice the request: not served (3 MiB from an 8 MiB block would waste 5).
  void* small = a.allocate(3 * kMiB);
  EXPECT_NE(small, full);
  EXPECT_EQ(a.block_bytes(small, 3 * kMiB), 3 * kMiB);
  a.deallocate(small, 3 * kMiB);
  // Under a budget the sizes stay exact: the 5 MiB request gets its own block.
  a.empty_cache();
  a.set_budget(64 * kMiB);
  void* f2 = a.allocate(8 * kMiB);
  a.deallocate(f2, 8 * kMiB);
  void* p2 = a.allocate(5 * kMiB);
  EXPECT_EQ(a.block_bytes(p2, 5 * kMiB), 5 * kMiB);
  // (8 cached + 5 new is over 1.5 x the 8 MiB mark, so the 8 MiB block went back to the system.)
  EXPECT_EQ(a.stats().reserved_bytes, static_cast<int64_t>(5 * kMiB));
  a.deallocate(p2, 5 * kMiB);
  a.empty_cache();
}

TEST(CpuAllocatorCache, RandomSequenceKeepsTheBound) {
  CpuAllocator a;
  std::mt19937 rng(7);
  std::vector<std::pair<void*, size_t>> live;
  int64_t live_bytes = 0, live_peak = 0;
  for (int i = 0; i < 2000; ++i) {
    if (live.empty() || rng() % 2 == 0) {
      const size_t n = (1 + rng() % 8) * kMiB + 64 * (rng() % 3);
      live.emplace_back(a.allocate(n), n);
      live_bytes += static_cast<int64_t>(a.block_bytes(live.back().first, n));  // a larger cached block may serve it
      live_peak = std::max(live_peak, live_bytes);
    } else {
      const size_t k = rng() % live.size();
      live_bytes -= static_cast<int64_t>(a.block_bytes(live[k].first, live[k].second));
      a.deallocate(live[k].first, live[k].second);
      live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
    }
    const MemoryStats s = a.stats();
    ASSERT_EQ(s.reserved_bytes, live_bytes + a.cached_bytes()) << "step " << i;
    ASSERT_LE(s.reserved_bytes, static_cast<int64_t>(CpuAllocator::kCacheSlack * static_cast<double>(live_peak)))
        << "step " << i;
  }
  EXPECT_GT(a.cache_hits(), 100);
  for (const auto& [p, n] : live) a.deallocate(p, n);
  a.empty_cache();
  EXPECT_EQ(a.stats().reserved_bytes, 0);
}

TEST(CpuAllocatorCache, BudgetReleasesTheCacheBeforeAnOom) {
  CpuAllocator a;
  void* p8 = a.allocate(8 * kMiB);
  void* p6 = a.allocate(6 * kMiB);
  a.deallocate(p8, 8 * kMiB);
  a.deallocate(p6, 6 * kMiB);
  ASSERT_EQ(a.cached_bytes(), static_cast<int64_t>(14 * kMiB));
  // A budget below what the cache holds: a small request makes room by releasing cached blocks.
  a.set_budget(14 * kMiB + 512 * 1024);
  void* s = a.allocate(600 * 1024);
  EXPECT_EQ(a.cached_bytes(), static_cast<int64_t>(6 * kMiB));
  EXPECT_LE(a.stats().reserved_bytes, static_cast<int64_t>(14 * kMiB + 512 * 1024));
  // A request that does not fit even with the cache empty is an OOM, and the cache is gone.
  try {
    a.allocate(14 * kMiB);
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_EQ(e.in_use(), CpuAllocator::rounded(600 * 1024));
  }
  EXPECT_EQ(a.cached_bytes(), 0);
  EXPECT_EQ(a.stats().num_ooms, 1);
  EXPECT_EQ(a.stats().allocated_bytes, static_cast<int64_t>(600 * 1024));
  a.deallocate(s, 600 * 1024);
}

TEST(CpuAllocatorCache, EnvironmentTurnsItOff) {
  const char* old = std::getenv("MINIDL_CPU_CACHE");
  const std::string saved = old ? old : "";
  setenv("MINIDL_CPU_CACHE", "0", 1);
  CpuAllocator a;
  if (old) setenv("MINIDL_CPU_CACHE", saved.c_str(), 1); else unsetenv("MINIDL_CPU_CACHE");
  void* p = a.allocate(4 * kMiB);
  a.deallocate(p, 4 * kMiB);
  EXPECT_EQ(a.stats().reserved_bytes, 0);
  EXPECT_EQ(a.cached_bytes(), 0);
}

}  // namespace
}  // namespace minidl
