// The parts of run.h that describe a run rather than train it: the printed values ("-" for
// none), durations, the device's name, a run's mean rates and the model summary. Kept apart from
// the training loop (run.cpp) so that file holds only the loop and its bookkeeping.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>
#include <thread>

#include "core/backend.h"
#include "core/error.h"
#include "train/model.h"
#include "train/run.h"

namespace minidl::train {

std::string value_or_dash(double v, int digits, double scale, const char* suffix) {
  if (!std::isfinite(v)) return "-";
  char b[64];
  std::snprintf(b, sizeof(b), "%.*f%s", digits, v * scale, suffix);
  return b;
}

std::string epoch_done_line(const EpochMetrics& em, int64_t epoch, int64_t epochs, const std::string& cut) {
  char line[512];
  std::snprintf(line, sizeof(line),
                "epoch %lld/%lld %s: loss %.4f  acc %.2f%%  val loss %s  val acc %s  %.1f img/s  "
                "data wait %.1f%%  device wait %.1f%%  peak %s  %.1f s",
                static_cast<long long>(epoch), static_cast<long long>(epochs), cut.empty() ? "done" : cut.c_str(),
                em.train_loss, 100.0 * em.train_acc,
                value_or_dash(em.val_loss, 4).c_str(), value_or_dash(em.val_acc, 2, 100.0, "%").c_str(),
                em.images_per_second, 100.0 * em.data_wait_fraction, 100.0 * em.device_wait_fraction,
                format_bytes(static_cast<size_t>(em.peak_allocated)).c_str(), em.train_seconds);
  return line;
}

std::string format_duration(double seconds) {
  const auto s = static_cast<long long>(std::llround(std::max(0.0, seconds)));
  char b[48];
  if (s < 60) std::snprintf(b, sizeof(b), "%lld s", s);
  else if (s < 3600) std::snprintf(b, sizeof(b), "%lldm%02llds", s / 60, s % 60);
  else std::snprintf(b, sizeof(b), "%lldh%02lldm", s / 3600, (s % 3600) / 60);
  return b;
}

std::string device_description(Device d) {
  if (d.is_cuda()) return "cuda:" + std::to_string(d.index) + " (" + backend(d).name() + ")";
  std::ifstream f("/proc/cpuinfo");
  std::string line, name = "unknown CPU";
  while (std::getline(f, line)) {
    if (line.rfind("model name", 0) == 0) {
      name = line.substr(line.find(':') + 2);
      break;
    }
  }
  return "cpu: " + name + " (" + std::to_string(std::thread::hardware_concurrency()) + " threads)";
}

double RunResult::mean_images_per_second() const {
  double imgs = 0, secs = 0;
  for (const auto& e : epochs) {
    imgs += static_cast<double>(e.images);
    secs += e.train_seconds;
  }
  return secs > 0 ? imgs / secs : 0.0;
}

double RunResult::steady_images_per_second() const {
  double imgs = 0, secs = 0;
  for (const auto& e : epochs) {
    imgs += static_cast<double>(e.steady_images);
    secs += e.steady_seconds;
  }
  return secs > 0 ? imgs / secs : std::numeric_limits<double>::quiet_NaN();
}

std::string model_summary(const TrainConfig& c) {
  validate(c);
  Model m = make_model(c, c.seed);
  const nn::Summary s = m.module->summary(m.input_shape(1));
  std::ostringstream os;
  os << c.model << " at " << m.image_size << "x" << m.image_size << "\n" << s.str();
  return os.str();
}

}  // namespace minidl::train
