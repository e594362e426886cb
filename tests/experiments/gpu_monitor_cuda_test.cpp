// The GPU busy column's event fallback through the device services (core/device_services.h):
// the CUDA backend's interval timer (cuda::EventTimer) reached without naming the CUDA backend,
// as the trainer reaches it, and the CPU's answer that it has none. On the emulated device
// (experiments_cuda_emu) the events are real stream events; on a GPU, real ones. And the epoch's
// device wait, the host's time blocked on queued device work.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "core/backend.h"
#include "core/ops.h"
#include "tests/experiments/helpers.h"
#include "train/gpu_monitor.h"
#include "train/run.h"

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

// The host reads each step's loss and prediction count after the device's queued work (on the
// emulated device the queued kernels run then): that wait is the epoch's device_wait_fraction,
// beside its data wait; together at most the epoch. A tiny model's step is mostly device work here.
TEST(ExperimentsGpuMonitorCuda, TheEpochSaysHowLongTheHostWaitedForTheDevice) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  TrainConfig c = harness::testing::tiny_config();
  c.device = "cuda";
  c.epochs = 2;
  const RunResult r = run_training(c, RunHooks{});
  ASSERT_EQ(r.status, "ok") << r.note;
  for (const EpochMetrics& e : r.epochs) {
#ifdef MINIDL_CUDA_EMU
    // The emulated device runs queued kernels in the wait: about 0.57 of the eager first epoch and
    // 0.98 of the replayed second were measured (the CPU's run: 0.013).
    EXPECT_GT(e.device_wait_fraction, 0.2) << "epoch " << e.epoch;
#else
    EXPECT_GT(e.device_wait_fraction, 0.0) << "epoch " << e.epoch;   // a GPU's share depends on the GPU
#endif
    EXPECT_LE(e.data_wait_fraction + e.device_wait_fraction, 1.0) << "epoch " << e.epoch;
  }
}

}  // namespace
}  // namespace minidl::train
