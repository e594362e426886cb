// The kernel runner's block (runner.cpp runs grids, collectives.cpp the barriers and warp
// collectives): a block's threads as fibers, the warps' pending collectives, and what both files
// use to report a fault or suspend a thread. Internal to the emulated device.
#pragma once
#include "cuda_emu/device_api.h"

#include <boost/context/fiber.hpp>
#include <cstdint>
#include <exception>
#include <string>
#include <vector>

#include "cuda_emu/launch_info.h"
#include "cuda_emu/shared_arena.h"

namespace minidl::cuda::emu::runner_detail {
namespace bctx = boost::context;

enum class Wait { None, Block, Warp };

// The built-in variables of one thread.
struct ThreadCoords {
  uint3 thread_idx;
  uint3 block_idx;
  dim3 block_dim;
  dim3 grid_dim;
};

// Makes `c` the running thread's built-in variables.
inline void enter(const ThreadCoords& c) {
  threadIdx = c.thread_idx;
  blockIdx = c.block_idx;
  blockDim = c.block_dim;
  gridDim = c.grid_dim;
}

struct Fiber {
  ThreadCoords coords{};
  int linear = 0;
  bctx::fiber self;    // the suspended fiber
  bctx::fiber sched;   // the scheduler, while this fiber runs
  bool done = false;
  const void* stack_bottom = nullptr;   // for ASan's fiber-switch annotations
  void* fake_stack = nullptr;
  Wait wait = Wait::None;
  const void* site = nullptr;
  // The pending warp collective.
  WarpOp op = WarpOp::ShflIdx;
  uint64_t value = 0, result = 0;
  int param = 0, width = 32;
};

struct WarpState {
  unsigned arrived = 0, mask = 0;
  WarpOp op = WarpOp::ShflIdx;
  const void* site = nullptr;
  WarpTreeFn tree = nullptr;   // WarpOp::ShflDownTree
};

struct Block {
  const LaunchInfo* info = nullptr;
  std::vector<Fiber> threads;
  std::vector<WarpState> warps;
  int arrived = 0;
  const void* barrier_site = nullptr;
  std::exception_ptr error;
  bool aborting = false;   // a fault: every suspended fiber is resumed to leave through AbortBlock
  bool direct = false;     // LaunchInfo::never_waits: the threads run one after another, without fibers
  SharedArena shared;
};

// Thrown into the suspended fibers of a faulted block so they finish through their own frames
// (rather than Boost's forced unwinding, whose stack switches ASan cannot follow).
struct AbortBlock {};

// The running block and thread of this host thread (null outside a kernel).
extern thread_local Block* t_block;
extern thread_local Fiber* t_fiber;

std::string dim_str(const uint3& d);
std::string dim_str(const dim3& d);
std::string where(const Fiber& f);   // "block (x, y, z) thread (x, y, z)"
// Throws the running kernel's fault: the kernel, its op, `what` and the running thread.
[[noreturn]] void kernel_fault(const std::string& what);
// Collective side: suspends the running thread until its wait is released (a fault under
// MINIDL_LAUNCH_NOWAIT), then makes it the running thread again.
void yield_until_released(Fiber& f);
// Why the block cannot go on: the threads waiting at each collective and those that never come.
std::string deadlock_report(const Block& b);

}  // namespace minidl::cuda::emu::runner_detail
