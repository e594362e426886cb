// What one launch, library call or copy costs on the modelled H100 (h100.h), and the ideal step's
// share of it. Kernels: max(DRAM bytes / achievable bandwidth, L2 sectors / L2 bandwidth, shared
// wavefronts / shared bandwidth) + the launch cost, where a launch with fewer resident warps than
// it takes to keep HBM busy (h100.h) gets a proportional share of the bandwidth ("latency").
// cuDNN / cuBLAS calls: max(FLOPs / (peak x efficiency), minimal bytes / bandwidth) + a launch.
#pragma once
#include <string>
#include <vector>

#include "perfmodel/h100.h"
#include "perfmodel/kernel_resources.h"
#include "perfmodel/occupancy.h"
#include "perfmodel/step.h"

namespace minidl::gpumodel {

enum class LaunchMode { Eager, Graph };

struct Cost {
  double seconds = 0.0;      // modelled, the launch cost included
  double launch_s = 0.0;
  double dram_bytes = 0.0;   // kernels: unique sectors x 32 (read + written); libraries: their fewest bytes
  double l2_bytes = 0.0;     // kernels: sectors moved between L2 and the SMs x 32
  double flops = 0.0;        // libraries only (the hand-written kernels are costed by their bytes)
  std::string bound;         // what the time is: "HBM", "L2", "shared", "latency", "f16 tensor", ..., "launch"
  const KernelResources* resources = nullptr;   // kernels: ptxas's report of the instantiation that ran
  bool exact_instantiation = false;             // resources matched by parameter types, not just by name
  Occupancy occupancy;                          // kernels with resources
};

Cost model_cost(const Work& w, const std::vector<KernelResources>& table, const H100Spec& spec, LaunchMode mode);

// The limit to measure against, per piece of work. Fused: convolutions and GEMMs at the dense peak
// with their operands' bytes, the parameter update (the fused optimizer step and the gradient
// unscale) at its unique bytes once, every other tensor op fused into the convolutions (no bytes),
// no launch cost. Per launch: the launches as they are, each at max(unique bytes / bandwidth,
// FLOPs / peak), no launch cost.
double ideal_fused_seconds(const Work& w, const H100Spec& spec);
double ideal_per_launch_seconds(const Work& w, const H100Spec& spec);
double ideal_fused_bytes(const Work& w);

double peak_flops(Math m, const H100Spec& spec);
bool is_parameter_update(const Work& w);   // the work a fused step still has to do once
// A cuDNN convolution on f16 NCHW tensors: priced at cudnn_f16_nchw_factor times its channels-last cost.
bool is_f16_nchw_convolution(const Work& w);

}  // namespace minidl::gpumodel
