// The caching allocator's private pools (CUDA graphs, kernels/caching_allocator.h): eager requests
// never land in a pool, the books count what a graph holds, releasing and sharing a pool, the cache
// released before a capture and an OOM during it, lending a pool to eager work, and the fault
// fail_in_capture injects. On the host-memory fake device.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/error.h"
#include "kernels/caching_allocator.h"
#include "tests/kernels/fake_segment_source.h"

namespace minidl {
namespace {

using testing::AllocatorFixture;
using testing::FakeDevice;
using testing::MiB;

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

// A capture takes the large blocks the eager pools have free (release_cached gave back their whole
// segments; the rest lies beside live eager tensors) and grows segments of its own; at its end the
// room it did not hand out goes back. Eager requests never reuse the captured blocks while the pool
// lives, and its release gives the eager room back whole.
TEST(CachingAllocatorPrivatePool, EagerAllocationsNeverReuseTheCapturedBlocks) {
  AllocatorFixture f;
  void* eager = f.alloc.allocate(2 * MiB);   // an eager 20 MiB segment with room to spare
  const auto before = f.dev.segments;
  ASSERT_EQ(before.size(), 1u);
  const std::vector<void*> eager_segment{before.begin()->first};
  const int pool = f.alloc.begin_private_pool();
  EXPECT_GT(pool, 0);
  EXPECT_EQ(f.alloc.current_pool(), pool);
  void* a = f.alloc.allocate(3 * MiB);       // the eager segment's free room, adopted by the pool
  EXPECT_TRUE(inside(f.dev, a, eager_segment));
  void* big = f.alloc.allocate(16 * MiB);    // a segment of its own
  void* small = f.alloc.allocate(1000);      // a small segment of the pool's: small room is not adopted
  f.alloc.deallocate(a, 3 * MiB);            // freed during the capture: reused within it
  void* b = f.alloc.allocate(3 * MiB);
  EXPECT_EQ(b, a);
  f.alloc.end_private_pool();
  EXPECT_EQ(f.alloc.current_pool(), 0);
  const std::vector<void*> pool_segments = new_segments(f.dev, before);
  ASSERT_EQ(pool_segments.size(), 2u);   // one small, one large
  EXPECT_TRUE(inside(f.dev, big, pool_segments));
  EXPECT_TRUE(inside(f.dev, small, pool_segments));
  EXPECT_EQ(f.alloc.pool_reserved_bytes(pool), 16 * MiB + 2 * MiB + 3 * MiB) << "its segments and the block it used";
  // The graph's temporaries, freed after the capture, stay the pool's: eager requests of every
  // size go elsewhere, the large ones into the eager segment's room the capture did not use.
  f.alloc.deallocate(b, 3 * MiB);
  f.alloc.deallocate(big, 16 * MiB);
  f.alloc.deallocate(small, 1000);
  std::vector<std::pair<void*, size_t>> later;
  for (size_t n : {size_t{1000}, size_t{512}, 3 * MiB, 2 * MiB}) later.emplace_back(f.alloc.allocate(n), n);
  for (const auto& [p, n] : later) {
    EXPECT_FALSE(inside(f.dev, p, pool_segments)) << n;
    EXPECT_FALSE(p >= b && static_cast<const char*>(p) < static_cast<const char*>(b) + 3 * MiB) << n;
  }
  EXPECT_TRUE(inside(f.dev, later[2].first, eager_segment));
  // Statistics stay exact: reserved counts the pool's segments too, and allocated what the graph
  // holds (its capture's peak, 3 MiB + 16 MiB + 1000, though all were freed) beside the eager blocks.
  const CachingStats s = f.alloc.detailed_stats();
  EXPECT_EQ(s.base.allocated_bytes,
            static_cast<int64_t>(2 * MiB + (3 * MiB + 16 * MiB + 1000) + (1000 + 512 + 3 * MiB + 2 * MiB)));
  EXPECT_EQ(static_cast<size_t>(s.base.reserved_bytes), f.dev.in_use);
  // empty_cache leaves a live pool's segments and adopted blocks alone (a replay still writes there).
  for (const auto& [p, n] : later) f.alloc.deallocate(p, n);
  f.alloc.deallocate(eager, 2 * MiB);
  f.alloc.empty_cache();
  EXPECT_EQ(f.alloc.pool_reserved_bytes(pool), 16 * MiB + 2 * MiB + 3 * MiB);
  for (void* seg : pool_segments) EXPECT_EQ(f.dev.segments.count(seg), 1u);
  EXPECT_EQ(f.dev.segments.count(eager_segment[0]), 1u) << "a block of the eager segment is the pool's";
  // Released, the pool's segments go back, and the adopted block joins the eager room freed beside
  // it: the eager segment is whole again, and the cache gives it back.
  f.alloc.release_private_pool(pool);
  for (void* seg : pool_segments) EXPECT_EQ(f.dev.segments.count(seg), 0u);
  f.alloc.empty_cache();
  EXPECT_EQ(f.dev.in_use, 0u);
  EXPECT_EQ(f.alloc.stats().reserved_bytes, 0);
  EXPECT_EQ(f.alloc.stats().allocated_bytes, 0);
}

// A graph holds what its capture used: allocated counts the capture's peak of the pool's live
// blocks from the end of the capture until the release, whatever the captured tensors do meanwhile
// (a replay writes every block again), and the release leaves the blocks still alive counted.
TEST(CachingAllocatorPrivatePool, AllocatedCountsWhatTheGraphHolds) {
  AllocatorFixture f;
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
  AllocatorFixture f;
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
  AllocatorFixture f;
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

// As torch.cuda.graph empties the cache before it captures: the eager cache goes back to the device
// when a capture begins (the pool grows into that memory), and nothing is released during the
// capture (it would synchronize inside it): a request the device refuses then fails.
TEST(CachingAllocatorPrivatePool, ACaptureReleasesTheEagerCacheBeforeItAndNothingDuringIt) {
  AllocatorFixture f;
  f.dev.capacity = 22 * MiB;
  void* eager = f.alloc.allocate(3 * MiB);   // a 20 MiB eager segment
  f.alloc.deallocate(eager, 3 * MiB);        // cached
  const int syncs = f.dev.syncs;
  f.alloc.begin_private_pool();
  EXPECT_EQ(f.alloc.stats().reserved_bytes, 0) << "the eager cache went back before the capture";
  EXPECT_EQ(f.dev.syncs, syncs + 1);
  void* captured = f.alloc.allocate(5 * MiB);   // a 20 MiB segment of the pool, where the cache was
  const int in_capture = f.dev.syncs;
  try {
    f.alloc.allocate(16 * MiB);   // its own segment, which the device refuses
    FAIL() << "expected an OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    EXPECT_NE(std::string(e.what()).find("CUDA graph"), std::string::npos) << e.what();
  }
  EXPECT_EQ(f.dev.syncs, in_capture);
  f.alloc.deallocate(captured, 5 * MiB);
  f.alloc.end_private_pool();
  EXPECT_EQ(f.alloc.stats().reserved_bytes, static_cast<int64_t>(20 * MiB));
  f.alloc.begin_private_pool();
  EXPECT_THROW(f.alloc.begin_private_pool(), Error) << "one capture at a time";
  f.alloc.end_private_pool();
}

// Eager work between replays borrows the pool's free blocks (begin_lending): end_lending says the
// graphs may replay again when it left nothing live there (since the lending began, across a
// pause); not when a tensor stays, or when the pool gave its free segments back so that a request
// the device refused could be served.
TEST(CachingAllocatorPrivatePool, ALentPoolServesEagerWorkAndSaysWhetherItsGraphsMayReplay) {
  AllocatorFixture f;
  f.dev.capacity = 22 * MiB;
  const int pool = f.alloc.begin_private_pool();
  void* temp = f.alloc.allocate(5 * MiB);   // the capture's temporary: a free 20 MiB segment after it
  f.alloc.deallocate(temp, 5 * MiB);
  f.alloc.end_private_pool();
  const int64_t held = 5 * static_cast<int64_t>(MiB);
  EXPECT_EQ(f.alloc.stats().allocated_bytes, held);

  f.alloc.begin_lending(pool);
  EXPECT_EQ(f.alloc.current_pool(), pool);
  EXPECT_THROW(f.alloc.begin_private_pool(), Error) << "no capture while the pool is lent";
  void* work = f.alloc.allocate(2 * MiB);
  EXPECT_EQ(work, temp) << "served from the pool's free block";
  f.alloc.deallocate(work, 2 * MiB);
  EXPECT_TRUE(f.alloc.end_lending());
  EXPECT_EQ(f.alloc.current_pool(), 0);
  EXPECT_EQ(f.alloc.stats().allocated_bytes, held) << "the graph holds its peak again";
  EXPECT_EQ(f.alloc.stats().reserved_bytes, static_cast<int64_t>(20 * MiB));

  f.alloc.begin_lending(pool);
  void* left = f.alloc.allocate(2 * MiB);
  EXPECT_FALSE(f.alloc.end_lending()) << "a replay would write over the tensor left in the pool";
  f.alloc.deallocate(left, 2 * MiB);

  // Paused and resumed (an eager accumulation window): the answer is the whole lending's.
  f.alloc.begin_lending(pool);
  void* window = f.alloc.allocate(2 * MiB);   // a tensor of the window, live across its pause
  EXPECT_TRUE(inside(f.dev, window, {temp}));
  EXPECT_FALSE(f.alloc.end_lending());
  void* between = f.alloc.allocate(4000);   // the host's work between micro-batches: eager
  EXPECT_FALSE(inside(f.dev, between, {temp})) << "not in the pool's segment";
  f.alloc.begin_lending(pool, true);
  f.alloc.deallocate(window, 2 * MiB);
  EXPECT_TRUE(f.alloc.end_lending());
  f.alloc.deallocate(between, 4000);

  f.alloc.begin_lending(pool);
  const int64_t ooms = f.alloc.stats().num_ooms;
  void* big = f.alloc.allocate(21 * MiB);   // 22 MiB: only once the pool's free segment went back
  EXPECT_EQ(f.alloc.stats().num_ooms, ooms);
  EXPECT_EQ(f.alloc.stats().reserved_bytes, static_cast<int64_t>(22 * MiB));
  f.alloc.deallocate(big, 21 * MiB);
  EXPECT_FALSE(f.alloc.end_lending()) << "the graph's addresses went back to the device";
  f.alloc.release_private_pool(pool);
  EXPECT_EQ(f.alloc.stats().allocated_bytes, 0);
  EXPECT_EQ(f.alloc.stats().reserved_bytes, 0);
  EXPECT_THROW(f.alloc.begin_lending(pool), Error) << "a released pool cannot be lent";
}

// The out-of-memory handlers (Allocator::add_out_of_memory_handler: how GraphedStep drops its
// graphs for eager work that does not fit beside them): asked, newest first and without the lock,
// by an eager request or a lent one that does not fit even with the cache (and the lent pool's free
// segments) given back; the request is tried again once one made room. Never by a capture's
// request, nor by a tentative one (a cuDNN workspace with a leaner plan after it).
TEST(CachingAllocatorPrivatePool, OutOfMemoryHandlersMakeRoomForEagerWorkOnly) {
  AllocatorFixture f;
  f.alloc.set_budget(48 * MiB);
  int pool = 0;
  void* out = nullptr;
  const auto capture = [&] {   // a graph: its temporaries (16 MiB, free after it) and a held output
    pool = f.alloc.begin_private_pool();
    void* temp = f.alloc.allocate(16 * MiB);
    out = f.alloc.allocate(1000);
    f.alloc.end_private_pool();
    f.alloc.deallocate(temp, 16 * MiB);
  };
  std::vector<std::string> asked;
  const auto said = [](const std::string& who, size_t n) { return who + " " + std::to_string(n); };
  const int older = f.alloc.add_out_of_memory_handler([&](size_t n) {
    asked.push_back(said("older", n));
    return false;
  });
  const int newer = f.alloc.add_out_of_memory_handler([&](size_t n) {
    asked.push_back(said("newer", n));
    if (out == nullptr) return false;
    f.alloc.end_lending();   // as GraphedStep::make_room: a lending ends, the output and the pool go
    f.alloc.deallocate(out, 1000);
    out = nullptr;
    f.alloc.release_private_pool(pool);
    return true;
  });
  capture();   // 18 MiB reserved: the pool's 16 MiB segment and its 2 MiB small one
  {
    const int other = f.alloc.begin_private_pool();
    EXPECT_THROW(f.alloc.allocate(40 * MiB), OutOfMemoryError) << "a capture cannot release memory";
    f.alloc.end_private_pool();
    f.alloc.release_private_pool(other);
    const TentativeRequests tentative;
    EXPECT_THROW(f.alloc.allocate(40 * MiB), OutOfMemoryError) << "a tentative request";
  }
  EXPECT_TRUE(asked.empty());
  // An eager request: 18 + 40 MiB is over the budget until the graph goes.
  void* eager = f.alloc.allocate(40 * MiB);
  EXPECT_EQ(asked, std::vector<std::string>{said("newer", 40 * MiB)});
  EXPECT_EQ(f.alloc.pool_reserved_bytes(pool), 0u);
  f.alloc.deallocate(eager, 40 * MiB);
  // A lent one: the pool's free segment goes back first, and the output's 2 MiB beside 47 MiB
  // (rounded to 48) are still over the budget; the work goes on in the eager pools.
  capture();
  asked.clear();
  f.alloc.begin_lending(pool);
  void* lent = f.alloc.allocate(47 * MiB);
  EXPECT_EQ(asked, std::vector<std::string>{said("newer", 47 * MiB)});
  EXPECT_EQ(f.alloc.current_pool(), 0);
  EXPECT_EQ(f.alloc.pool_reserved_bytes(pool), 0u);
  // Nothing left to drop: both are asked, newest first, and the request fails; removed, none is.
  asked.clear();
  EXPECT_THROW(f.alloc.allocate(8 * MiB), OutOfMemoryError);
  EXPECT_EQ(asked, (std::vector<std::string>{said("newer", 8 * MiB), said("older", 8 * MiB)}));
  f.alloc.remove_out_of_memory_handler(newer);
  f.alloc.remove_out_of_memory_handler(older);
  asked.clear();
  EXPECT_THROW(f.alloc.allocate(8 * MiB), OutOfMemoryError);
  EXPECT_TRUE(asked.empty());
  f.alloc.deallocate(lent, 47 * MiB);
  EXPECT_EQ(f.alloc.stats().allocated_bytes, 0);
}

// fail_in_capture: the eager pools and the captures it lets pass never see it; in the one it names,
// the named request and every later one throw OutOfMemoryError, even from a freed block of a shared
// pool (which no budget refuses); the pool's books stay whole, and the next capture is served.
TEST(CachingAllocatorPrivatePool, AnInjectedFaultFailsTheNamedRequestOfTheNamedCapture) {
  AllocatorFixture f;
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
