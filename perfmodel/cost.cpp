// The per-launch cost model (cost.h).
#include "perfmodel/cost.h"

#include <algorithm>

namespace minidl::gpumodel {
namespace {

double kernel_dram_bytes(const Work& w) { return 32.0 * (w.v[kUniqueSectorsRead] + w.v[kUniqueSectorsWritten]); }

bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

}  // namespace

double peak_flops(Math m, const H100Spec& s) {
  switch (m) {
    case Math::F16Tensor: return s.f16_tensor_flops;
    case Math::Tf32Tensor: return s.tf32_tensor_flops;
    case Math::Fp32: return s.fp32_flops;
    case Math::Fp64: return s.fp64_flops;
    case Math::None: break;
  }
  return s.fp32_flops;
}

bool is_f16_nchw_convolution(const Work& w) {
  return starts_with(w.op, "cuDNN conv") && w.detail == "f16 NCHW";
}

bool is_parameter_update(const Work& w) {
  return starts_with(w.op, "fused_") || w.op == "unscale_grads";
}

Cost model_cost(const Work& w, const std::vector<KernelResources>& table, const H100Spec& s, LaunchMode mode) {
  Cost c;
  c.launch_s = mode == LaunchMode::Eager ? s.launch_eager_s : s.launch_graph_s;
  const double hbm = s.hbm_bytes_per_s * s.hbm_efficiency;
  if (w.kind == Work::Kind::Transfer) {
    const double bytes = w.v[kMinBytes];
    const bool host = w.op.find("HtoD") != std::string::npos || w.op.find("DtoH") != std::string::npos;
    c.dram_bytes = w.op.find("DtoD") != std::string::npos ? 2.0 * bytes : bytes;
    const double t = host ? bytes / s.pcie_bytes_per_s : c.dram_bytes / hbm;
    c.bound = host ? "PCIe" : "HBM";
    c.seconds = t + c.launch_s;
    return c;
  }
  if (w.kind == Work::Kind::Library) {
    c.flops = w.v[kFlops];
    c.dram_bytes = w.v[kMinBytes];
    const double eff = starts_with(w.op, "cuDNN") ? s.cudnn_efficiency : s.cublas_efficiency;
    const double t_math = c.flops / (peak_flops(w.math, s) * eff);
    const double t_mem = c.dram_bytes / hbm;
    c.bound = t_math >= t_mem ? math_name(w.math) : "HBM";
    const double layout = is_f16_nchw_convolution(w) ? s.cudnn_f16_nchw_factor : 1.0;
    c.seconds = std::max(t_math, t_mem) * layout + c.launch_s;
    return c;
  }
  // A kernel of ours.
  c.dram_bytes = kernel_dram_bytes(w);
  c.l2_bytes = 32.0 * (w.v[kGldSectors] + w.v[kGstSectors]);
  KernelUse use;
  use.threads_per_block = w.block_threads;
  use.dynamic_smem = w.dynamic_smem;
  use.static_smem = w.static_smem;
  use.registers = 32;   // when ptxas's report is missing: a typical elementwise kernel
  c.resources = find_kernel(table, w.kernel, w.parameters, &c.exact_instantiation);
  if (c.resources != nullptr) {
    use.registers = c.resources->registers;
    use.static_smem = std::max(use.static_smem, c.resources->static_smem);
  }
  c.occupancy = theoretical_occupancy(use, s);
  const double warps_per_block = (w.block_threads + s.warp_size - 1) / s.warp_size;
  const double grid_warps = w.v[kBlocks] * warps_per_block;
  const double resident = std::min(grid_warps, static_cast<double>(s.sms) * std::max(1, c.occupancy.warps_per_sm));
  const double share = std::min(1.0, resident / (static_cast<double>(s.sms) * s.warps_to_saturate_hbm_per_sm));
  const double latency_bw = hbm * share;
  const double t_dram = c.dram_bytes / latency_bw;
  const double t_l2 = c.l2_bytes / s.l2_bytes_per_s;
  const double wavefronts = w.v[kSharedLdWavefronts] + w.v[kSharedStWavefronts];
  const double t_shared = wavefronts / (static_cast<double>(s.sms) * s.clock_hz);
  const double t = std::max({t_dram, t_l2, t_shared});
  c.bound = t == 0.0 ? "launch" : t == t_shared ? "shared" : t == t_l2 ? "L2" : share < 1.0 ? "latency" : "HBM";
  c.seconds = t + c.launch_s;
  return c;
}

double ideal_per_launch_seconds(const Work& w, const H100Spec& s) {
  if (w.kind == Work::Kind::Kernel) return kernel_dram_bytes(w) / s.hbm_bytes_per_s;
  if (w.kind == Work::Kind::Transfer) {
    const bool host = w.op.find("HtoD") != std::string::npos || w.op.find("DtoH") != std::string::npos;
    return w.v[kMinBytes] / (host ? s.pcie_bytes_per_s : s.hbm_bytes_per_s);
  }
  return std::max(w.v[kFlops] / peak_flops(w.math, s), w.v[kMinBytes] / s.hbm_bytes_per_s);
}

double ideal_fused_bytes(const Work& w) {
  if (w.kind == Work::Kind::Library) return w.v[kMinBytes];
  if (w.kind == Work::Kind::Kernel && is_parameter_update(w)) return kernel_dram_bytes(w);
  return 0.0;
}

double ideal_fused_seconds(const Work& w, const H100Spec& s) {
  if (w.kind == Work::Kind::Library) return ideal_per_launch_seconds(w, s);
  return ideal_fused_bytes(w) / s.hbm_bytes_per_s;
}

}  // namespace minidl::gpumodel
