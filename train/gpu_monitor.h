// GPU busy % for the utilization study: NVML's utilisation counter sampled on a background thread
// while a run trains. NVML is opened with dlopen("libnvidia-ml.so.1") so the programs neither
// link against the driver nor need it. Without it, CUDA events around each step give kernel time /
// wall time instead (the device's interval timer, core/device_services.h); on the CPU backend the column stays empty, saying why.
#pragma once
#include <atomic>
#include <memory>
#include <string>
#include <thread>

#include "core/device.h"
#include "core/device_services.h"
#include "core/non_copyable.h"

namespace minidl::train {

class GpuBusyMonitor {
 public:
  // Starts sampling device `index` every `period_ms`; does nothing when NVML is unavailable.
  explicit GpuBusyMonitor(int index, int period_ms = 50);
  ~GpuBusyMonitor();
  GpuBusyMonitor(const GpuBusyMonitor&) = delete;
  GpuBusyMonitor& operator=(const GpuBusyMonitor&) = delete;

  bool available() const { return available_; }
  // Stops sampling; the mean busy % over the samples, or NaN when unavailable or never sampled.
  double stop();

 private:
  bool available_ = false;
  std::atomic<bool> running_{false};
  std::thread thread_;
  double sum_ = 0.0;
  long samples_ = 0;
};

// Busy seconds over wall seconds in %, clamped to [0, 100]; NaN when the wall time is not positive
// or the busy time is unknown (NaN).
double busy_percent(double busy_seconds, double wall_seconds);

// The busy column of one epoch from the best source the device has, in this order: NVML
// (source "nvml"), CUDA events around each step (source "cuda-events", an upper bound: see
// cuda::EventTimer, the CUDA backend's interval timer), else none (source "none: <why>", e.g. "none: cpu device").
class GpuBusyMeter : NonCopyable {
 public:
  explicit GpuBusyMeter(Device device);
  ~GpuBusyMeter();

  // Around each training step; no-ops unless the source is cuda-events.
  void step_begin();
  void step_end();
  // Ends the measurement: busy % over `wall_seconds` of training, or NaN (see source()).
  double stop(double wall_seconds);
  const std::string& source() const { return source_; }

 private:
  std::unique_ptr<GpuBusyMonitor> nvml_;
  std::unique_ptr<DeviceServices::IntervalTimer> events_;
  std::string source_;
};

}  // namespace minidl::train
