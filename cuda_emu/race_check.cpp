// The cross-stream race check (race_check.h): vector clocks over the streams' work, the byte ranges
// each piece of work touched, and the history of finished work that some stream may still race
// with. Work leaves the history once the host has waited for it and no queued work can run
// unordered with it; past kMaxHistory pieces of work the oldest are forgotten.
#include "cuda_emu/race_check.h"

#include <algorithm>
#include <cstdlib>
#include <deque>
#include <map>
#include <mutex>
#include <sstream>
#include <utility>
#include <vector>

#include "core/error.h"
#include "cuda_emu/runtime_state.h"

namespace minidl::cuda::emu {

// Per stream (by a number that is never reused, unlike a destroyed stream's handle), the last of
// its pieces of work ordered before the holder.
struct Clock {
  std::vector<std::pair<uint32_t, uint64_t>> at;   // sorted by stream number

  uint64_t get(uint32_t id) const {
    auto it = std::lower_bound(at.begin(), at.end(), id, [](const auto& p, uint32_t v) { return p.first < v; });
    return it != at.end() && it->first == id ? it->second : 0;
  }
  void set(uint32_t id, uint64_t v) {
    auto it = std::lower_bound(at.begin(), at.end(), id, [](const auto& p, uint32_t x) { return p.first < x; });
    if (it != at.end() && it->first == id) it->second = std::max(it->second, v);
    else at.insert(it, {id, v});
  }
  void join(const Clock& o) {
    for (const auto& [id, v] : o.at) set(id, v);
  }
};

namespace {

using Range = std::pair<uint64_t, uint64_t>;   // [begin, end) of device memory
constexpr size_t kMaxHistory = 4096;

void normalize(std::vector<Range>& r) {
  std::sort(r.begin(), r.end());
  size_t out = 0;
  for (const Range& x : r) {
    if (out > 0 && x.first <= r[out - 1].second) r[out - 1].second = std::max(r[out - 1].second, x.second);
    else r[out++] = x;
  }
  r.resize(out);
}

// The first bytes both sorted range lists hold, or an empty range.
Range first_overlap(const std::vector<Range>& a, const std::vector<Range>& b) {
  size_t i = 0, j = 0;
  while (i < a.size() && j < b.size()) {
    const uint64_t lo = std::max(a[i].first, b[j].first), hi = std::min(a[i].second, b[j].second);
    if (lo < hi) return {lo, hi};
    if (a[i].second < b[j].second) ++i;
    else ++j;
  }
  return {0, 0};
}

const char* past_verb(AccessKind k) {
  return k == AccessKind::Load ? "read" : k == AccessKind::Store ? "wrote" : "updated atomically";
}
const char* present_verb(AccessKind k) {
  return k == AccessKind::Load ? "reads" : k == AccessKind::Store ? "writes" : "updates atomically";
}

}  // namespace

struct RaceOp {
  uint32_t stream_id = 0;
  const void* stream = nullptr;
  uint64_t seq = 0;
  Clock clock;
  std::string label;
  std::vector<Range> ranges[3];   // by AccessKind: loads, stores, atomics
};

namespace {

struct StreamState {
  uint32_t id = 0;
  bool blocking = true;
  uint64_t issued = 0;
  Clock clock;                       // its work so far and all that work was ordered after
  std::deque<RaceOp*> pending;       // issued, not yet run, in stream order
};

struct State {
  std::mutex mu;
  bool on = [] {
    const char* s = std::getenv("MINIDL_EMU_RACE_CHECK");
    return s == nullptr || std::string(s) != "0";
  }();
  uint32_t next_id = 1;   // 0: the legacy default stream
  std::map<const void*, StreamState> streams;
  Clock host;             // the work the host has waited for
  std::deque<RaceOpPtr> history;
};
State& st() {
  static auto* s = new State();   // never destroyed: streams run at exit
  return *s;
}

thread_local RaceOp* t_current = nullptr;

StreamState& stream_locked(State& s, const void* handle) {
  auto [it, added] = s.streams.try_emplace(handle);
  if (added && handle != nullptr) it->second.id = s.next_id++;
  return it->second;
}

std::string stream_name(const void* handle, uint32_t id) {
  if (handle == nullptr) return "the legacy default stream";
  std::ostringstream os;
  os << "stream " << handle << " (#" << id << ")";
  return os.str();
}

// True when no work, queued or still to be issued, can run unordered with `op`.
bool settled_locked(const State& s, const RaceOp& op) {
  if (s.host.get(op.stream_id) < op.seq) return false;
  for (const auto& [handle, ss] : s.streams) {
    if (ss.id != op.stream_id && !ss.pending.empty() && ss.pending.front()->clock.get(op.stream_id) < op.seq) {
      return false;
    }
  }
  return true;
}

void prune_locked(State& s) {
  std::erase_if(s.history, [&](const RaceOpPtr& op) { return settled_locked(s, *op); });
  while (s.history.size() > kMaxHistory) s.history.pop_front();
}

std::string where_in_allocation(uint64_t lo, uint64_t hi) {
  std::ostringstream os;
  os << "bytes [" << lo << ", " << hi << ") (" << hi - lo << " bytes)";
  for (const auto& [base, bytes] : device_allocations()) {
    if (lo >= base && lo < base + bytes) {
      os << " at offset " << lo - base << " of the " << bytes << "-byte allocation at "
         << reinterpret_cast<const void*>(base);
      return os.str();
    }
  }
  return os.str() + " of memory that is no longer allocated";
}

// The report when `x` (running now) and `e` (already run) conflict, "" when they do not.
std::string conflict(const RaceOp& x, const RaceOp& e) {
  static constexpr AccessKind kinds[] = {AccessKind::Load, AccessKind::Store, AccessKind::Atomic};
  for (AccessKind kx : kinds) {
    for (AccessKind ke : kinds) {
      const bool both_read = kx == AccessKind::Load && ke == AccessKind::Load;
      const bool both_atomic = kx == AccessKind::Atomic && ke == AccessKind::Atomic;
      if (both_read || both_atomic) continue;
      const Range o = first_overlap(x.ranges[static_cast<int>(kx)], e.ranges[static_cast<int>(ke)]);
      if (o.first == o.second) continue;
      std::ostringstream os;
      os << "cross-stream race on the emulated device: " << x.label << " on " << stream_name(x.stream, x.stream_id)
         << " " << present_verb(kx) << " " << where_in_allocation(o.first, o.second) << ", which " << e.label
         << " on " << stream_name(e.stream, e.stream_id) << " " << past_verb(ke)
         << ", and no event or synchronization orders the two (on a GPU they may run at the same time): record an "
         << "event after the first (cudaEventRecord) and make the second's stream wait for it (cudaStreamWaitEvent)";
      return os.str();
    }
  }
  return "";
}

}  // namespace

void set_race_check(bool on) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  s.on = on;
  if (!on) s.history.clear();
}

bool race_check() {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  return s.on;
}

bool race_check_wants_accesses() { return t_current != nullptr; }

void race_note(const void* p, size_t n, AccessKind kind) {
  if (t_current == nullptr || n == 0) return;
  std::vector<Range>& r = t_current->ranges[static_cast<int>(kind)];
  const auto a = reinterpret_cast<uint64_t>(p);
  if (!r.empty() && r.back().second == a) r.back().second = a + n;
  else r.emplace_back(a, a + n);
}

void race_register_stream(const void* handle, bool blocking) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  StreamState& ss = stream_locked(s, handle);
  ss.blocking = blocking;
  ss.clock.join(s.host);
}

void race_forget_stream(const void* handle) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.streams.find(handle);
  if (it == s.streams.end()) return;
  s.host.join(it->second.clock);   // cudaStreamDestroy ran its work (streams.cpp)
  s.streams.erase(it);
  prune_locked(s);
}

RaceOpPtr race_issue(const void* handle, std::string label) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  if (!s.on) return nullptr;
  StreamState& ss = stream_locked(s, handle);
  // The legacy default stream waits for the blocking streams' earlier work, and they for its.
  if (handle == nullptr) {
    for (const auto& [other, os] : s.streams) {
      if (other != nullptr && os.blocking) ss.clock.join(os.clock);
    }
  } else if (ss.blocking) {
    ss.clock.join(stream_locked(s, nullptr).clock);
  }
  ss.clock.join(s.host);
  ss.clock.set(ss.id, ++ss.issued);
  auto op = std::make_shared<RaceOp>();
  op->stream_id = ss.id;
  op->stream = handle;
  op->seq = ss.issued;
  op->clock = ss.clock;
  op->label = std::move(label);
  ss.pending.push_back(op.get());
  return op;
}

ClockPtr race_stream_clock(const void* handle) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.streams.find(handle);
  return std::make_shared<const Clock>(it == s.streams.end() ? Clock{} : it->second.clock);
}

void race_stream_waits(const void* handle, const ClockPtr& c) {
  if (!c) return;
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  stream_locked(s, handle).clock.join(*c);
}

void race_host_waits(const ClockPtr& c) {
  if (!c) return;
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  s.host.join(*c);
  prune_locked(s);
}

void race_host_waits_stream(const void* handle) {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.streams.find(handle);
  if (it != s.streams.end()) s.host.join(it->second.clock);
  prune_locked(s);
}

void race_host_waits_all() {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  for (const auto& [handle, ss] : s.streams) s.host.join(ss.clock);
  prune_locked(s);
}

void race_drop_pending() {
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  for (auto& [handle, ss] : s.streams) ss.pending.clear();
  s.history.clear();
}

RaceScope::RaceScope(RaceOpPtr op) : op_(std::move(op)) { t_current = op_.get(); }

RaceScope::~RaceScope() {
  t_current = nullptr;
  if (!op_) return;
  State& s = st();
  std::lock_guard<std::mutex> lock(s.mu);
  auto it = s.streams.find(op_->stream);
  if (it == s.streams.end()) return;
  std::deque<RaceOp*>& q = it->second.pending;
  if (auto p = std::find(q.begin(), q.end(), op_.get()); p != q.end()) q.erase(p);
}

void RaceScope::finish() {
  t_current = nullptr;
  if (!op_) return;
  for (std::vector<Range>& r : op_->ranges) normalize(r);
  if (op_->ranges[0].empty() && op_->ranges[1].empty() && op_->ranges[2].empty()) return;
  std::string report;
  {
    State& s = st();
    std::lock_guard<std::mutex> lock(s.mu);
    if (!s.on) return;
    for (const RaceOpPtr& e : s.history) {
      if (e->stream_id == op_->stream_id) continue;
      if (op_->clock.get(e->stream_id) >= e->seq || e->clock.get(op_->stream_id) >= op_->seq) continue;
      report = conflict(*op_, *e);
      if (!report.empty()) break;
    }
    if (report.empty()) {
      s.history.push_back(op_);
      if (s.history.size() > kMaxHistory) prune_locked(s);
    }
  }
  if (!report.empty()) MINIDL_FAIL(report);
}

}  // namespace minidl::cuda::emu
