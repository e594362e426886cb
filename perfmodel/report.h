// The model's tables: the step at the requested shape costed launch by launch (cost.h), grouped
// per kernel, with the ideal step beside it; ptxas's resources with each call site's theoretical
// occupancy; and a tab-separated per-kernel file that the GPU calibration joins with its
// measurements (the lab's GPU check, lab/gpulab). Every time here is modelled, and the tables say
// so.
#pragma once
#include <string>
#include <vector>

#include "perfmodel/cost.h"
#include "perfmodel/extrapolate.h"

namespace minidl::gpumodel {

struct ModelledStep {
  StepProfile step;
  std::vector<Cost> costs;             // one per work item
  double seconds = 0.0;                // the step: the sum in stream order
  double launch_seconds = 0.0;
  double dram_bytes = 0.0;
  double library_seconds = 0.0;        // cuDNN + cuBLAS
  double ideal_fused_seconds = 0.0;
  double ideal_fused_bytes = 0.0;
  double ideal_per_launch_seconds = 0.0;
  int kernels = 0, library_calls = 0, transfers = 0;
};
ModelledStep model_step(const StepProfile& step, const std::vector<KernelResources>& table, const H100Spec& spec,
                        LaunchMode mode);

// The note under a kernel table with "n/f" cells: request and instruction counts extrapolate only
// when the samples issue the target's instructions; a kernel whose vector width follows the
// plane's size (a 7x7 plane at the target takes scalar accesses, 2x2 and 3x3 at the samples do
// not) gets sector counts right but request counts that no warp could issue.
inline constexpr const char* kReportNotFitted =
    "n/f: the fitted request or instruction count of this kernel is not one a warp could issue (its "
    "vector width follows the plane's size, so the sampled sizes issue other instructions than the "
    "target); its sectors, DRAM bytes and modelled time do not depend on these counts.";

struct KernelRow {
  std::string key;
  Work::Kind kind = Work::Kind::Kernel;
  int launches = 0;
  double seconds = 0.0, launch_seconds = 0.0, dram_bytes = 0.0, l2_bytes = 0.0, flops = 0.0;
  double gld_requests = 0, gld_sectors = 0, gst_requests = 0, gst_sectors = 0;
  double shared_requests = 0, shared_wavefronts = 0, atomics = 0;
  double mem_instructions = 0, active_lanes = 0;
  double occupancy = -1.0;   // the lowest theoretical occupancy among its launches; -1: not a kernel
  int registers = 0, spill_bytes = 0;
  bool resources_known = false;
  std::string bound;         // of its costliest launch
};
// Grouped by Work::key(), costliest first.
std::vector<KernelRow> kernel_rows(const ModelledStep& m);

struct ReportInfo {
  std::string title;         // "ResNet-50, 224x224, batch 256, AMP, NCHW"
  std::string command, commit, date;
  std::string samples;       // "batch {1,2} x image {32,64,96}"
  std::string validation;    // the held-out size's errors, one line
  double images_per_step = 0.0;
};
// The markdown section of one configuration: the summary (modelled images/s, the ideal steps and
// the ratio, DRAM bytes and launches per step, the share outside cuDNN/cuBLAS) and the per-kernel table.
std::string markdown_report(const ModelledStep& m, const ReportInfo& info, const H100Spec& spec, int top = 0);
// Tab-separated rows config, key, launches, modelled µs, DRAM bytes, bound (no header): the
// calibration (calibrate.h) joins its measurements on (config, key).
std::string per_kernel_tsv(const ModelledStep& m, const std::string& config);

// ptxas's resources of every kernel with the theoretical occupancy at each launch configuration the
// profiled steps used (kernels they did not launch: at 256 threads, the backend's usual block);
// spills and occupancy under 50% first.
std::string resource_table(const std::vector<KernelResources>& table, const std::vector<Work>& launches,
                           const H100Spec& spec);

}  // namespace minidl::gpumodel
