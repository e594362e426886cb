// Per-launch event timing (launch_timer.cuh; the query API is in runtime.h). Events come from a
// free list, so a timed step creates none after its first launches; records are resolved only
// when take_launch_times() is called, so timing adds no host synchronisation to the step.
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
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

namespace {

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
}

void set_launch_timing(bool on) { detail::g_launch_timing = on; }
bool launch_timing() { return detail::g_launch_timing; }

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
