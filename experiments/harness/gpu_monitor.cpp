// NVML through dlopen (see gpu_monitor.h). Only the four entry points used are declared here, with
// NVML's C ABI: every call returns 0 (NVML_SUCCESS) on success.
#include "experiments/harness/gpu_monitor.h"

#include <dlfcn.h>

#include <chrono>
#include <limits>
#include <mutex>

namespace minidl::harness {
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

}  // namespace minidl::harness
