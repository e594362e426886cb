// Tables of the step-time model (report.h).
#include "perfmodel/report.h"

#include <algorithm>
#include <cstdio>
#include <map>
#include <set>
#include <sstream>

namespace minidl::gpumodel {
namespace {

std::string bytes_str(double b) {
  if (b >= 1e9) return fmt("%.2f GB", b / 1e9);
  if (b >= 1e6) return fmt("%.1f MB", b / 1e6);
  if (b >= 1e3) return fmt("%.1f kB", b / 1e3);
  return fmt("%.0f B", b);
}
std::string ratio(double num, double den) { return den > 0 ? fmt("%.2f", num / den) : "-"; }
// A per-request or per-instruction ratio of fitted counters, "n/f" past what any warp can do (a
// request of 32 lanes touches at most 64 sectors, an instruction has at most 32 lanes): the fit of
// the request counts failed for this kernel (kReportNotFitted says why).
std::string bounded_ratio(double num, double den, double most) {
  if (den > 0 && num / den > most) return "n/f";
  return ratio(num, den);
}

bool is_library(const Work& w) { return w.kind == Work::Kind::Library; }

bool starts(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

// Where the time goes, in the groups the issue asks about.
const char* category_of(const Work& w) {
  const std::string& op = w.op;
  // cuDNN's fused graphs (the convolutions that carry batch norm) log their pattern as the algorithm.
  if (starts(op, "cuDNN") && (w.algo == "scale_bias_relu_conv_genstats" || w.algo == "scale_bias_relu_wgrad" ||
                              w.algo == "dgrad_drelu_dbn_weight"))
    return "cuDNN convolutions carrying batch norm (fused graphs)";
  if (starts(op, "cuDNN")) return "cuDNN convolutions";
  if (starts(op, "conv2d_stats")) return "batch norm";
  if (starts(op, "cuBLAS")) return "cuBLAS GEMMs";
  if (op == "copy (conv2d NHWC transpose)") return "NHWC transposes around the convolutions";
  if (starts(op, "batch_norm")) return "batch norm";
  if (starts(op, "relu")) return "ReLU (forward and backward)";
  if (op == "add") return "adds (residuals, biases, gradient accumulation)";
  if (starts(op, "copy f32->f16") || starts(op, "copy f16->f32") || starts(op, "copy f32->bf16") ||
      starts(op, "copy bf16->f32"))
    return "AMP casts";
  if (starts(op, "fused_") || op == "unscale_grads") return "optimizer step and gradient unscale";
  if (op.find("pool") != std::string::npos || op == "reduce") return "pooling and reductions";
  if (w.kind == Work::Kind::Transfer) return "copies and fills (runtime)";
  return "other kernels (loss, fills, copies, ...)";
}

}  // namespace

ModelledStep model_step(const StepProfile& step, const std::vector<KernelResources>& table, const H100Spec& spec,
                        LaunchMode mode) {
  ModelledStep m;
  m.step = step;
  for (const Work& w : step.work) {
    const Cost c = model_cost(w, table, spec, mode);
    m.seconds += c.seconds;
    m.launch_seconds += c.launch_s;
    m.dram_bytes += c.dram_bytes;
    if (is_library(w)) m.library_seconds += c.seconds;
    m.ideal_fused_seconds += ideal_fused_seconds(w, spec);
    m.ideal_fused_bytes += ideal_fused_bytes(w);
    m.ideal_per_launch_seconds += ideal_per_launch_seconds(w, spec);
    (w.kind == Work::Kind::Kernel ? m.kernels : is_library(w) ? m.library_calls : m.transfers) += 1;
    m.costs.push_back(c);
  }
  return m;
}

std::vector<KernelRow> kernel_rows(const ModelledStep& m) {
  std::map<std::string, KernelRow> rows;
  std::map<std::string, double> costliest;
  for (size_t i = 0; i < m.step.work.size(); ++i) {
    const Work& w = m.step.work[i];
    const Cost& c = m.costs[i];
    KernelRow& r = rows[w.key()];
    r.key = w.key();
    r.kind = w.kind;
    ++r.launches;
    r.seconds += c.seconds;
    r.launch_seconds += c.launch_s;
    r.dram_bytes += c.dram_bytes;
    r.l2_bytes += c.l2_bytes;
    r.flops += c.flops;
    if (c.seconds > costliest[r.key]) {
      costliest[r.key] = c.seconds;
      r.bound = c.bound;
    }
    if (w.kind != Work::Kind::Kernel) continue;
    r.gld_requests += w.v[kGldRequests];
    r.gld_sectors += w.v[kGldSectors];
    r.gst_requests += w.v[kGstRequests];
    r.gst_sectors += w.v[kGstSectors];
    r.shared_requests += w.v[kSharedLdRequests] + w.v[kSharedStRequests];
    r.shared_wavefronts += w.v[kSharedLdWavefronts] + w.v[kSharedStWavefronts];
    r.atomics += w.v[kAtomics];
    r.mem_instructions += w.v[kMemInstructions];
    r.active_lanes += w.v[kActiveLanes];
    if (r.occupancy < 0 || c.occupancy.fraction < r.occupancy) r.occupancy = c.occupancy.fraction;
    if (c.resources != nullptr) {
      r.resources_known = true;
      r.registers = std::max(r.registers, c.resources->registers);
      r.spill_bytes = std::max(r.spill_bytes, c.resources->spill_stores + c.resources->spill_loads);
    }
  }
  std::vector<KernelRow> out;
  for (auto& [k, r] : rows) out.push_back(r);
  std::sort(out.begin(), out.end(), [](const KernelRow& a, const KernelRow& b) { return a.seconds > b.seconds; });
  return out;
}

std::string markdown_report(const ModelledStep& m, const ReportInfo& info, const H100Spec& spec, int top) {
  std::ostringstream os;
  const double ips = m.seconds > 0 ? info.images_per_step / m.seconds : 0.0;
  const double ideal_ips = m.ideal_fused_seconds > 0 ? info.images_per_step / m.ideal_fused_seconds : 0.0;
  os << "### " << info.title << " (modelled)\n\n";
  os << "| | modelled |\n| --- | ---: |\n";
  os << "| step time | " << fmt("%.2f ms", m.seconds * 1e3) << " |\n";
  os << "| images/s | " << fmt("%.0f", ips) << " |\n";
  os << "| ideal step (fused: convolutions and GEMMs at peak, other tensor ops fused into them, no launch cost) | "
     << fmt("%.2f ms", m.ideal_fused_seconds * 1e3) << " (" << fmt("%.0f", ideal_ips) << " images/s) |\n";
  os << "| modelled / ideal step time | " << ratio(m.seconds, m.ideal_fused_seconds) << " |\n";
  os << "| per-launch limit (these launches, each at its DRAM floor or peak, no launch cost) | "
     << fmt("%.2f ms", m.ideal_per_launch_seconds * 1e3) << " |\n";
  os << "| DRAM bytes per step (kernels' unique sectors, libraries' operands) | " << bytes_str(m.dram_bytes)
     << " (ideal " << bytes_str(m.ideal_fused_bytes) << ") |\n";
  os << "| launches per step (kernels + cuDNN/cuBLAS calls + copies) | " << m.kernels + m.library_calls + m.transfers
     << " (" << m.kernels << " + " << m.library_calls << " + " << m.transfers << ") |\n";
  os << "| time in cuDNN / cuBLAS (their launch cost included) | " << fmt("%.2f ms", m.library_seconds * 1e3) << " ("
     << fmt("%.1f%%", m.seconds > 0 ? 100.0 * m.library_seconds / m.seconds : 0.0) << ") |\n";
  os << "| launch cost in the step | " << fmt("%.2f ms", m.launch_seconds * 1e3) << " ("
     << fmt("%.1f%%", m.seconds > 0 ? 100.0 * m.launch_seconds / m.seconds : 0.0) << ") |\n\n";
  std::map<std::string, std::pair<double, double>> by_category;   // time without launch cost, launch cost
  for (size_t i = 0; i < m.step.work.size(); ++i) {
    auto& c = by_category[category_of(m.step.work[i])];
    c.first += m.costs[i].seconds - m.costs[i].launch_s;
    c.second += m.costs[i].launch_s;
  }
  std::vector<std::pair<std::string, std::pair<double, double>>> cats(by_category.begin(), by_category.end());
  std::sort(cats.begin(), cats.end(), [](const auto& a, const auto& b) { return a.second.first > b.second.first; });
  os << "| where the time goes | modelled ms (without launch cost) | share | launch cost ms |\n";
  os << "| --- | ---: | ---: | ---: |\n";
  for (const auto& [name, t] : cats)
    os << "| " << name << " | " << fmt("%.2f", t.first * 1e3) << " | "
       << fmt("%.1f%%", m.seconds > 0 ? 100.0 * t.first / m.seconds : 0.0) << " | " << fmt("%.2f", t.second * 1e3)
       << " |\n";
  os << "\n";
  if (!info.samples.empty()) os << "Extrapolated from the emulated device's counters at " << info.samples << ". ";
  os << (info.validation.empty() ? std::string("No size was held out for this configuration.") : info.validation);
  os << "\n\n";
  os << "| kernel (op / kernel) or call | launches | modelled µs | share | bound | DRAM bytes | ld sectors/req | "
        "st sectors/req | bank conflicts | occupancy | regs | spills | lanes/instr |\n";
  os << "| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |\n";
  const std::vector<KernelRow> rows = kernel_rows(m);
  int shown = 0;
  bool not_fitted = false;
  for (const KernelRow& r : rows) {
    if (top > 0 && shown++ >= top) break;
    const bool k = r.kind == Work::Kind::Kernel;
    os << "| `" << r.key << "` | " << r.launches << " | " << fmt("%.1f", r.seconds * 1e6) << " | "
       << fmt("%.1f%%", m.seconds > 0 ? 100.0 * r.seconds / m.seconds : 0.0) << " | " << r.bound << " | "
       << bytes_str(r.dram_bytes) << " | " << (k ? bounded_ratio(r.gld_sectors, r.gld_requests, 64) : "-") << " | "
       << (k ? bounded_ratio(r.gst_sectors, r.gst_requests, 64) : "-") << " | "
       << (k ? fmt("%.0f", std::max(0.0, r.shared_wavefronts - r.shared_requests)) : "-") << " | "
       << (k ? fmt("%.0f%%", 100.0 * r.occupancy) + (r.resources_known ? "" : "?") : "-") << " | "
       << (k && r.resources_known ? std::to_string(r.registers) : "-") << " | "
       << (k && r.resources_known ? std::to_string(r.spill_bytes) : "-") << " | "
       << (k ? bounded_ratio(r.active_lanes, r.mem_instructions, 32) : "-") << " |\n";
    not_fitted = not_fitted || (k && (bounded_ratio(r.gld_sectors, r.gld_requests, 64) == "n/f" ||
                                      bounded_ratio(r.gst_sectors, r.gst_requests, 64) == "n/f" ||
                                      bounded_ratio(r.active_lanes, r.mem_instructions, 32) == "n/f"));
  }
  if (not_fitted) os << "\n" << kReportNotFitted << "\n";
  if (top > 0 && static_cast<int>(rows.size()) > top)
    os << "\n(" << rows.size() - top << " more rows in the full table)\n";
  (void)spec;
  return os.str();
}

std::string per_kernel_tsv(const ModelledStep& m, const std::string& config) {
  std::ostringstream os;
  for (const KernelRow& r : kernel_rows(m))
    os << config << "\t" << r.key << "\t" << r.launches << "\t" << fmt("%.3f", r.seconds * 1e6) << "\t"
       << fmt("%.0f", r.dram_bytes) << "\t" << r.bound << "\n";
  return os.str();
}

std::string resource_table(const std::vector<KernelResources>& table, const std::vector<Work>& launches,
                           const H100Spec& spec) {
  struct Row {
    const KernelResources* k;
    int threads, dyn_smem;
    bool launched;
    Occupancy occ;
  };
  std::vector<Row> rows;
  std::set<std::tuple<const KernelResources*, int, int>> seen;
  for (const Work& w : launches) {
    if (w.kind != Work::Kind::Kernel) continue;
    const KernelResources* k = find_kernel(table, w.kernel, w.parameters);
    if (k == nullptr || !seen.insert({k, w.block_threads, w.dynamic_smem}).second) continue;
    rows.push_back({k, w.block_threads, w.dynamic_smem, true, {}});
  }
  for (const KernelResources& k : table)
    if (std::none_of(rows.begin(), rows.end(), [&](const Row& r) { return r.k == &k; }))
      rows.push_back({&k, 256, 0, false, {}});
  for (Row& r : rows)
    r.occ = theoretical_occupancy({r.k->registers, r.k->static_smem, r.dyn_smem, r.threads, false}, spec);
  auto rank = [](const Row& r) { return r.k->spill_stores + r.k->spill_loads > 0 ? 0 : r.occ.fraction < 0.5 ? 1 : 2; };
  std::stable_sort(rows.begin(), rows.end(), [&](const Row& a, const Row& b) {
    if (rank(a) != rank(b)) return rank(a) < rank(b);
    if (a.launched != b.launched) return a.launched;
    return a.k->demangled < b.k->demangled;
  });
  std::ostringstream os;
  os << "| kernel (sm_90 instantiation) | source | regs | spill st/ld B | stack B | static smem B | block | "
        "dyn smem B | occupancy | limited by |\n";
  os << "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |\n";
  for (const Row& r : rows) {
    std::string name = r.k->demangled;
    for (const char* ns : {"minidl::cuda::(anonymous namespace)::", "minidl::cuda::", "minidl::"})
      for (size_t p; (p = name.find(ns)) != std::string::npos;) name.erase(p, std::char_traits<char>::length(ns));
    if (name.compare(0, 5, "void ") == 0) name = name.substr(5);
    os << "| `" << name << "` | " << r.k->source << " | " << r.k->registers << " | " << r.k->spill_stores << "/"
       << r.k->spill_loads << " | " << r.k->stack_frame << " | " << r.k->static_smem << " | " << r.threads
       << (r.launched ? "" : " (not launched)") << " | " << r.dyn_smem << " | " << fmt("%.0f%%", 100.0 * r.occ.fraction)
       << " | " << r.occ.limiter << " |\n";
  }
  return os.str();
}

}  // namespace minidl::gpumodel
