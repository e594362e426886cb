// The device-independent half of the CUDA caching allocator: size classes, block splitting,
// coalescing of free neighbours and the memory budget. The device half (cudaMalloc/cudaFree) sits
// behind SegmentSource, so a host-memory fake drives all of this logic in CI without a GPU.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <set>
#include <map>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/allocator.h"

namespace minidl {

// Where segments (the big chunks the allocator carves blocks from) come from.
class SegmentSource {
 public:
  virtual ~SegmentSource() = default;
  // nullptr when the device itself is out of memory (never throws for that).
  virtual void* raw_alloc(size_t bytes) = 0;
  virtual void raw_free(void* ptr, size_t bytes) = 0;
  // Called before cached segments go back to the system (the device must be done with them).
  virtual void synchronize() {}
  // Told when a block of a segment is handed out ([p, p + requested) in use, up to p + block_size
  // rounding slack) and when it comes back, so a checking device (the emulator's ASan build) can
  // poison what no tensor owns. No-ops by default. `private_pool`: the block is a CUDA graph's
  // (below): its marking is part of the captured step, an eager block's is not.
  virtual void block_live(void* /*p*/, size_t /*requested*/, size_t /*block_size*/, bool /*private_pool*/) {}
  virtual void block_free(void* /*p*/, size_t /*block_size*/, bool /*private_pool*/) {}

  // Expandable segments (CachingAllocator, below): an address range reserved once, with memory
  // mapped behind it page by page. page_size() 0: this source has none. reserve_address reserves
  // the range, kExpandableRange times the device's memory (a base of nullptr: none to be had);
  // map_page returns false when the device is out of memory (never throws for that). A page is
  // mapped and unmapped whole, at an address of the range.
  struct AddressRange {
    void* base = nullptr;
    size_t bytes = 0;
  };
  static constexpr size_t kExpandableRange = 4;
  virtual size_t page_size() const { return 0; }
  virtual AddressRange reserve_address() { return {}; }
  virtual void release_address(AddressRange /*range*/) {}
  virtual bool map_page(void* /*p*/) { return false; }
  virtual void unmap_page(void* /*p*/) {}
};

// Segments that are address ranges with no memory behind them, handed out in increasing order
// (never reused, never mapped): the meta device's model of a GPU (Device::meta(CUDA)) runs the
// caching allocator below unchanged on it, so its rounding, caching and budget are the real ones.
// capacity_bytes > 0: raw_alloc refuses what would hold more, as a device of that size would.
class AddressRangeSource final : public SegmentSource {
 public:
  explicit AddressRangeSource(size_t capacity_bytes = 0) : capacity_(capacity_bytes) {}
  void* raw_alloc(size_t bytes) override;
  void raw_free(void* ptr, size_t bytes) override;
  // Pages of 2 MiB, as a GPU's (cuMemGetAllocationGranularity on the H100 and H200).
  // Without a capacity the range is 1 TiB.
  size_t page_size() const override { return size_t{2} << 20; }
  AddressRange reserve_address() override;
  bool map_page(void* p) override;
  void unmap_page(void* p) override;

 private:
  std::mutex mu_;
  size_t capacity_ = 0, held_ = 0;
  uintptr_t next_ = uintptr_t{1} << 45;
};

// What the caching allocator knows beyond MemoryStats.
struct CachingStats {
  MemoryStats base;
  int64_t fragmentation_bytes = 0;   // reserved - allocated: cached or rounding slack
  int64_t segments = 0;              // segments currently held
  int64_t raw_allocs = 0;            // calls to SegmentSource::raw_alloc that succeeded (cudaMalloc)
  int64_t raw_frees = 0;             // calls to SegmentSource::raw_free (cudaFree)
  int64_t cache_flushes = 0;         // times the cache was released to satisfy a request
};

// PyTorch's scheme (c10/cuda/CUDACachingAllocator), simplified to one stream:
//  - requests round up to 512 bytes; <= 1 MiB goes to the small pool, the rest to the large pool;
//  - a small-pool miss reserves a 2 MiB segment; a large-pool miss reserves 20 MiB for requests
//    under 10 MiB and the request rounded to 2 MiB otherwise (falling back to the exact rounded
//    size when the bigger segment would break the budget);
//  - best fit among free blocks of the pool, ties going to the oldest segment, then the lowest
//    address in it (not to the lowest address overall: the device decides where a segment lies, and
//    an emulated or meta device's addresses differ from a GPU's, so the choice would too); the
//    remainder is split off when it is >= 512 bytes
//    (small pool) or > 1 MiB (large pool); freed blocks merge with free neighbours of the same
//    segment, so steady-state training reuses blocks without touching the device allocator;
//  - a request that would push reserved bytes past the budget, or that the device refuses, first
//    releases every wholly free cached segment and retries, then throws OutOfMemoryError.
// allocated_bytes counts the bytes requested (as the CPU allocator does); reserved_bytes the
// segments held, so reserved - allocated is the fragmentation.
//
// Expandable segments (set_expandable_segments, PyTorch's expandable_segments:True): a miss of the
// eager large pool grows one segment instead of reserving a new one. That segment is an address
// range reserved once (SegmentSource::kExpandableRange times the device's memory), laid
// out as blocks like any segment, with the device's pages (SegmentSource::page_size, 2 MiB) mapped
// behind the blocks handed out. A miss extends its last block when that one is free, else appends
// a block, each by whole pages; freeing merges neighbours as in any segment; releasing the cache
// (empty_cache, or before an OOM) unmaps every page that lies wholly inside a free block, and a
// free block whose pages were unmapped maps them again when it is handed out. So memory freed
// between live blocks goes back to the device, where a fixed segment keeps it until every block
// of the segment is free: what fits no longer depends on where the step's blocks fell, and reserved
// is the pages behind live blocks plus the cache. The small pool and CUDA graphs' private pools keep
// fixed segments. Reserved bytes count mapped pages; raw_allocs and raw_frees count pages mapped
// and unmapped. Off by default, as in PyTorch; the mode is chosen before the first tensor.
//
// Private pools (CUDA graphs, as PyTorch's graph pools): a captured graph replays its kernels on
// the addresses it captured, including memory its step freed and allocated again during the
// capture. While a private pool is active (begin_private_pool), every request is served from that
// pool's own segments, and a block of the pool, freed (during the capture or later), goes back to
// the pool, never to the eager pools: so no eager tensor is ever placed where a replay writes.
// release_private_pool (the graph destroyed) returns the pool's wholly free segments to the device
// and hands segments still holding live blocks to the eager pools. Private segments count in
// reserved bytes and the budget like any other; they are not released by empty_cache or by the
// cache flush before an OOM while their pool lives. Allocated bytes count what the graph holds:
// from the end of its capture until its release, the peak of its pool's live blocks during the
// capture (the step's temporaries included, which every replay writes again), as an eager step
// counts its own while it runs.
class CachingAllocator final : public StatsAllocator {
 public:
  static constexpr size_t kMinBlock = 512;
  static constexpr size_t kSmallSize = size_t{1} << 20;
  static constexpr size_t kSmallBuffer = size_t{2} << 20;
  static constexpr size_t kLargeBuffer = size_t{20} << 20;
  static constexpr size_t kMinLargeAlloc = size_t{10} << 20;
  static constexpr size_t kRoundLarge = size_t{2} << 20;

  CachingAllocator(std::unique_ptr<SegmentSource> source, Device device);
  ~CachingAllocator() override;
  CachingAllocator(const CachingAllocator&) = delete;
  CachingAllocator& operator=(const CachingAllocator&) = delete;

  void* allocate(size_t nbytes) override;
  void deallocate(void* ptr, size_t nbytes) override;
  void empty_cache() override;
  Device device() const override { return device_; }
  // false when the source has no pages to map (SegmentSource::page_size() 0) and `on` is asked.
  // A change of mode needs an allocator that holds no tensor (it throws otherwise): the cache and
  // the expandable range are released, and allocation starts as on a new allocator.
  bool set_expandable_segments(bool on) override;
  bool expandable_segments() const override;
  // Handlers are asked by eager work (Allocator::add_out_of_memory_handler): a request of the eager
  // pools, or of a lent pool that did not fit even with the pool's free segments given back (a
  // handler that releases the lent pool ends its lending first); never by a capture's request.
  int add_out_of_memory_handler(std::function<bool(size_t)> handler) override;
  void remove_out_of_memory_handler(int id) override;

  CachingStats detailed_stats() const;

  // Private pools (above). begin_private_pool releases the eager cache (the caller has finished the
  // device's work: nothing can be released during the capture that follows), makes a new pool
  // current and returns its id (> 0); end_private_pool makes the eager pools current again (the
  // pool keeps its segments).
  // begin_private_pool(id) makes the live pool `id` current again, for one more graph that shares it
  // (PyTorch's graph pool sharing: graphs that only ever replay one after the other, never at the
  // same time, hold their temporaries once). The pool then holds the largest peak of its captures,
  // and release_private_pool releases it when the last graph using it does.
  int begin_private_pool(int share = 0);
  void end_private_pool();
  void release_private_pool(int id);
  // Eager work between the replays of the graphs on live pool `id` (an evaluation batch or a
  // training micro-batch run eagerly beside them): begin_lending makes the pool current without a
  // capture, so the work's requests are served from the pool's blocks, which hold nothing a replay
  // reads between replays, and a miss grows the pool (the eager cache may be released first: no
  // stream captures). When even that fails, the pool's free segments go back to the device before
  // the request fails, as they would without the graphs. The pool then holds the largest peak of
  // its captures and lendings. end_lending makes the eager pools current again and returns whether
  // the graphs may replay again: every block handed out since begin_lending is free again (no
  // replay writes over a live tensor) and the pool kept its segments. When not, the caller drops
  // the pool's graphs. `resume` goes on with the last lending of the pool after a pause (an eager
  // accumulation window whose tensors outlive each micro-batch; what the host does between them,
  // the loader's next batch, goes to the eager pools): end_lending then answers since its start.
  void begin_lending(int id, bool resume = false);
  bool end_lending();
  int current_pool() const;
  // Bytes of segments that pool `id` holds (0 for a released or unknown pool).
  size_t pool_reserved_bytes(int id) const;
  // A fault for testing what a full device does to a capture that no budget reaches: one that fits
  // in the freed blocks of a pool it shares never asks for a segment. Once `captures_before` more
  // private pools have become current (begin_private_pool), every request from number `request`
  // (0: the first) on, while the next one is current, throws OutOfMemoryError: a device with
  // nothing left refuses a smaller workspace too. It disarms when that capture ends; arming again
  // replaces it.
  void fail_in_capture(int captures_before, int64_t request);
  bool capture_fault_armed() const;   // its capture has not ended yet
  // The requests that capture was served: `request` once the fault fired, all it made when it ended
  // first (how a test finds the range of requests to fail).
  int64_t capture_fault_requests() const;
  // The block size a request of nbytes occupies, and the segment a miss of that size reserves.
  static size_t round_size(size_t nbytes);
  static size_t segment_size(size_t rounded);

 private:
  struct Block {
    char* ptr = nullptr;
    size_t size = 0;
    size_t requested = 0;   // bytes asked for while allocated
    int64_t segment = 0;    // its segment's number, in the order they were reserved (0: the expandable range)
    bool allocated = false;
    bool small = false;
    bool expandable = false;   // a block of the expandable segment
    int pool = 0;           // 0: the eager pools; > 0: a private pool
    bool adopted = false;   // eager room a private pool took for a capture (adopt_eager_free_blocks)
    bool captured = false;  // handed out during a capture of its pool (or merged with such a block)
    Block* prev = nullptr;  // neighbours inside the same segment
    Block* next = nullptr;
  };
  struct BySize {
    bool operator()(const Block* a, const Block* b) const {
      if (a->size != b->size) return a->size < b->size;
      return a->segment != b->segment ? a->segment < b->segment : a->ptr < b->ptr;
    }
  };
  using Pool = std::set<Block*, BySize>;

  struct Pools {
    Pool small, large;
    size_t reserved = 0;
    // A private pool's books: bytes of its live blocks, and their peak while it was current (the
    // capture). Once the capture ends the graph holds that peak: a replay writes every block the
    // capture used, so allocated counts peak_live for the pool until it is released, whatever its
    // blocks' tensors do in between.
    int64_t live = 0, peak_live = 0;
    bool holding = false;   // the capture ended and the graph lives
    int users = 0;          // the graphs captured into it (begin_private_pool), not yet released
  };
  Pools& pools_of(int id);
  // b takes over its next neighbour in the segment (which must be out of every pool), deleting it.
  static void absorb_next(Block* b);
  Block* find_free(Pool& pool, size_t size);
  Block* new_segment(size_t rounded, bool small, int pool);   // nullptr: no room (budget or device)
  void release_cached();                            // frees wholly free segments; mu_ held
  void release_free_segments(Pools& p);             // those of one pool (a lent one: lent_spoiled_)
  // A whole free segment of p back to the device, after one synchronize per release (`synced`: done
  // already), since a step or replay may still be running on its memory.
  void free_segment(Block* b, Pools& p, bool& synced);
  void adopt_eager_free_blocks(int id);              // into private pool id, at a capture's start
  Pools& reopen(int id, const char* to);             // live pool id current again (to share, to lend)
  void return_unused_adopted(Pools& p);              // at its end: what the capture did not touch
  void to_eager(Block* b);                           // a free private block back, merged in its segment
  // b, out of every pool, back to its pool, merged with its free neighbours (deallocate's end).
  void release_block(Block* b);
  // A block of `size` for the current pool, split and (in the expandable segment) mapped, out of
  // every pool; nullptr when the budget or the device leaves no room.
  Block* take_block(size_t size, bool small);
  // The expandable segment (mu_ held): a block of at least `size` grown at its end (out of every
  // pool, its pages not yet mapped; nullptr when the reserved range is used up or cannot be had),
  // the pages behind [p, p + n) mapped (false: the budget or the device refused one), the pages
  // wholly inside free blocks unmapped.
  Block* grow_expandable(size_t size);
  bool map_pages(const char* p, size_t n);
  void unmap_free_pages();
  void release_expandable_range();   // when no block of it is live; after release_cached
  struct Expandable {
    SegmentSource::AddressRange range;   // base nullptr: none reserved yet
    size_t end = 0;                      // the bytes laid out as blocks (whole pages)
    size_t page = 0;
    std::vector<bool> mapped;    // by page, up to end
    Block* first = nullptr;      // never merged into a neighbour (none before it)
  };
  [[noreturn]] void throw_oom(size_t nbytes, const std::string& why);
  // allocate() with mu_ held; a request that does not fit throws, or returns nullptr when !may_throw
  // (the out-of-memory handlers are asked first).
  void* allocate_locked(size_t nbytes, bool may_throw);

  std::unique_ptr<SegmentSource> source_;
  Device device_;
  std::map<int, Pools> pools_;   // 0: the eager pools
  int current_pool_ = 0, next_pool_ = 1;
  bool lending_ = false;        // current_pool_ is lent to eager work (begin_lending), not captured into
  int64_t lent_live_ = 0;       // the pool's live bytes when the lending began
  bool lent_spoiled_ = false;   // the lent pool gave free segments back: its graphs' addresses are gone
  bool expandable_on_ = false;
  Expandable ex_;
  std::unordered_map<void*, Block*> live_;   // allocated blocks by pointer
  int64_t segments_ = 0, segments_made_ = 0, raw_allocs_ = 0, raw_frees_ = 0, flushes_ = 0;
  // fail_in_capture: the pools to let begin first (-1: none armed), whether the current one is the
  // faulting capture, and the requests it has served.
  int fault_skip_ = -1;
  bool fault_current_ = false;
  int64_t fault_request_ = 0, fault_seen_ = 0;
  std::vector<std::pair<int, std::function<bool(size_t)>>> oom_handlers_;   // by id, oldest first
  int next_handler_ = 1;
};

}  // namespace minidl
