// Device discovery through the CUDA runtime, and the event timer of the utilization study. On
// machines without a usable driver cudaGetDeviceCount fails (e.g. "driver version is
// insufficient"); that is reported, not thrown.
#include <cuda_runtime.h>

#include <cstddef>
#include <string>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/context.cuh"
#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/runtime.h"

namespace minidl::cuda {

int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error
    return 0;
  }
  return n;
}

std::string runtime_status() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return std::string("cudaGetDeviceCount failed: ") + cudaGetErrorString(e);
  }
  return std::to_string(n) + (n == 1 ? " device" : " devices");
}

// ---- EventTimer (runtime.h): event pairs on the device's compute stream --------------------------

bool EventTimer::available(int device, std::string* why) {
  const int n = device_count();
  if (device >= 0 && device < n) return true;
  if (why != nullptr) *why = n == 0 ? "no usable CUDA device (" + runtime_status() + ")"
                                    : "cuda:" + std::to_string(device) + " does not exist (" + runtime_status() + ")";
  return false;
}

std::unique_ptr<DeviceServices::IntervalTimer> CudaBackend::interval_timer(int device_index, std::string* why) {
  if (!EventTimer::available(device_index, why)) return nullptr;
  return std::make_unique<EventTimer>(device_index);
}

EventTimer::EventTimer(int device) : device_(device) {
  std::string why;
  MINIDL_CHECK(available(device, &why), "cuda::EventTimer(", device, "): ", why);
}

EventTimer::~EventTimer() {
  for (const auto* list : {&open_, &free_}) {
    for (const Interval& v : *list) {
      MINIDL_CUDA_LOG(cudaEventDestroy(static_cast<cudaEvent_t>(v.begin)));
      MINIDL_CUDA_LOG(cudaEventDestroy(static_cast<cudaEvent_t>(v.end)));
    }
  }
}

void EventTimer::start() {
  if (!open_.empty() && !open_.back().closed) return;   // already open: the first start counts
  DeviceContext& ctx = context(device_);
  ctx.activate();
  Interval v;
  if (!free_.empty()) {
    v = free_.back();
    free_.pop_back();
  } else {
    cudaEvent_t a = nullptr, b = nullptr;
    MINIDL_CUDA_CHECK(cudaEventCreate(&a));
    const cudaError_t e = cudaEventCreate(&b);
    if (e != cudaSuccess) MINIDL_CUDA_LOG(cudaEventDestroy(a));
    MINIDL_CUDA_CHECK(e);
    v.begin = a;
    v.end = b;
  }
  v.closed = false;
  open_.push_back(v);   // owned from here (the destructor destroys it)
  MINIDL_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(v.begin), ctx.stream()));
}

void EventTimer::stop() {
  if (open_.empty() || open_.back().closed) return;   // no open interval
  DeviceContext& ctx = context(device_);
  ctx.activate();
  MINIDL_CUDA_CHECK(cudaEventRecord(static_cast<cudaEvent_t>(open_.back().end), ctx.stream()));
  open_.back().closed = true;
  ++intervals_;
  // Earlier steps finished long ago (each step waits for its loss): fold them, keeping few events.
  if (open_.size() > 64) resolve(8);
}

void EventTimer::resolve(size_t keep) {
  size_t closed = open_.size();
  if (closed > 0 && !open_.back().closed) --closed;   // an open interval stays
  if (closed <= keep) return;
  const size_t fold = closed - keep;
  for (size_t i = 0; i < fold; ++i) {
    const auto a = static_cast<cudaEvent_t>(open_[i].begin);
    const auto b = static_cast<cudaEvent_t>(open_[i].end);
    MINIDL_CUDA_CHECK(cudaEventSynchronize(b));
    float ms = 0.0f;
    MINIDL_CUDA_CHECK(cudaEventElapsedTime(&ms, a, b));
    done_seconds_ += 1e-3 * static_cast<double>(ms);
    free_.push_back(open_[i]);
  }
  open_.erase(open_.begin(), open_.begin() + static_cast<std::ptrdiff_t>(fold));
}

double EventTimer::elapsed_seconds() {
  resolve(0);
  return done_seconds_;
}

}  // namespace minidl::cuda
