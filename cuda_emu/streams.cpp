// Stream order on the emulated device. In the deferred mode (the default; MINIDL_EMU_DEFER_STREAMS=0
// or set_deferred_streams(false) for the immediate one, where each piece of work runs when it is
// queued) work waits in its stream's queue until a synchronization point needs it
// (a stream, event or device synchronization, a synchronous copy, cudaFree, a cuBLAS / cuDNN call
// on the stream), so host code that reads results without synchronizing sees stale memory, and
// the runtime poisons the pinned destinations of pending device-to-host copies (ASan). Each piece of
// work runs under the race check (race_check.h) and a fault in it (a kernel's, or a race) becomes
// the device's sticky fault: the queues are dropped, as a faulted GPU context runs nothing more.
#include <cstdlib>
#include <exception>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "core/error.h"
#include "cuda_emu/race_check.h"
#include "cuda_emu/runtime_state.h"

namespace minidl::cuda::emu {
namespace {

struct Item {
  std::function<void()> work;   // empty for a wait
  StreamPos wait{};             // a wait: run `wait.stream` up to `wait.seq` first
  RaceOpPtr op;                 // the work's place in the race check's order
};

struct Queue {
  std::deque<Item> items;
  uint64_t queued = 0, done = 0;   // sequence numbers: items ever queued, items run
  bool blocking = true;            // synchronizes with the legacy default stream (not cudaStreamNonBlocking)
};

struct Executor {
  std::recursive_mutex mu;   // held while work runs: another host thread waits, as for a busy device
  std::map<const void*, Queue> queues;   // nullptr: the legacy default stream
  bool deferred = [] {
    const char* s = std::getenv("MINIDL_EMU_DEFER_STREAMS");
    return s == nullptr || std::string(s) != "0";
  }();
};
Executor& ex() {
  static Executor* e = new Executor();   // never destroyed: streams are used after main returns
  return *e;
}

void push(Queue& q, Item it) {
  q.items.push_back(std::move(it));
  ++q.queued;
}

// A fault in running work: the device is faulted and the queued work will never run.
void fault_locked(Executor& e, const std::string& what) {
  device_fault(what);
  for (auto& [s, q] : e.queues) {
    q.items.clear();
    q.done = q.queued;
  }
  race_drop_pending();
}

void run_item_locked(Executor& e, const std::function<void()>& work, RaceOpPtr op) {
  try {
    RaceScope scope(std::move(op));
    work();
    scope.finish();
  } catch (const std::exception& x) {
    fault_locked(e, x.what());
  } catch (...) {
    fault_locked(e, "device work threw an unknown exception");
  }
}

// Runs `s`'s queue up to sequence number `seq` (waits first run the stream they wait for).
void run_until_locked(Executor& e, const void* s, uint64_t seq) {
  auto it = e.queues.find(s);
  if (it == e.queues.end()) return;
  Queue& q = it->second;
  while (q.done < seq && !q.items.empty()) {
    Item item = std::move(q.items.front());
    q.items.pop_front();
    ++q.done;   // before running: work that throws is not run again
    if (item.work) run_item_locked(e, item.work, std::move(item.op));
    else run_until_locked(e, item.wait.stream, item.wait.seq);
  }
}

}  // namespace

bool deferred_streams() { return ex().deferred; }

void set_deferred_streams(bool on) {
  Executor& e = ex();
  std::lock_guard<std::recursive_mutex> lock(e.mu);
  synchronize_all();
  e.deferred = on;
}

void register_stream(cudaStream_t s, bool blocking) {
  Executor& e = ex();
  std::lock_guard<std::recursive_mutex> lock(e.mu);
  e.queues[s].blocking = blocking;
  race_register_stream(s, blocking);
}

void forget_stream(cudaStream_t s) {
  Executor& e = ex();
  std::lock_guard<std::recursive_mutex> lock(e.mu);
  synchronize_stream(s);   // pending work completes, as after cudaStreamDestroy on a GPU
  e.queues.erase(s);
  race_forget_stream(s);
}

cudaError_t enqueue(cudaStream_t s, std::function<void()> work, std::string label, bool capture) {
  Executor& e = ex();
  std::lock_guard<std::recursive_mutex> lock(e.mu);
  if (device_error() != cudaSuccess) return device_error();   // a faulted device runs nothing more
  bool captured = false;
  if (capture) {
    if (const cudaError_t c = capture_work(s, work, label, &captured); captured) return c;
  }
  RaceOpPtr op = race_issue(s, std::move(label));
  if (!e.deferred) {
    run_item_locked(e, work, std::move(op));
    return device_error();
  }
  Queue& q = e.queues[s];
  // The legacy default stream waits for the blocking streams' work so far, and they for it.
  if (s == nullptr) {
    for (auto& [other, oq] : e.queues) {
      if (other != nullptr && oq.blocking && oq.done < oq.queued) {
        push(q, Item{{}, StreamPos{other, oq.queued}, nullptr});
      }
    }
  } else if (q.blocking) {
    const Queue& legacy = e.queues[nullptr];
    if (legacy.done < legacy.queued) push(q, Item{{}, StreamPos{nullptr, legacy.queued}, nullptr});
  }
  push(q, Item{std::move(work), {}, std::move(op)});
  return cudaSuccess;
}

void run_now(cudaStream_t s, const std::function<void()>& work, std::string label) {
  Executor& e = ex();
  std::lock_guard<std::recursive_mutex> lock(e.mu);
  synchronize_stream(s);
  if (device_error() != cudaSuccess) return;
  run_item_locked(e, work, race_issue(s, std::move(label)));
}

StreamPos stream_tail(cudaStream_t s) {
  Executor& e = ex();
  std::lock_guard<std::recursive_mutex> lock(e.mu);
  auto it = e.queues.find(s);
  return StreamPos{s, it == e.queues.end() ? 0 : it->second.queued};
}

void enqueue_wait(cudaStream_t s, StreamPos p) {
  Executor& e = ex();
  std::lock_guard<std::recursive_mutex> lock(e.mu);
  if (!e.deferred || reached(p)) return;
  push(e.queues[s], Item{{}, p, nullptr});
}

bool reached(StreamPos p) {
  Executor& e = ex();
  std::lock_guard<std::recursive_mutex> lock(e.mu);
  auto it = e.queues.find(p.stream);
  return it == e.queues.end() || it->second.done >= p.seq;
}

void run_until(StreamPos p) {
  Executor& e = ex();
  std::lock_guard<std::recursive_mutex> lock(e.mu);
  run_until_locked(e, p.stream, p.seq);
}

void synchronize_stream(cudaStream_t s) { run_until(stream_tail(s)); }

void synchronize_all() {
  Executor& e = ex();
  std::lock_guard<std::recursive_mutex> lock(e.mu);
  for (auto& [s, q] : e.queues) run_until_locked(e, s, q.queued);
}

size_t pending_work(cudaStream_t s) {
  Executor& e = ex();
  std::lock_guard<std::recursive_mutex> lock(e.mu);
  auto it = e.queues.find(s);
  return it == e.queues.end() ? 0 : it->second.items.size();
}

}  // namespace minidl::cuda::emu
