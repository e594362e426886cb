// GPU busy % for the utilization study: NVML's utilisation counter sampled on a background thread
// while a run trains. NVML is opened with dlopen("libnvidia-ml.so.1") so the programs neither
// link against the driver nor need it: without it (or on the CPU backend) the column stays empty.
#pragma once
#include <atomic>
#include <memory>
#include <thread>

namespace minidl::harness {

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

}  // namespace minidl::harness
