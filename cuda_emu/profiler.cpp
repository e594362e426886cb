// The counters of profiler.h, built from what access_recorder.h's hooks report. Lanes run one after
// another as fibers, so a warp-level instruction is rebuilt as the set of lane accesses sharing
// (warp, instruction address, the lane's k-th execution of that address): lanes that diverge in a
// loop still meet at their k-th trip, as SIMT lanes do. Each block's instructions are folded into
// the launch's counters when the block ends; the launch's distinct sectors, with per-byte masks,
// also give the race check (race_check.h) the launch's read, write and atomic byte sets.
#include "cuda_emu/profiler.h"

#include <algorithm>
#include <atomic>
#include <mutex>
#include <unordered_map>
#include <utility>

#include "cuda_emu/access_recorder.h"
#include "cuda_emu/race_check.h"
#include "cuda_emu/launch_info.h"
#include "cuda_emu/runtime_state.h"

namespace minidl::cuda::emu {

thread_local LaunchRecorder* t_recorder __attribute__((tls_model("initial-exec"))) = nullptr;
thread_local int t_record_thread __attribute__((tls_model("initial-exec"))) = 0;

namespace {

constexpr unsigned kSectorShift = 5;   // 32-byte sectors
constexpr unsigned kBanks = 32;        // shared memory: 32 banks of 4-byte words

std::atomic<bool> g_profiling{false};
std::atomic<bool> g_instrumented{false};
std::mutex g_profile_mu;
std::vector<LaunchCounters>& store() {
  static auto* v = new std::vector<LaunchCounters>();   // never destroyed: launches may run at exit
  return *v;
}

enum class Space : uint8_t { Global, Shared };

// One lane's part of a warp-level instruction.
struct LaneAccess {
  uint32_t instr;   // index into the block's instructions
  uint32_t size;
  uint64_t addr;    // device address, or offset in the block's shared arena
};

struct Instr {
  Space space;
  AccessKind kind;
};

// Which bytes of one 32-byte sector the launch read, wrote, and updated atomically.
struct SectorBytes {
  uint32_t read = 0, written = 0, atomic = 0;
};

uint32_t byte_mask(uint64_t sector, uint64_t begin, uint64_t end) {
  const uint64_t lo = std::max(begin, sector << kSectorShift) - (sector << kSectorShift);
  const uint64_t hi = std::min(end, (sector + 1) << kSectorShift) - (sector << kSectorShift);
  return static_cast<uint32_t>(hi - lo == 32 ? ~0u : ((1u << (hi - lo)) - 1u) << lo);
}

// Wavefronts of one shared-memory request: the warp is served in phases (one for accesses of up to
// 4 bytes, two half-warps for 8, four quarter-warps for 16), and a phase takes as many wavefronts
// as the most distinct 4-byte words any one bank must deliver (lanes reading one word share it).
uint64_t shared_wavefronts(const LaneAccess* lanes, const uint32_t* lane_ids, size_t n) {
  uint32_t size = 0;
  for (size_t i = 0; i < n; ++i) size = std::max(size, lanes[i].size);
  const uint32_t phases = size <= 4 ? 1 : size <= 8 ? 2 : 4;
  const uint32_t per_phase = 32 / phases;
  uint64_t total = 0;
  std::vector<uint64_t> words;
  for (uint32_t ph = 0; ph < phases; ++ph) {
    words.clear();
    for (size_t i = 0; i < n; ++i) {
      if (lane_ids[i] / per_phase != ph) continue;
      const uint64_t first = lanes[i].addr / 4, last = (lanes[i].addr + lanes[i].size - 1) / 4;
      for (uint64_t w = first; w <= last; ++w) words.push_back(w);
    }
    if (words.empty()) continue;
    std::sort(words.begin(), words.end());
    words.erase(std::unique(words.begin(), words.end()), words.end());
    uint32_t per_bank[kBanks] = {};
    uint32_t worst = 0;
    for (uint64_t w : words) worst = std::max(worst, ++per_bank[w % kBanks]);
    total += worst;
  }
  return total;
}

struct InstrKey {
  uint64_t pc_warp;   // instruction address << 5 | warp (user-space addresses have 47 bits)
  uint64_t k;         // the lanes' k-th execution of the address
  bool operator==(const InstrKey& o) const { return pc_warp == o.pc_warp && k == o.k; }
};
struct InstrKeyHash {
  size_t operator()(const InstrKey& key) const { return std::hash<uint64_t>()(key.pc_warp * 0x9E3779B97F4A7C15ull ^ key.k); }
};

}  // namespace

class LaunchRecorder {
 public:
  LaunchRecorder(const LaunchInfo& info, int threads_per_block, bool profile, bool race)
      : profile_(profile), race_(race), threads_per_block_(threads_per_block) {
    c_.op = info.op;
    c_.kernel = info.kernel;
    c_.stream = info.stream;
    c_.grid = info.grid;
    c_.block = info.block;
    c_.dynamic_smem = info.smem;
    c_.threads = uint64_t{info.grid.x} * info.grid.y * info.grid.z * static_cast<uint64_t>(threads_per_block);
    c_.blocks = uint64_t{info.grid.x} * info.grid.y * info.grid.z;
    c_.global_counted = g_instrumented.load(std::memory_order_relaxed);
    for (const auto& [base, bytes] : device_allocations()) ranges_.emplace_back(base, base + bytes);
  }

  void global(uint64_t addr, size_t n, AccessKind kind, const void* pc) {
    if (!is_device(addr)) return;   // the fiber's stack, the launch's arguments, thread-local built-ins
    const uint64_t end = addr + n;
    for (uint64_t s = addr >> kSectorShift; s <= (end - 1) >> kSectorShift; ++s) {
      SectorBytes& b = sectors_[s];
      const uint32_t m = byte_mask(s, addr, end);
      (kind == AccessKind::Load ? b.read : kind == AccessKind::Store ? b.written : b.atomic) |= m;
    }
    if (profile_) lane_access(Space::Global, kind, addr, n, pc);
  }

  void shared(uint64_t offset, size_t n, AccessKind kind, const void* pc) {
    if (profile_) lane_access(Space::Shared, kind, offset, n, pc);
  }

  void barrier() { c_.barriers += static_cast<uint64_t>((threads_per_block_ + 31) / 32); }
  void count_warp_collective() { ++c_.warp_collectives; }

  // Folds the block's warp-level instructions into the counters.
  void block_end() {
    if (!profile_) return;
    const size_t n_instr = instrs_.size();
    std::vector<uint32_t> start(n_instr + 1, 0);
    for (const LaneAccess& a : accesses_) ++start[a.instr + 1];
    for (size_t i = 0; i < n_instr; ++i) start[i + 1] += start[i];
    std::vector<LaneAccess> sorted(accesses_.size());
    std::vector<uint32_t> lanes(accesses_.size());
    std::vector<uint32_t> fill(start.begin(), start.end() - 1);
    for (size_t i = 0; i < accesses_.size(); ++i) {
      const uint32_t at = fill[accesses_[i].instr]++;
      sorted[at] = accesses_[i];
      lanes[at] = lane_of_[i];
    }
    std::vector<uint64_t> secs;
    for (size_t i = 0; i < n_instr; ++i) {
      const LaneAccess* a = sorted.data() + start[i];
      const size_t n = start[i + 1] - start[i];
      const Instr in = instrs_[i];
      ++c_.mem_instructions;
      c_.active_lanes += n;
      if (in.space == Space::Shared) {
        const uint64_t wf = shared_wavefronts(a, lanes.data() + start[i], n);
        if (in.kind == AccessKind::Load) {
          ++c_.shared_ld_requests;
          c_.shared_ld_wavefronts += wf;
        } else {
          ++c_.shared_st_requests;
          c_.shared_st_wavefronts += wf;
        }
        continue;
      }
      secs.clear();
      uint64_t bytes = 0;
      for (size_t j = 0; j < n; ++j) {
        bytes += a[j].size;
        for (uint64_t s = a[j].addr >> kSectorShift; s <= (a[j].addr + a[j].size - 1) >> kSectorShift; ++s) {
          secs.push_back(s);
        }
      }
      std::sort(secs.begin(), secs.end());
      const auto distinct = static_cast<uint64_t>(std::unique(secs.begin(), secs.end()) - secs.begin());
      switch (in.kind) {
        case AccessKind::Load:
          ++c_.gld_requests;
          c_.gld_sectors += distinct;
          c_.gld_bytes += bytes;
          break;
        case AccessKind::Store:
          ++c_.gst_requests;
          c_.gst_sectors += distinct;
          c_.gst_bytes += bytes;
          break;
        case AccessKind::Atomic:
          ++c_.atomic_requests;
          c_.atomic_sectors += distinct;
          c_.atomics += n;
          break;
      }
    }
    accesses_.clear();
    lane_of_.clear();
    instrs_.clear();
    instr_index_.clear();
    executions_.clear();
  }

  void end(size_t static_smem) {
    c_.static_smem = static_smem;
    std::vector<std::pair<uint64_t, SectorBytes>> sorted(sectors_.begin(), sectors_.end());
    for (const auto& [s, b] : sorted) {
      c_.unique_sectors_read += (b.read | b.atomic) != 0;
      c_.unique_sectors_written += (b.written | b.atomic) != 0;
    }
    if (race_) {
      std::sort(sorted.begin(), sorted.end(), [](const auto& x, const auto& y) { return x.first < y.first; });
      note_bytes(sorted, &SectorBytes::read, AccessKind::Load);
      note_bytes(sorted, &SectorBytes::written, AccessKind::Store);
      note_bytes(sorted, &SectorBytes::atomic, AccessKind::Atomic);
    }
    if (profile_) {
      std::lock_guard<std::mutex> lock(g_profile_mu);
      store().push_back(std::move(c_));
    }
  }

 private:
  bool is_device(uint64_t a) {
    if (last_ < ranges_.size() && a >= ranges_[last_].first && a < ranges_[last_].second) return true;
    auto it = std::upper_bound(ranges_.begin(), ranges_.end(), a,
                               [](uint64_t v, const std::pair<uint64_t, uint64_t>& r) { return v < r.first; });
    if (it == ranges_.begin()) return false;
    --it;
    if (a >= it->second) return false;
    last_ = static_cast<size_t>(it - ranges_.begin());
    return true;
  }

  void lane_access(Space space, AccessKind kind, uint64_t addr, size_t n, const void* pc) {
    const auto thread = static_cast<uint64_t>(t_record_thread);
    const auto pcv = reinterpret_cast<uint64_t>(pc);
    const uint64_t k = executions_[pcv << 10 | thread]++;
    const InstrKey key{pcv << 5 | (thread >> 5), k};
    auto [it, added] = instr_index_.try_emplace(key, static_cast<uint32_t>(instrs_.size()));
    if (added) instrs_.push_back(Instr{space, kind});
    accesses_.push_back(LaneAccess{it->second, static_cast<uint32_t>(n), addr});
    lane_of_.push_back(static_cast<uint32_t>(thread & 31));
  }

  // Hands the race check the launch's bytes of one kind as merged ranges.
  static void note_bytes(const std::vector<std::pair<uint64_t, SectorBytes>>& sorted, uint32_t SectorBytes::*field,
                         AccessKind kind) {
    uint64_t run_begin = 0, run_end = 0;
    bool open = false;
    for (const auto& [s, b] : sorted) {
      const uint32_t m = b.*field;
      for (unsigned i = 0; i < 32 && m != 0; ++i) {
        if (((m >> i) & 1u) == 0) continue;
        const uint64_t a = (s << kSectorShift) + i;
        if (open && a == run_end) {
          ++run_end;
          continue;
        }
        if (open) race_note(reinterpret_cast<const void*>(run_begin), run_end - run_begin, kind);
        run_begin = a;
        run_end = a + 1;
        open = true;
      }
    }
    if (open) race_note(reinterpret_cast<const void*>(run_begin), run_end - run_begin, kind);
  }

  bool profile_, race_;
  int threads_per_block_;
  LaunchCounters c_;
  std::vector<std::pair<uint64_t, uint64_t>> ranges_;   // live device allocations [begin, end)
  size_t last_ = 0;
  std::unordered_map<uint64_t, SectorBytes> sectors_;
  // The running block's instructions.
  std::unordered_map<uint64_t, uint64_t> executions_;   // instruction address << 10 | thread -> times run
  std::unordered_map<InstrKey, uint32_t, InstrKeyHash> instr_index_;
  std::vector<Instr> instrs_;
  std::vector<LaneAccess> accesses_;
  std::vector<uint32_t> lane_of_;
};

void record_global(const void* p, size_t n, AccessKind kind, const void* pc) {
  if (LaunchRecorder* r = t_recorder; r != nullptr && n != 0) r->global(reinterpret_cast<uint64_t>(p), n, kind, pc);
}
void record_shared(size_t arena_offset, size_t n, AccessKind kind, const void* pc) {
  if (LaunchRecorder* r = t_recorder; r != nullptr && n != 0) r->shared(arena_offset, n, kind, pc);
}
void record_device_atomic(const void* p, size_t n, const void* pc) { record_global(p, n, AccessKind::Atomic, pc); }

namespace {
thread_local int t_replay_profiled = -1;   // -1: not a graph replay's node
}  // namespace

ReplayIssue::ReplayIssue(bool profiled) : before_(t_replay_profiled) { t_replay_profiled = profiled ? 1 : 0; }
ReplayIssue::~ReplayIssue() { t_replay_profiled = before_; }

void recorder_launch_begin(const LaunchInfo& info, int threads_per_block) {
  const bool profile = t_replay_profiled >= 0 ? t_replay_profiled == 1 : info.profiled;
  // Without the instrumented kernels a launch's global bytes are unknown to the race check.
  const bool race = g_instrumented.load(std::memory_order_relaxed) && race_check_wants_accesses();
  t_recorder = profile || race ? new LaunchRecorder(info, threads_per_block, profile, race) : nullptr;
}
void recorder_block_end() {
  if (t_recorder != nullptr) t_recorder->block_end();
}
void recorder_barrier() {
  if (t_recorder != nullptr) t_recorder->barrier();
}
void recorder_warp_collective() {
  if (t_recorder != nullptr) t_recorder->count_warp_collective();
}
void recorder_launch_end(size_t static_smem) {
  LaunchRecorder* r = std::exchange(t_recorder, nullptr);
  if (r == nullptr) return;
  r->end(static_smem);
  delete r;
}
void recorder_launch_abort() { delete std::exchange(t_recorder, nullptr); }

void mark_global_accesses_instrumented() { g_instrumented.store(true); }

void set_profiling(bool on) { g_profiling.store(on); }
bool profiling() { return g_profiling.load(); }
const std::vector<LaunchCounters>& profile() {
  synchronize_all();   // launches still queued in their streams count once they ran
  return store();
}
void clear_profile() {
  std::lock_guard<std::mutex> lock(g_profile_mu);
  store().clear();
}
bool global_accesses_instrumented() { return g_instrumented.load(); }

}  // namespace minidl::cuda::emu
