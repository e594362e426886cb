// The occupancy calculator (occupancy.h), following cuda_occupancy.h's cudaOccMaxActiveBlocksPerMultiprocessor
// for cc 9.0 with the default cache configuration: registers are allocated per warp, rounded up
// to 256, and each of the 4 sub-partitions holds a quarter of the register file; shared memory
// per block is static + dynamic + the 1 KiB the driver reserves, rounded up to 128 bytes.
#include "perfmodel/occupancy.h"

#include <algorithm>
#include <climits>

namespace minidl::gpumodel {
namespace {

int round_up(int x, int unit) { return (x + unit - 1) / unit * unit; }

}  // namespace

Occupancy theoretical_occupancy(const KernelUse& k, const H100Spec& s) {
  Occupancy o;
  if (k.threads_per_block <= 0 || k.threads_per_block > s.max_threads_per_block) {
    o.limiter = "block of " + std::to_string(k.threads_per_block) + " threads is not launchable";
    return o;
  }
  const int warps = (k.threads_per_block + s.warp_size - 1) / s.warp_size;
  o.by_warps = s.max_warps_per_sm / warps;
  o.by_blocks = s.max_blocks_per_sm;

  // Registers: per warp, in allocation units; a block's warps must fit the sub-partitions.
  if (k.registers > s.max_regs_per_thread) {
    o.limiter = "more than " + std::to_string(s.max_regs_per_thread) + " registers per thread";
    return o;
  }
  if (k.registers == 0) {
    o.by_registers = INT_MAX;
  } else {
    const int per_warp = round_up(k.registers * s.warp_size, s.reg_alloc_unit);
    const int per_block_assumed = per_warp * round_up(warps, s.reg_sub_partitions);
    if (per_block_assumed > s.regs_per_sm) {
      o.limiter = "the block needs more registers than an SM has";
      return o;
    }
    const int warps_per_sub = (s.regs_per_sm / s.reg_sub_partitions) / per_warp;
    o.by_registers = warps_per_sub * s.reg_sub_partitions / warps;
  }

  // Shared memory.
  const int limit_per_block = (k.smem_optin ? s.smem_per_block_optin : s.smem_per_block_default) +
                              s.smem_reserved_per_block;
  const int per_block = round_up(k.static_smem + k.dynamic_smem + s.smem_reserved_per_block, s.smem_alloc_unit);
  if (per_block > limit_per_block) {
    o.limiter = "shared memory per block over the limit";
    return o;
  }
  o.by_smem = s.smem_per_sm / per_block;

  o.blocks_per_sm = std::min({o.by_warps, o.by_blocks, o.by_registers, o.by_smem});
  // The first binding limit in the calculator's order of report.
  o.limiter = o.blocks_per_sm == o.by_warps      ? "warps"
              : o.blocks_per_sm == o.by_registers ? "registers"
              : o.blocks_per_sm == o.by_smem      ? "shared memory"
                                                  : "blocks";
  o.warps_per_sm = o.blocks_per_sm * warps;
  o.fraction = static_cast<double>(o.warps_per_sm) / s.max_warps_per_sm;
  return o;
}

}  // namespace minidl::gpumodel
