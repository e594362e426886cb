// Stream capture and CUDA graphs on the emulated device, so that graph replay is tested in CI: work
// queued on a capturing stream (kernels with their arguments copied, copies, memsets, event records,
// the cuBLAS / cuDNN stand-ins' computations) is recorded instead of run, and cudaGraphLaunch queues
// the recorded work on a stream again, where it runs with every check eager work gets (bounds,
// races, sticky faults). What CUDA forbids during a capture fails as it does there, naming the fix.
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "cuda_emu/profiler.h"
#include "cuda_emu/runtime_state.h"

namespace minidl::cuda::emu {
namespace {

struct Node {
  std::function<void()> work;
  std::string label;
};
using Nodes = std::vector<Node>;

struct EmuGraph {
  std::shared_ptr<const Nodes> nodes;
};
struct EmuGraphExec {
  std::shared_ptr<const Nodes> nodes;   // shared with the graph: instantiation copies no work
};

struct Capture {
  cudaStreamCaptureMode mode = cudaStreamCaptureModeGlobal;
  std::thread::id thread;
  bool blocking = true;
  std::string invalidated;   // why, once an illegal call invalidated it ("" while valid)
  Nodes nodes;
};

struct CaptureState {
  std::mutex mu;
  std::map<const void*, Capture> captures;   // by stream
  std::set<const void*> graphs, execs;
};
CaptureState& cs() {
  static auto* c = new CaptureState();   // never destroyed: graphs may be destroyed after main returns
  return *c;
}

// The thread's capture interaction mode (cudaThreadExchangeStreamCaptureMode).
thread_local cudaStreamCaptureMode t_mode = cudaStreamCaptureModeGlobal;

// Whether CUDA forbids a potentially unsafe call on this thread now: the thread is not relaxed and
// it runs a capture that is not relaxed, or another thread runs a global one.
bool unsafe_forbidden_locked(CaptureState& c) {
  if (t_mode == cudaStreamCaptureModeRelaxed) return false;
  const auto me = std::this_thread::get_id();
  for (const auto& [s, cap] : c.captures) {
    if (cap.thread == me ? cap.mode != cudaStreamCaptureModeRelaxed : cap.mode == cudaStreamCaptureModeGlobal) {
      return true;
    }
  }
  return false;
}

void invalidate_locked(Capture& cap, const std::string& why) {
  if (cap.invalidated.empty()) cap.invalidated = why;
}

const char* kSyncFix =
    "a capture records work and runs none of it, so nothing can be waited for or read back: keep the value on the "
    "device (a device-side flag instead of a host read, as the gradient scaler's found_inf), or move the "
    "synchronization out of the captured region (before cudaStreamBeginCapture or after cudaGraphLaunch)";

// A graph or an executable graph: a heap object whose address is the handle, kept in a registry.
template <typename T>
cudaError_t destroy_object(std::set<const void*> CaptureState::*registry, const void* handle, const char* call) {
  CaptureState& c = cs();
  std::lock_guard<std::mutex> lock(c.mu);
  if ((c.*registry).erase(handle) == 0) return runtime_fail(cudaErrorInvalidValue, std::string(call) + ": not live");
  delete static_cast<const T*>(handle);
  return device_error();
}

}  // namespace

bool stream_capturing(cudaStream_t s) {
  CaptureState& c = cs();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.captures.count(s) != 0;
}

cudaError_t capture_work(cudaStream_t s, const std::function<void()>& work, const std::string& label, bool* taken) {
  *taken = false;
  CaptureState& c = cs();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.captures.empty()) return cudaSuccess;
  auto it = c.captures.find(s);
  if (it == c.captures.end()) {
    if (s != nullptr) return cudaSuccess;
    // The legacy default stream would wait for a capturing blocking stream's work: CUDA refuses.
    for (auto& [other, cap] : c.captures) {
      if (!cap.blocking) continue;
      const std::string why = (label.empty() ? std::string("work") : label) +
                              " on the legacy default stream while blocking stream " +
                              std::to_string(reinterpret_cast<uintptr_t>(other)) +
                              " is capturing (it would depend on captured work): capture on a stream created with "
                              "cudaStreamNonBlocking, or queue this work on the capturing stream";
      invalidate_locked(cap, why);
      *taken = true;
      return runtime_fail(cudaErrorStreamCaptureImplicit, why);
    }
    return cudaSuccess;
  }
  *taken = true;
  Capture& cap = it->second;
  if (!cap.invalidated.empty()) {
    return runtime_fail(cudaErrorStreamCaptureInvalidated,
                        (label.empty() ? std::string("work") : label) +
                            " queued on a capture that an earlier call invalidated (" + cap.invalidated + ")");
  }
  cap.nodes.push_back(Node{work, label});
  return cudaSuccess;
}

cudaError_t capture_forbids(const char* call) {
  CaptureState& c = cs();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.captures.empty() || !unsafe_forbidden_locked(c)) return cudaSuccess;
  const std::string why = std::string(call) +
                          " during a stream capture in cudaStreamCaptureModeGlobal (CUDA forbids potentially unsafe "
                          "calls while one is under way): " +
                          (std::string(call).find("alloc") != std::string::npos ||
                                   std::string(call).find("Free") != std::string::npos
                               ? "allocate before the capture (warm-up steps), or from a caching allocator that "
                                 "switches the thread to cudaStreamCaptureModeRelaxed around cudaMalloc "
                                 "(cudaThreadExchangeStreamCaptureMode), as PyTorch's does"
                               : kSyncFix);
  for (auto& [s, cap] : c.captures) invalidate_locked(cap, why);
  return runtime_fail(cudaErrorStreamCaptureUnsupported, why);
}

cudaError_t capture_forbids_on(const char* call, cudaStream_t s) {
  {
    CaptureState& c = cs();
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.captures.find(s);
    if (it != c.captures.end()) {
      const std::string why = std::string(call) + " on a capturing stream: " + kSyncFix;
      invalidate_locked(it->second, why);
      return runtime_fail(cudaErrorStreamCaptureUnsupported, why);
    }
  }
  return capture_forbids(call);
}

cudaError_t capture_refuse(cudaStream_t s, const std::string& why) {
  CaptureState& c = cs();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.captures.find(s);
  if (it == c.captures.end()) return cudaSuccess;
  invalidate_locked(it->second, why);
  return runtime_fail(cudaErrorStreamCaptureUnsupported, why);
}

}  // namespace minidl::cuda::emu

using namespace minidl::cuda::emu;   // NOLINT: the C entry points below are the runtime's

extern "C" {

cudaError_t cudaStreamBeginCapture(cudaStream_t s, cudaStreamCaptureMode mode) {
  MINIDL_EMU_STICKY();
  if (s == nullptr) {
    return runtime_fail(cudaErrorStreamCaptureUnsupported,
                        "cudaStreamBeginCapture: the legacy default stream cannot be captured; capture on a stream "
                        "of your own (cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking))");
  }
  if (!stream_live(s)) return runtime_fail(cudaErrorInvalidResourceHandle, "cudaStreamBeginCapture: not a live stream");
  if (mode != cudaStreamCaptureModeGlobal && mode != cudaStreamCaptureModeThreadLocal &&
      mode != cudaStreamCaptureModeRelaxed) {
    return runtime_fail(cudaErrorInvalidValue, "cudaStreamBeginCapture: mode is not a cudaStreamCaptureMode");
  }
  unsigned flags = 0;
  cudaStreamGetFlags(s, &flags);
  CaptureState& c = cs();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.captures.count(s) != 0) {
    return runtime_fail(cudaErrorIllegalState, "cudaStreamBeginCapture: the stream is already capturing");
  }
  Capture& cap = c.captures[s];
  cap.mode = mode;
  cap.thread = std::this_thread::get_id();
  cap.blocking = (flags & cudaStreamNonBlocking) == 0;
  return cudaSuccess;
}

cudaError_t cudaStreamEndCapture(cudaStream_t s, cudaGraph_t* graph) {
  if (graph == nullptr) return runtime_fail(cudaErrorInvalidValue, "cudaStreamEndCapture: NULL graph");
  *graph = nullptr;
  CaptureState& c = cs();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.captures.find(s);
  if (it == c.captures.end()) {
    return runtime_fail(cudaErrorIllegalState, "cudaStreamEndCapture: the stream is not capturing");
  }
  Capture cap = std::move(it->second);
  c.captures.erase(it);
  if (!cap.invalidated.empty()) {
    return runtime_fail(cudaErrorStreamCaptureInvalidated,
                        "cudaStreamEndCapture: the capture was invalidated by " + cap.invalidated);
  }
  if (const cudaError_t e = device_error(); e != cudaSuccess) return e;
  auto* g = new EmuGraph{std::make_shared<const Nodes>(std::move(cap.nodes))};
  c.graphs.insert(g);
  *graph = reinterpret_cast<cudaGraph_t>(g);
  return cudaSuccess;
}

cudaError_t cudaStreamIsCapturing(cudaStream_t s, cudaStreamCaptureStatus* status) {
  if (status == nullptr) return runtime_fail(cudaErrorInvalidValue, "cudaStreamIsCapturing: NULL");
  if (!stream_live(s)) return runtime_fail(cudaErrorInvalidResourceHandle, "cudaStreamIsCapturing: not a live stream");
  CaptureState& c = cs();
  std::lock_guard<std::mutex> lock(c.mu);
  auto it = c.captures.find(s);
  *status = it == c.captures.end()               ? cudaStreamCaptureStatusNone
            : it->second.invalidated.empty()     ? cudaStreamCaptureStatusActive
                                                 : cudaStreamCaptureStatusInvalidated;
  return cudaSuccess;
}

cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode* mode) {
  if (mode == nullptr) return runtime_fail(cudaErrorInvalidValue, "cudaThreadExchangeStreamCaptureMode: NULL");
  std::swap(*mode, t_mode);
  return cudaSuccess;
}

cudaError_t cudaGraphInstantiate(cudaGraphExec_t* exec, cudaGraph_t graph, unsigned long long) {
  MINIDL_EMU_STICKY();
  if (exec == nullptr) return runtime_fail(cudaErrorInvalidValue, "cudaGraphInstantiate: NULL");
  CaptureState& c = cs();
  std::lock_guard<std::mutex> lock(c.mu);
  if (c.graphs.count(graph) == 0) return runtime_fail(cudaErrorInvalidValue, "cudaGraphInstantiate: not a live graph");
  auto* x = new EmuGraphExec{reinterpret_cast<EmuGraph*>(graph)->nodes};
  c.execs.insert(x);
  *exec = reinterpret_cast<cudaGraphExec_t>(x);
  return cudaSuccess;
}

cudaError_t cudaGraphLaunch(cudaGraphExec_t exec, cudaStream_t s) {
  MINIDL_EMU_STICKY();
  if (!stream_live(s)) return runtime_fail(cudaErrorInvalidResourceHandle, "cudaGraphLaunch: not a live stream");
  std::shared_ptr<const Nodes> nodes;
  {
    CaptureState& c = cs();
    std::lock_guard<std::mutex> lock(c.mu);
    if (c.execs.count(exec) == 0) {
      return runtime_fail(cudaErrorInvalidResourceHandle,
                          "cudaGraphLaunch: not a live executable graph (destroyed, or never instantiated)");
    }
    nodes = reinterpret_cast<EmuGraphExec*>(exec)->nodes;
  }
  if (stream_capturing(s)) {
    return capture_refuse(s, "cudaGraphLaunch into a capturing stream (child graphs are not modelled by the "
                             "emulator): launch the graph outside the capture");
  }
  // The recorded work, in order, as new work of `s`: the race check, the range checks of copies
  // and library calls and the kernels' own checks run again on every replay.
  const bool profiled = profiling();   // the replay's launches are issued now (profiler.h)
  for (const Node& n : *nodes) {
    if (const cudaError_t e = enqueue(
            s,
            [work = n.work, profiled] {
              const ReplayIssue issue(profiled);
              work();
            },
            n.label.empty() ? std::string() : "graph node " + n.label);
        e != cudaSuccess) {
      return e;
    }
  }
  return device_error();
}

cudaError_t cudaGraphExecDestroy(cudaGraphExec_t exec) {
  return destroy_object<EmuGraphExec>(&CaptureState::execs, exec, "cudaGraphExecDestroy");
}

cudaError_t cudaGraphDestroy(cudaGraph_t graph) {
  return destroy_object<EmuGraph>(&CaptureState::graphs, graph, "cudaGraphDestroy");
}

}  // extern "C"
