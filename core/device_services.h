// The device services every backend provides beside its kernels: the allocator, synchronisation,
// page-locked host memory and host->device copies. data/ and the allocator statistics need only
// these; the op contracts (core/backend.h) extend them per device type.
#pragma once
#include <cstddef>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/tensor.h"

namespace minidl {

class DeviceServices {
 public:
  virtual ~DeviceServices() = default;
  virtual const char* name() const = 0;
  // Every byte of tensor memory on device `device_index` (core/allocator.h: statistics, budget).
  virtual Allocator& allocator(int device_index) = 0;

  // Blocks until the work queued so far on the device is done. Timings of device work read a host
  // clock only after it (kernels are asynchronous on a GPU). The CPU's kernels return when done:
  // nothing to wait for.
  virtual void synchronize(int /*device_index*/) {}

  // Page-locked host memory for batches that go to this backend's device (data::Loader), so the
  // host->device copy can run asynchronously. nullptr by default: no pinned memory here, and the
  // caller uses ordinary memory. Memory from pinned_alloc goes back through pinned_free.
  virtual void* pinned_alloc(size_t /*bytes*/) { return nullptr; }
  virtual void pinned_free(void* /*p*/) {}

  // A host->device copy started by copy_async. This base class is a copy that has already
  // completed (the default's); a backend with asynchronous copies overrides both methods,
  // and its destructor orders this device's compute stream after the copy when nobody waited, so
  // dropping a copy in flight cannot let the allocator hand its destinations out early.
  class CopyHandle {
   public:
    virtual ~CopyHandle() = default;
    // Work queued on the device's compute stream after this call sees the copied bytes (no host wait).
    virtual void make_compute_wait() {}
    // Blocks the calling thread until the copy is done: its host sources may be written again.
    virtual void host_wait() {}
  };
  // Copies the bytes at src[i] (host memory, from pinned_alloc when the copy is to be asynchronous)
  // into dst[i] (contiguous, on this backend's device), ordered after the work queued so far on the
  // device's compute stream. The CUDA backend queues the copies on a copy stream and returns at
  // once (kernels/cuda/pinned.cu). The default, for host memory, copies now and returns a handle
  // that is already complete.
  virtual std::unique_ptr<CopyHandle> copy_async(const std::vector<std::pair<const void*, Tensor>>& copies);

  // CUDA graphs (kernels/cuda/graph.cu): capture_graph runs `work` with the device's stream
  // captured into a graph, its memory served by a private pool of the caching allocator, and
  // returns it instantiated; replay() queues it on the stream again; destroying it releases the
  // graph and its pool. Work that CUDA forbids during a capture (a synchronization, a host read)
  // throws, naming the fix. The default throws: only a CUDA device has graphs.
  // `share_pool`: a live graph of the same device whose pool this capture allocates from too
  // (PyTorch's graph pool sharing), so that graphs that only ever replay one after the other on the
  // stream (an accumulation window's micro-batches) hold their temporaries once. Memory the first
  // graph's capture freed may then be written by the second's replay: the outputs of either are
  // valid only until the next replay of any graph on the pool.
  class Graph {
   public:
    virtual ~Graph() = default;
    virtual void replay() = 0;
    virtual size_t pool_bytes() const = 0;   // the private pool's reserved bytes
    virtual int pool() const { return 0; }   // the backend's id of the private pool
    // Eager work between replays, its memory served from the private pool, whose blocks hold
    // nothing a replay reads until the next replay (CachingAllocator::begin_lending; `resume`: on
    // with the last lending after a pause). end_lending returns whether the graphs on the pool may
    // replay again: when not, a replay would write over a tensor the work left there, or into
    // segments given back for it, and the caller drops them. Without a pool: nothing to lend.
    virtual void begin_lending(bool /*resume*/) const {}
    virtual bool end_lending() const { return true; }
  };
  virtual std::unique_ptr<Graph> capture_graph(int device_index, const std::function<void()>& work,
                                               const Graph* share_pool = nullptr);
  // Draws now the workspaces the device's libraries hold for the life of the process (cuBLAS's, from
  // the allocator), instead of at the first call that needs one. A run (and each trial of
  // minidl-maxbatch) draws them before it makes its model, so the first run of a process places
  // its blocks as every later run and trial does: drawn mid-step, the workspace would take room a
  // later step finds taken, and the first step would differ. May throw OutOfMemoryError.
  virtual void draw_library_workspaces(int /*device_index*/) {}
  // Gives those workspaces back to the allocator when they are all it holds (no tensor, no graph),
  // and says whether it did; the next draw (or first call) makes them again. What lets a process
  // that has run once choose another allocator mode (set_expandable_segments) for its next run.
  virtual bool release_library_workspaces(int /*device_index*/) { return false; }

  // Whether the device's stream is being captured now (ops that read device values on the host
  // skip those reads then).
  virtual bool capturing(int /*device_index*/) { return false; }

  // The time the device spends on intervals of queued work (CUDA events around each step: the
  // "GPU busy" column when NVML is absent). start() and stop() queue markers without waiting;
  // elapsed_seconds() waits for them and sums the closed intervals.
  class IntervalTimer {
   public:
    virtual ~IntervalTimer() = default;
    virtual void start() = 0;
    virtual void stop() = 0;
    virtual double elapsed_seconds() = 0;
  };
  // A timer on device `device_index`, or nullptr with the reason in `why` (the default: this
  // device has none; a CUDA device without a usable runtime says so).
  virtual std::unique_ptr<IntervalTimer> interval_timer(int device_index, std::string* why);
};

}  // namespace minidl
