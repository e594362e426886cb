// The NVML sampler of the utilization study degrades to "no value" without NVML (this machine),
// and reports a percentage when a driver is present.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "experiments/harness/gpu_monitor.h"

namespace minidl::harness {
namespace {

TEST(ExperimentsGpuMonitor, NaNWithoutNvmlElseAPercentage) {
  GpuBusyMonitor m(0, 5);
  std::this_thread::sleep_for(std::chrono::milliseconds(30));
  const double busy = m.stop();
  if (!m.available()) {
    EXPECT_TRUE(std::isnan(busy));
  } else {
    EXPECT_GE(busy, 0.0);
    EXPECT_LE(busy, 100.0);
  }
  EXPECT_EQ(std::isnan(m.stop()), std::isnan(busy)) << "stop() twice is harmless";
}

}  // namespace
}  // namespace minidl::harness
