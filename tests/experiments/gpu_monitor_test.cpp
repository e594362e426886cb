// The utilization study's GPU busy column: the NVML sampler degrades to "no value" without NVML
// (this machine) and reports a percentage when a driver is present; the CUDA-event fallback reports
// unavailable (saying why) without a device; the column's source is always labelled.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <thread>

#include "core/backend.h"
#include "train/gpu_monitor.h"
#include "kernels/cuda/runtime.h"

namespace minidl::train {
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

TEST(ExperimentsGpuMonitor, BusyPercentIsKernelTimeOverWallTime) {
  EXPECT_DOUBLE_EQ(busy_percent(0.25, 1.0), 25.0);
  EXPECT_DOUBLE_EQ(busy_percent(3.0, 2.0), 100.0) << "clamped (event spans can exceed the wall clock by rounding)";
  EXPECT_DOUBLE_EQ(busy_percent(0.0, 2.0), 0.0);
  EXPECT_TRUE(std::isnan(busy_percent(1.0, 0.0))) << "no wall time: unknown, not infinite";
  EXPECT_TRUE(std::isnan(busy_percent(std::nan(""), 1.0)));
}

TEST(ExperimentsGpuMonitor, CpuDeviceLeavesTheColumnEmptyAndSaysWhy) {
  GpuBusyMeter m(Device::cpu());
  m.step_begin();
  m.step_end();
  EXPECT_TRUE(std::isnan(m.stop(1.0)));
  EXPECT_EQ(m.source(), "none: cpu device");
}

TEST(ExperimentsGpuMonitor, EventTimerReportsWhetherItCanRun) {
  std::string why;
  const bool ok = cuda::EventTimer::available(0, &why);
  EXPECT_EQ(ok, cuda_device_count() > 0);
  if (!ok) {
    EXPECT_FALSE(why.empty()) << "unavailable says why";
    EXPECT_THROW(cuda::EventTimer t(0), Error);
    EXPECT_FALSE(cuda::EventTimer::available(-1));
    return;
  }
  cuda::EventTimer t(0);
  t.start();
  t.stop();
  t.stop();   // no open interval: ignored
  t.start();  // left open: not counted
  const double s = t.elapsed_seconds();
  EXPECT_GE(s, 0.0);
  EXPECT_LT(s, 1.0);
  EXPECT_EQ(t.intervals(), 1);
  GpuBusyMeter m(Device::cuda(0));
  EXPECT_TRUE(m.source() == "nvml" || m.source() == "cuda-events") << m.source();
}

}  // namespace
}  // namespace minidl::train
