// The emulated device's cuBLAS and cuDNN stand-ins (cublas_emu.cpp, cudnn_emu.cpp, ...) define the
// libraries' own functions, so the backend links against them instead of libcublas/libcudnn. This
// header is how the emulated runtime hooks into them: it tells them which device ranges and streams
// are live, hears about faults, and reads the reason behind the last refused call.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <functional>
#include <string>
#include <vector>

namespace minidl::cuda::emu {

// Installed by the emulated runtime; until then every range/stream is accepted.
using RangeChecker = bool (*)(const void* p, size_t bytes);   // true when [p, p+bytes) is inside one live device allocation
void set_device_range_checker(RangeChecker);
using StreamChecker = bool (*)(cudaStream_t s);               // true for a live stream (or the legacy default stream 0)
void set_stream_checker(StreamChecker);
// Runs the stream's queued work (the runtime's deferred mode) before a call computes on it.
using StreamFlusher = void (*)(cudaStream_t s);
void set_stream_flusher(StreamFlusher);
// Records a call's computation into the capture of stream `s` (a CUDA graph) and answers true, or
// answers false when `s` is not capturing (the call then flushes the stream and computes at once).
using CaptureRecorder = bool (*)(cudaStream_t s, const std::function<void()>& work, const char* label);
void set_capture_recorder(CaptureRecorder);

// Called, when installed, for what a GPU reports as a fault of the launched work rather than as
// a status: a buffer the call would touch outside live device memory, a misaligned element, a
// destroyed stream. The call still returns the library's EXECUTION_FAILED status with the detail.
using FaultReporter = void (*)(const char* detail);
void set_fault_reporter(FaultReporter);

// Why the last call on this thread that returned an error did so: the function, the argument,
// its value and the rule it broke. "" until a call fails; a successful call leaves it unchanged.
const char* last_error_detail();
void clear_last_error_detail();

// cuDNN's convolution algorithm queries answered so far (cudnnGet*Algorithm_v7,
// cudnnGet*WorkspaceSize, cudnnFind*AlgorithmEx): on a GPU each costs host time (milliseconds for
// f16 heuristics), so the backend asks once per shape; tests check it does.
long long cudnn_algorithm_queries();

// What a GPU's Find adds to an algorithm's time the first time it runs in a process (CUDA loads its
// kernels lazily), for the tests of the backend's autotuning: while set, each cudnnFind*AlgorithmEx
// adds delay(call, algo) milliseconds to the time it reports for algorithm `algo` (the direction's
// enum value), `call` counting this process's Find calls from 0 at the setting. Empty: no delay.
using FindDelay = std::function<float(long long call, int algo)>;
void set_cudnn_find_delay(FindDelay delay);

// The cuDNN backend-API calls made so far on any thread, in order, each as the function and the
// descriptor's type: "cudnnBackendFinalize(ENGINEHEUR)", "cudnnBackendExecute(EXECUTION_PLAN)". A
// plan costs host time to build (heuristics, plan finalize) and cannot be built inside a CUDA graph
// capture, so the backend builds one per shape; tests check that a shape's later calls make only a
// variant pack and an execute. Cleared by clear_cudnn_backend_calls.
std::vector<std::string> cudnn_backend_calls();
void clear_cudnn_backend_calls();

// Autotuning through the graph API (kernels/cuda/conv_graph.cu) on the emulated device: the event
// clock there is the CPU's, so plans are ranked by the emulated library's fake time instead.
// cudnn_autotune_trial starts one timing round over a shape's plans (counted as an algorithm query,
// and as one Find call for set_cudnn_find_delay); cudnn_plan_time_ms is a finalized plan's fake time
// in that round, its engine's delay included.
long long cudnn_autotune_trial();
float cudnn_plan_time_ms(const void* plan, long long trial);

// Handles and descriptors created and not yet destroyed (leak checks in tests).
struct LibObjectCounts {
  int cublas_handles = 0;
  int cudnn_handles = 0;
  int tensor_descriptors = 0;
  int filter_descriptors = 0;
  int convolution_descriptors = 0;
  int backend_descriptors = 0;   // cudnnBackendCreateDescriptor's
};
LibObjectCounts live_object_counts();

// The user workspace a live cuBLAS handle will use; {nullptr, 0, false} when it uses the library's
// default pool (never set, or reset by cublasSetStream as the real library does).
struct CublasWorkspace {
  void* ptr = nullptr;
  size_t bytes = 0;
  bool user = false;
};
CublasWorkspace cublas_workspace_of(const void* handle);

}  // namespace minidl::cuda::emu
