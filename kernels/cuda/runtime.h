// Host-side entry points of the CUDA backend that the rest of minidl (and tests, benchmarks and
// users) may call from plain C++: device discovery (any runtime error, e.g. an old driver, means no
// device) and the global switches. Only CUDA builds link these (guard with MINIDL_WITH_CUDA);
// EventTimer alone has inline stubs for builds without CUDA, so the harness can ask it anywhere.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/backend.h"
#include "core/error.h"
#include "kernels/caching_allocator.h"

namespace minidl::cuda {

int device_count();            // 0 on any error
std::string runtime_status();  // "2 devices" or the runtime's error string

// The CUDA backend object (its first use creates the device context).
Backend& cuda_backend();

// cuDNN algorithm choice, as torch.backends.cudnn.benchmark: false (default) asks cuDNN's
// heuristics (cudnnGet*_v7); true times the candidates once per shape (cudnnFind*Ex) and caches
// the fastest that fits the memory budget. Autotuning may pick algorithms with big workspaces.
void set_cudnn_benchmark(bool on);
bool cudnn_benchmark();
// Only the convolution algorithms cuDNN reports as deterministic, as
// torch.backends.cudnn.deterministic (default off): some of the fastest backward algorithms add
// with atomics, so two runs of the same step differ in the last bits. Bit-for-bit comparisons on
// a GPU (eager against a replayed CUDA graph, two runs of a seed) need it on.
void set_cudnn_deterministic(bool on);
bool cudnn_deterministic();
// How many times autotuning (set_cudnn_benchmark) runs cuDNN's Find on a shape, each algorithm
// keeping its fastest time (kernels/cuda/conv.cu, autotune): the first run of an algorithm in a
// process also loads its kernels. Default 1, or MINIDL_CUDNN_FIND_TRIALS; at least 1. Two trials
// changed nothing measurable on an H200 (lab/results/bench/gpu_repeat_2026-11-26_ab67ceb.md: six
// processes, 6020-6024 images/s either way) and cost 2.4 s of warm-up: a switch for a GPU whose
// processes disagree, not a default.
void set_cudnn_find_trials(int n);
int cudnn_find_trials();
// TF32 tensor cores for f32 work, as torch.backends.{cuda.matmul,cudnn}.allow_tf32
// (defaults as PyTorch: off for GEMM, on for convolutions).
void set_allow_tf32_matmul(bool on);
bool allow_tf32_matmul();
void set_allow_tf32_cudnn(bool on);
bool allow_tf32_cudnn();
// NHWC cuDNN convolutions on NCHW tensors: the backend transposes into and out of NHWC around
// every call (the "before" of lab/results/bench/gpu_model_2026-11-26_60d57e3.md). Superseded by
// channels-last tensors (to_channels_last, Module::to_channels_last), which run NHWC with no
// transposes whatever this switch says; kept to measure the transposing design.
void set_conv_nhwc(bool on);
bool conv_nhwc();

// Blocks per channel (or per channel tile, channels-last) of the fused batch-norm kernels'
// reductions (batch_norm_act.cu). 0, the default, sizes them to fill the GPU; tests force several
// on small tensors so the cross-block sums run on the emulated device.
void set_batch_norm_split(int blocks);
int batch_norm_split();
// The widest access of the batch-norm kernels on channels-last rows, in bytes: 8 (4 f16 channels
// a thread) or 16 (8: the f16 row kernels then use 66-111 registers, 2-3 resident blocks an SM).
// 0 restores the default, MINIDL_CUDA_BN_ROWS_BYTES when set (8 or 16), else 8: on an H100 the
// 8-byte kernels took 3.1 ms less of a ResNet-50 AMP step at batch 256 than the 16-byte ones
// (lab/results/bench/gpu_check_2026-11-26_d10cebe.md). Planar (NCHW) kernels always take 16.
void set_batch_norm_rows_bytes(int bytes);
int batch_norm_rows_bytes();
// The elements per access the batch-norm kernels take for x (a CUDA tensor) under the switches
// above: what the tests check the width rules with.
int batch_norm_access_width(const Tensor& x);
// The pooling kernels divide their indices with FastDiv (32-bit multiply-high) when every index
// and window bound stays below 2^30, and with 64-bit '/' otherwise. Tests force the wide path on
// small tensors; default off.
void set_pool_wide_index(bool on);
bool pool_wide_index();
// Channels-last max pooling takes V channels a thread (16-byte accesses) when the channels are a
// multiple of V and the tensors 16-byte aligned; off, one channel a thread. Tests compare the two
// (the same bits); default on.
void set_vector_pool(bool on);
bool vector_pool();
// The step-time model (perfmodel/) profiles a step at small sizes on the emulated device and
// extrapolates its counters to the target size. A launch whose grid a host heuristic sizes from
// the work (the batch-norm reductions' blocks per channel, capped by the vectors each thread
// walks) would be planned for the small size, and its block count, which no polynomial in the
// batch carries past the cap, extrapolated wrong. The plan scale tells those heuristics the work
// is this many times larger, so they plan the target's grid (the extra blocks find less work at
// the small size). 1, the default, plans for the real size. Nothing else reads it.
void set_launch_plan_scale(double scale);
double launch_plan_scale();

// Waits for all work queued on the device's stream.
void synchronize(int device = 0);
// The caching allocator's full statistics (fragmentation, segments, cudaMalloc calls).
CachingStats caching_stats(int device = 0);
// The convolutions' per-shape plans (conv.cu: cuDNN's algorithms in the order they are tried,
// with their workspaces; both modes, keyed by the switches too; the fused convolution + batch-norm
// graphs' too): how many, and clearing them.
size_t conv_algo_cache_size();
void clear_conv_algo_cache();
// "NVIDIA H100 80GB HBM3, cc 9.0, 132 SMs, driver 13000, runtime 13000"
std::string device_description(int device = 0);

// Per-launch GPU times (kernels/cuda/launch_timer.cu), to calibrate the H100 step-time model
// (docs/cuda/perfmodel.md): while on (MINIDL_LAUNCH_TIMING=1 sets it at start-up),
// every kernel launch, cuBLAS GEMM and cuDNN convolution records a CUDA event pair on its stream.
// take_launch_times() waits for them and returns the launches since the last call, in launch
// order: `op` is MINIDL_LAUNCH's op ("batch_norm apply") or the library call ("cuDNN conv
// forward"), `kernel` the launched kernel's text ("(apply_kernel<T>)", "" for a library call),
// `ms` its GPU time, `host_ms` the host's time inside the launch or library call (what an eager
// step pays on the host for it, beside minidl's own work between calls).
struct LaunchTime {
  std::string op, kernel;
  double ms = 0.0;
  double host_ms = 0.0;
};
void set_launch_timing(bool on);
bool launch_timing();
std::vector<LaunchTime> take_launch_times();
// Gated timing (kernels/cuda/launch_timer.cuh): each timed launch waits on the GPU until the host has
// enqueued it, so `ms` is the GPU's time even where the host, not the GPU, sets an eager step's
// pace (library calls); the gaps make the step itself slower, so time its wall in other steps.
// A gate the host does not open within 0.5 s (a sync inside a timed call) opens itself and is
// counted by launch_gate_timeouts() (since the process started): its launch's time is not the GPU's.
void set_launch_gating(bool on);
bool launch_gating();
size_t launch_gate_timeouts();

// Host->device copies of the data loader's batches from page-locked memory (Backend::pinned_alloc)
// on a dedicated copy stream per device, so the transfer of the next batch overlaps the compute
// stream's work (kernels/cuda/pinned.cu). One object is one set of copies in flight.
class AsyncCopy {
 public:
  // Queues dst[i] = bytes of src[i] (pinned host memory; dst contiguous, all on one CUDA device) on
  // the copy stream, ordered after the compute stream's work queued so far (the destination's
  // memory, fresh from the caching allocator, may have been in use there). Returns at once.
  static std::unique_ptr<AsyncCopy> start(const std::vector<std::pair<const void*, Tensor>>& copies);
  ~AsyncCopy();   // makes the compute stream wait first, so dropping a copy in flight is safe
  AsyncCopy(const AsyncCopy&) = delete;
  AsyncCopy& operator=(const AsyncCopy&) = delete;
  // Work queued on the compute stream after this call sees the copied data (no host wait).
  void make_compute_wait();
  // Blocks the calling thread until the copies are done: their pinned sources may be reused.
  void host_wait();

 private:
  AsyncCopy() = default;
  int device_ = 0;
  void* done_ = nullptr;   // cudaEvent_t recorded on the copy stream after the copies
  bool compute_waits_ = false;
};

// Busy time of a device's compute stream from CUDA events, the utilization study's fallback when
// NVML is missing: an event pair recorded on the stream around each training step; the GPU time
// between each pair, summed, over the wall time is the busy fraction. A step's span counts the
// stream's idle gaps inside the step (kernel-launch latency, host syncs such as loss.item()) as
// busy, so it is an upper bound of NVML's figure; time between steps (data wait) counts as idle.
// It is the CUDA backend's interval timer (Backend::interval_timer).
class EventTimer final : public DeviceServices::IntervalTimer {
 public:
  // Whether event timing works on `device` (a CUDA build and a usable device); `why` gets the
  // reason when not. Never throws.
  static bool available(int device, std::string* why = nullptr);
  explicit EventTimer(int device = 0);   // throws when !available(device)
  ~EventTimer() override;
  EventTimer(const EventTimer&) = delete;
  EventTimer& operator=(const EventTimer&) = delete;
  // Records the start / end event of one interval on the device's stream (no host wait). A start
  // without an end is ignored by elapsed_seconds().
  void start() override;
  void stop() override;
  // Waits for the recorded events and returns the summed GPU time of the closed intervals.
  double elapsed_seconds() override;
  int64_t intervals() const { return intervals_; }

 private:
  struct Interval {
    void* begin = nullptr;   // cudaEvent_t
    void* end = nullptr;
    bool closed = false;
  };
  void resolve(size_t keep);   // folds all but the newest `keep` closed intervals into done_seconds_
  int device_ = 0;
  std::vector<Interval> open_;   // in recording order; only the last may be still open
  std::vector<Interval> free_;   // recycled event pairs
  double done_seconds_ = 0.0;
  int64_t intervals_ = 0;
};

#ifndef MINIDL_WITH_CUDA
// A build without CUDA: no device, so no event timing (the harness leaves the busy column empty).
inline bool EventTimer::available(int, std::string* why) {
  if (why != nullptr) *why = "this build has no CUDA backend";
  return false;
}
inline EventTimer::EventTimer(int device) : device_(device) {
  MINIDL_FAIL("cuda::EventTimer: this build of minidl has no CUDA backend; check EventTimer::available() first");
}
inline EventTimer::~EventTimer() = default;
inline void EventTimer::start() {}
inline void EventTimer::stop() {}
inline double EventTimer::elapsed_seconds() { return 0.0; }
inline void EventTimer::resolve(size_t) {}
#endif

}  // namespace minidl::cuda
