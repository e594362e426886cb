// Theoretical occupancy of a launch on the H100 (the CUDA occupancy calculator's rules, written
// out so the model needs no GPU): how many blocks of a kernel fit on one SM given its registers
// per thread, its static and dynamic shared memory and its block size, and which limit binds.
#pragma once
#include <string>

#include "perfmodel/h100.h"

namespace minidl::gpumodel {

struct KernelUse {
  int registers = 0;           // per thread, as ptxas reports
  int static_smem = 0;         // bytes per block
  int dynamic_smem = 0;        // bytes per block, the launch's
  int threads_per_block = 0;
  bool smem_optin = false;     // cudaFuncSetAttribute raised the per-block limit (minidl never does)
};

struct Occupancy {
  int blocks_per_sm = 0;       // 0: the launch cannot run (a limit per block is broken)
  int warps_per_sm = 0;        // resident warps = blocks_per_sm * warps per block
  double fraction = 0.0;       // warps_per_sm / max warps per SM
  std::string limiter;         // "warps", "blocks", "registers", "shared memory", or why it cannot run
  // The per-limit block counts, for the table.
  int by_warps = 0, by_blocks = 0, by_registers = 0, by_smem = 0;
};

Occupancy theoretical_occupancy(const KernelUse& k, const H100Spec& spec = {});

}  // namespace minidl::gpumodel
