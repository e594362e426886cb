// NVML through dlopen, else CUDA events (see gpu_monitor.h). Only the four entry points used are declared here, with
// NVML's C ABI: every call returns 0 (NVML_SUCCESS) on success.
#include "train/gpu_monitor.h"

#include <dlfcn.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <mutex>

#include "core/backend.h"

namespace minidl::train {
namespace {

struct NvmlUtilization {
  unsigned int gpu;
  unsigned int memory;
};
using NvmlDevice = void*;

struct Nvml {
  int (*init)() = nullptr;
  int (*handle_by_index)(unsigned int, NvmlDevice*) = nullptr;
  int (*utilization)(NvmlDevice, NvmlUtilization*) = nullptr;
  bool ok = false;
};

// Loaded once per process; the library stays open (NVML's own advice for short-lived tools).
const Nvml& nvml() {
  static Nvml n;
  static std::once_flag once;
  std::call_once(once, [] {
    void* lib = dlopen("libnvidia-ml.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) return;
    n.init = reinterpret_cast<int (*)()>(dlsym(lib, "nvmlInit_v2"));
    n.handle_by_index = reinterpret_cast<int (*)(unsigned int, NvmlDevice*)>(dlsym(lib, "nvmlDeviceGetHandleByIndex_v2"));
    n.utilization = reinterpret_cast<int (*)(NvmlDevice, NvmlUtilization*)>(dlsym(lib, "nvmlDeviceGetUtilizationRates"));
    n.ok = n.init && n.handle_by_index && n.utilization && n.init() == 0;
  });
  return n;
}

}  // namespace

GpuBusyMonitor::GpuBusyMonitor(int index, int period_ms) {
  const Nvml& n = nvml();
  NvmlDevice dev = nullptr;
  if (!n.ok || n.handle_by_index(static_cast<unsigned int>(index), &dev) != 0) return;
  available_ = true;
  running_ = true;
  thread_ = std::thread([this, dev, period_ms, &n] {
    while (running_) {
      NvmlUtilization u{};
      if (n.utilization(dev, &u) == 0) sum_ += u.gpu, ++samples_;
      std::this_thread::sleep_for(std::chrono::milliseconds(period_ms));
    }
  });
}

GpuBusyMonitor::~GpuBusyMonitor() { stop(); }

double GpuBusyMonitor::stop() {
  if (running_.exchange(false) && thread_.joinable()) thread_.join();
  return samples_ > 0 ? sum_ / static_cast<double>(samples_) : std::numeric_limits<double>::quiet_NaN();
}

double busy_percent(double busy_seconds, double wall_seconds) {
  if (!(wall_seconds > 0) || !std::isfinite(busy_seconds)) return std::numeric_limits<double>::quiet_NaN();
  return std::clamp(100.0 * busy_seconds / wall_seconds, 0.0, 100.0);
}

GpuBusyMeter::GpuBusyMeter(Device device) {
  if (!device.is_cuda()) {
    source_ = "none: cpu device";
    return;
  }
  nvml_ = std::make_unique<GpuBusyMonitor>(device.index);
  if (nvml_->available()) {
    source_ = "nvml";
    return;
  }
  nvml_.reset();
  std::string why;
  events_ = backend(device).interval_timer(device.index, &why);
  if (events_) {
    source_ = "cuda-events";
  } else {
    source_ = "none: no NVML and no CUDA events (" + why + ")";
  }
}

GpuBusyMeter::~GpuBusyMeter() = default;

void GpuBusyMeter::step_begin() {
  if (events_) events_->start();
}

void GpuBusyMeter::step_end() {
  if (events_) events_->stop();
}

double GpuBusyMeter::stop(double wall_seconds) {
  if (nvml_) return nvml_->stop();
  if (events_) return busy_percent(events_->elapsed_seconds(), wall_seconds);
  return std::numeric_limits<double>::quiet_NaN();
}

}  // namespace minidl::train
