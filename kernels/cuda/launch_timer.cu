// Per-launch event timing (launch_timer.cuh; the query API is in runtime.h). Events come from a
// free list, so a timed step creates none after its first launches; records are resolved only
// when take_launch_times() is called, so timing adds no host synchronisation to the step.
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/launch_timer.cuh"
#include "kernels/cuda/runtime.h"

namespace minidl::cuda {
namespace detail {
bool g_launch_timing = [] {
  const char* v = std::getenv("MINIDL_LAUNCH_TIMING");
  return v != nullptr && *v != '\0' && std::strcmp(v, "0") != 0;
}();
}  // namespace detail

// The host-function half of a gated launch (launch_timer.cuh). Both the host function and the timer
// hold the gate, so whichever finishes last frees it, whether or not the wait timed out.
struct LaunchGate {
  std::atomic<bool> open{false};
  const char* op = "";   // named when the gate times out
};

namespace {

bool g_launch_gating = false;
std::atomic<size_t> g_gate_timeouts{0};
// A gate still shut after this long is opened anyway and counted (launch_gate_timeouts): a call
// that synchronises with the stream inside a timed launch (an allocator's cudaFree, cuDNN's autotuning
// on a shape's first call) would otherwise wait for itself.
constexpr auto kGateTimeout = std::chrono::milliseconds(500);

void CUDART_CB wait_for_gate(void* p) {
  auto* held = static_cast<std::shared_ptr<LaunchGate>*>(p);
  const auto t0 = std::chrono::steady_clock::now();
  while (!(*held)->open.load(std::memory_order_acquire)) {
    if (std::chrono::steady_clock::now() - t0 > kGateTimeout) {
      if (g_gate_timeouts.fetch_add(1) < 8)
        std::fprintf(stderr,
                     "minidl: the launch gate of '%s' opened by its timeout (%lld ms): something inside the call "
                     "waited for the stream\n",
                     (*held)->op, static_cast<long long>(kGateTimeout.count()));
      break;
    }
    std::this_thread::yield();
  }
  delete held;
}

using Clock = std::chrono::steady_clock;

struct Record {
  const char* op;
  const char* kernel;
  cudaEvent_t start;
  cudaEvent_t stop;
  Clock::time_point host_start{};   // after the start event's record: the call's own host time
  double host_ms = 0.0;
};

struct Timings {
  std::mutex mu;
  std::vector<Record> records;
  std::vector<cudaEvent_t> free_events;
  cudaEvent_t take_event() {
    if (!free_events.empty()) {
      cudaEvent_t e = free_events.back();
      free_events.pop_back();
      return e;
    }
    cudaEvent_t e = nullptr;
    MINIDL_CUDA_CHECK(cudaEventCreate(&e));
    return e;
  }
};
Timings& timings() {
  static auto* t = new Timings();   // never destroyed: launches may run during static destruction
  return *t;
}

}  // namespace

ScopedLaunchTimer::ScopedLaunchTimer(const char* op, const char* kernel, cudaStream_t stream) {
  if (!launch_timing_on()) return;
  Timings& t = timings();
  std::lock_guard<std::mutex> lock(t.mu);
  Record r{op, kernel, t.take_event(), t.take_event()};
  // The emulated cuDNN and cuBLAS compute inside the call, after running the stream's queued work
  // (the gate among it): a gate before them would wait for the call itself. Their times on the
  // emulator are the host's anyway.
#ifdef MINIDL_CUDA_EMU
  const bool gate = g_launch_gating && *kernel != '\0';
#else
  const bool gate = g_launch_gating;
#endif
  if (gate) {
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    MINIDL_CUDA_CHECK(cudaStreamIsCapturing(stream, &st));
    if (st == cudaStreamCaptureStatusNone) {   // a captured host function would hold every replay
      gate_ = std::make_shared<LaunchGate>();
      gate_->op = op;
      auto* held = new std::shared_ptr<LaunchGate>(gate_);
      const cudaError_t e = cudaLaunchHostFunc(stream, wait_for_gate, held);
      if (e != cudaSuccess) {
        delete held;
        gate_.reset();
        MINIDL_CUDA_CHECK(e);
      }
    }
  }
  MINIDL_CUDA_CHECK(cudaEventRecord(r.start, stream));
  slot_ = static_cast<long>(t.records.size());
  stream_ = stream;
  r.host_start = Clock::now();
  t.records.push_back(r);
}

ScopedLaunchTimer::~ScopedLaunchTimer() {
  if (slot_ < 0) return;
  const Clock::time_point host_end = Clock::now();
  Timings& t = timings();
  std::lock_guard<std::mutex> lock(t.mu);
  if (static_cast<size_t>(slot_) < t.records.size()) {   // take_launch_times() may have run in between
    Record& r = t.records[static_cast<size_t>(slot_)];
    r.host_ms = std::chrono::duration<double, std::milli>(host_end - r.host_start).count();
    MINIDL_CUDA_LOG(cudaEventRecord(r.stop, stream_));
  }
  if (gate_) gate_->open.store(true, std::memory_order_release);   // after the stop event's record
}

void set_launch_timing(bool on) { detail::g_launch_timing = on; }
bool launch_timing() { return detail::g_launch_timing; }
void set_launch_gating(bool on) { g_launch_gating = on; }
bool launch_gating() { return g_launch_gating; }
size_t launch_gate_timeouts() { return g_gate_timeouts.load(); }

std::vector<LaunchTime> take_launch_times() {
  Timings& t = timings();
  std::lock_guard<std::mutex> lock(t.mu);
  std::vector<LaunchTime> out;
  out.reserve(t.records.size());
  for (const Record& r : t.records) {
    float ms = 0.0f;
    MINIDL_CUDA_CHECK(cudaEventSynchronize(r.stop));
    MINIDL_CUDA_CHECK(cudaEventElapsedTime(&ms, r.start, r.stop));
    out.push_back({r.op, r.kernel, static_cast<double>(ms), r.host_ms});
    t.free_events.push_back(r.start);
    t.free_events.push_back(r.stop);
  }
  t.records.clear();
  return out;
}

}  // namespace minidl::cuda
