// Modelled against measured, per kernel (calibrate.h).
#include "perfmodel/calibrate.h"

#include <algorithm>
#include <map>
#include <sstream>

#include "perfmodel/step.h"

namespace minidl::gpumodel {

std::string launch_key(const std::string& op, const std::string& kernel) {
  return kernel.empty() ? op : op + " / " + kernel;
}

std::vector<MeasuredRow> per_kernel_measured(const std::vector<TimedLaunch>& launches, int steps) {
  std::map<std::string, MeasuredRow> m;
  for (const TimedLaunch& l : launches) {
    MeasuredRow& r = m[l.key];
    r.key = l.key;
    r.launches += 1.0;
    r.us += l.ms * 1e3;
    r.host_us += l.host_ms * 1e3;
  }
  std::vector<MeasuredRow> out;
  for (auto& [k, r] : m) {
    r.launches /= std::max(1, steps);
    r.us /= std::max(1, steps);
    r.host_us /= std::max(1, steps);
    out.push_back(r);
  }
  std::sort(out.begin(), out.end(), [](const MeasuredRow& a, const MeasuredRow& b) { return a.us > b.us; });
  return out;
}

std::vector<ModelledRow> read_modelled(std::istream& tsv, const std::string& config) {
  std::vector<ModelledRow> out;
  std::string line;
  while (std::getline(tsv, line)) {
    std::vector<std::string> f;
    std::istringstream ls(line);
    for (std::string x; std::getline(ls, x, '\t');) f.push_back(x);
    if (f.size() < 4 || f[0] != config) continue;
    out.push_back({f[1], std::atof(f[2].c_str()), std::atof(f[3].c_str())});
  }
  return out;
}

std::string comparison_table(const std::vector<ModelledRow>& modelled, const std::vector<MeasuredRow>& measured,
                             double measured_step_ms, double images_per_step) {
  struct Both {
    double m_launches = 0, m_us = 0, g_launches = 0, g_us = 0;
  };
  std::map<std::string, Both> rows;
  double model_total = 0, measured_total = 0;
  for (const ModelledRow& r : modelled) {
    rows[r.key].m_launches = r.launches;
    rows[r.key].m_us = r.us;
    model_total += r.us;
  }
  for (const MeasuredRow& r : measured) {
    rows[r.key].g_launches = r.launches;
    rows[r.key].g_us = r.us;
    measured_total += r.us;
  }
  std::vector<std::pair<std::string, Both>> order(rows.begin(), rows.end());
  std::sort(order.begin(), order.end(), [](const auto& a, const auto& b) {
    return std::max(a.second.g_us, a.second.m_us) > std::max(b.second.g_us, b.second.m_us);
  });
  std::ostringstream os;
  os << "| kernel or call | launches modelled | launches measured | modelled µs | measured µs "
        "| measured / modelled |\n";
  os << "| --- | ---: | ---: | ---: | ---: | ---: |\n";
  for (const auto& [key, b] : order)
    os << "| `" << key << "` | " << fmt("%.0f", b.m_launches) << " | " << fmt("%.0f", b.g_launches) << " | "
       << fmt("%.1f", b.m_us) << " | " << fmt("%.1f", b.g_us) << " | "
       << (b.m_us > 0 && b.g_us > 0 ? fmt("%.2f", b.g_us / b.m_us) : std::string("-")) << " |\n";
  os << "| **sum of the launches** | | | " << fmt("%.1f", model_total) << " | " << fmt("%.1f", measured_total) << " | "
     << (model_total > 0 ? fmt("%.2f", measured_total / model_total) : std::string("-")) << " |\n";
  if (measured_step_ms > 0) {
    os << "\nMeasured step (events around the whole step, the gaps between launches included): "
       << fmt("%.2f ms", measured_step_ms);
    if (images_per_step > 0) os << ", " << fmt("%.0f images/s", images_per_step / (measured_step_ms * 1e-3));
    os << "; modelled step (the launches' sum, launch costs included): " << fmt("%.2f ms", model_total * 1e-3) << ".\n";
  }
  return os.str();
}

std::string host_table(const std::vector<MeasuredRow>& measured, double step_host_ms, double step_wall_ms, int top,
                       double gpu_ms) {
  std::vector<MeasuredRow> rows = measured;
  std::sort(rows.begin(), rows.end(), [](const MeasuredRow& a, const MeasuredRow& b) { return a.host_us > b.host_us; });
  double inside = 0;
  for (const MeasuredRow& r : rows) inside += r.host_us;
  std::ostringstream os;
  os << "| host time per step | ms |\n| --- | ---: |\n";
  if (step_host_ms > 0) os << "| the whole step (the host's calls) | " << fmt("%.2f", step_host_ms) << " |\n";
  if (step_wall_ms > 0) os << "| the whole step (wall, GPU events) | " << fmt("%.2f", step_wall_ms) << " |\n";
  os << "| inside the launches and library calls | " << fmt("%.2f", inside * 1e-3) << " |\n";
  if (step_host_ms > 0)
    os << "| minidl's own work between them | " << fmt("%.2f", step_host_ms - inside * 1e-3) << " |\n";
  if (gpu_ms > 0) os << "| the GPU's own work (the gated launches) | " << fmt("%.2f", gpu_ms) << " |\n";
  if (gpu_ms > 0 && step_wall_ms > 0) {
    if (gpu_ms >= 0.9 * step_wall_ms)
      os << "\nGPU-bound: the GPU's launches fill " << fmt("%.0f", 100 * gpu_ms / step_wall_ms)
         << "% of the wall, so the host also waits for a full launch queue, inside the timer's event records: "
            "the own-work row holds those waits.\n";
    else
      os << "\nHost-bound: the GPU's launches fill " << fmt("%.0f", 100 * gpu_ms / step_wall_ms)
         << "% of the wall; the GPU waits for the host " << fmt("%.2f", step_wall_ms - gpu_ms) << " ms a step.\n";
  }
  os << "\n| kernel or call | launches | host µs per step | host µs per launch |\n| --- | ---: | ---: | ---: |\n";
  for (size_t i = 0; i < rows.size() && static_cast<int>(i) < top; ++i) {
    const MeasuredRow& r = rows[i];
    os << "| `" << r.key << "` | " << fmt("%.0f", r.launches) << " | " << fmt("%.1f", r.host_us) << " | "
       << (r.launches > 0 ? fmt("%.1f", r.host_us / r.launches) : std::string("-")) << " |\n";
  }
  return os.str();
}

}  // namespace minidl::gpumodel
