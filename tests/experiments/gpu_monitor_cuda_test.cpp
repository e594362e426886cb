// The GPU busy column's event fallback through the device services (core/device_services.h):
// the CUDA backend's interval timer (cuda::EventTimer) reached without naming the CUDA backend,
// as the trainer reaches it, and the CPU's answer that it has none. On the emulated device
// (experiments_cuda_emu) the events are real stream events; on a GPU, real ones.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/backend.h"
#include "core/ops.h"
#include "train/gpu_monitor.h"

namespace minidl::train {
namespace {

TEST(ExperimentsGpuMonitorCuda, TheCpuHasNoIntervalTimerAndSaysSo) {
  std::string why;
  EXPECT_EQ(backend(Device::cpu()).interval_timer(0, &why), nullptr);
  EXPECT_NE(why.find("no event timer"), std::string::npos) << why;
}

TEST(ExperimentsGpuMonitorCuda, TheCudaBackendTimesIntervalsOfQueuedWork) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device (" << (cuda_built() ? "built with CUDA" : "no CUDA") << ")";
  std::string why;
  auto timer = backend(Device::cuda(0)).interval_timer(0, &why);
  ASSERT_NE(timer, nullptr) << why;
  const Tensor a = rand({256, 256}, {DType::f32, Device::cuda(0), false});
  timer->start();
  const Tensor b = matmul(a, a);
  timer->stop();
  timer->start();   // left open: not counted
  const double s = timer->elapsed_seconds();
  EXPECT_GE(s, 0.0);
  EXPECT_TRUE(std::isfinite(s));
  EXPECT_EQ(b.size(0), 256);
  // The trainer's meter takes it when NVML is absent.
  GpuBusyMeter m(Device::cuda(0));
  EXPECT_TRUE(m.source() == "nvml" || m.source() == "cuda-events") << m.source();
  m.step_begin();
  m.step_end();
  if (m.source() == "cuda-events") {
    EXPECT_FALSE(std::isnan(m.stop(1.0)));
  }
}

TEST(ExperimentsGpuMonitorCuda, ACudaDeviceThatDoesNotExistSaysWhy) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  std::string why;
  EXPECT_EQ(backend(Device::cuda(0)).interval_timer(cuda_device_count(), &why), nullptr);
  EXPECT_NE(why.find("does not exist"), std::string::npos) << why;
}

}  // namespace
}  // namespace minidl::train
