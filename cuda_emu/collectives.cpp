// The emulated device's collectives (runner_block.h): __syncthreads and the warp shuffles and
// votes. A thread that arrives records its part and waits; the last to arrive completes the
// collective (a shuffle's values exchanged with the hardware's width and lane rules) and releases
// the others. What cannot complete is reported by deadlock_report, naming the threads.
// First: the device language's definitions must precede the CUDA headers (as with -include).
#include "cuda_emu/device_api.h"

#include <algorithm>
#include <sstream>
#include <string>

#include "cuda_emu/access_recorder.h"
#include "cuda_emu/runner_block.h"

namespace minidl::cuda::emu {
namespace runner_detail {
namespace {

unsigned lanes_present(const Block& b, int warp) {
  const int n = std::min<int>(32, static_cast<int>(b.threads.size()) - warp * 32);
  return n >= 32 ? ~0u : (1u << n) - 1u;
}

// The lane whose value lane `l` reads, or -1 for its own value.
int shuffle_source(WarpOp op, int l, int param, int width) {
  const int seg = l & ~(width - 1);
  switch (op) {
    case WarpOp::ShflIdx: return seg + (param & (width - 1));
    case WarpOp::ShflUp: return (l - seg) >= param ? l - param : -1;
    case WarpOp::ShflDown: return (l - seg) + param < width ? l + param : -1;
    case WarpOp::ShflXor: {
      const int s = l ^ param;
      return s >= seg + width ? -1 : s;
    }
    default: return -1;
  }
}

// A shuffle-down tree (warp_tree): every lane's array, then the tree over them all, in place.
void complete_tree(Fiber* lanes, WarpState& w) {
  void* arrays[32];
  for (int l = 0; l < 32; ++l) {
    if (lanes[l].param != lanes[0].param) {
      t_fiber = &lanes[l];
      kernel_fault("lanes of one warp run shuffle-down trees to different depths (" + std::to_string(lanes[0].param) +
                   " and " + std::to_string(lanes[l].param) + ")");
    }
    arrays[l] = reinterpret_cast<void*>(static_cast<uintptr_t>(lanes[l].value));
  }
  w.tree(arrays, lanes[0].param);
  for (int l = 0; l < 32; ++l) lanes[l].wait = Wait::None;
}

void complete_warp(Block& b, int warp, WarpState& w) {
  Fiber* lanes = &b.threads[static_cast<size_t>(warp) * 32];
  if (w.op == WarpOp::ShflDownTree) {
    complete_tree(lanes, w);
    w.arrived = 0;
    recorder_warp_collective();
    return;
  }
  const bool vote = w.op == WarpOp::Ballot || w.op == WarpOp::Any || w.op == WarpOp::All;
  uint64_t ballot = 0;
  for (int l = 0; l < 32; ++l) {
    if ((w.mask >> l) & 1u) ballot |= (lanes[l].value != 0 ? 1ull : 0ull) << l;
  }
  for (int l = 0; l < 32; ++l) {
    if (((w.mask >> l) & 1u) == 0) continue;
    Fiber& f = lanes[l];
    if (vote) {
      f.result = w.op == WarpOp::Ballot ? ballot : w.op == WarpOp::Any ? (ballot != 0) : (ballot == w.mask);
    } else {
      int src = shuffle_source(w.op, l, f.param, f.width);
      if (src < 0) src = l;
      if (((w.mask >> src) & 1u) == 0) {
        t_fiber = &f;
        kernel_fault("lane " + std::to_string(l) + " reads lane " + std::to_string(src) +
                     ", which is not in the shuffle's mask 0x" + [&] {
                       std::ostringstream os;
                       os << std::hex << w.mask;
                       return os.str();
                     }() + " (its value is undefined)");
      }
      f.result = lanes[src].value;
    }
    f.wait = Wait::None;
  }
  w.arrived = 0;
  recorder_warp_collective();
}

}  // namespace

// Why the block cannot go on: the threads waiting at each collective and those that never come.
std::string deadlock_report(const Block& b) {
  std::ostringstream os;
  int waiting_block = 0;
  for (const Fiber& f : b.threads) waiting_block += f.wait == Wait::Block;
  if (waiting_block > 0) {
    os << "__syncthreads() not reached by every thread of the block: " << waiting_block << " of "
       << b.threads.size() << " wait there";
    for (const Fiber& f : b.threads) {
      if (f.done) {
        os << "; thread " << dim_str(f.coords.thread_idx) << " exited without it";
        break;
      }
      if (f.wait == Wait::Warp) {
        os << "; thread " << dim_str(f.coords.thread_idx) << " waits at a warp collective";
        break;
      }
    }
    return os.str() + " [block " + dim_str(b.threads[0].coords.block_idx) + "]";
  }
  for (size_t w = 0; w < b.warps.size(); ++w) {
    const WarpState& ws = b.warps[w];
    if (ws.arrived == 0) continue;
    for (int l = 0; l < 32; ++l) {
      if (((ws.mask >> l) & 1u) == 0 || ((ws.arrived >> l) & 1u) != 0) continue;
      const Fiber& f = b.threads[w * 32 + static_cast<size_t>(l)];
      os << "a warp collective's mask 0x" << std::hex << ws.mask << std::dec << " names lane " << l
         << ", which does not take part (" << (f.done ? "it exited" : "it waits elsewhere") << ") [" << where(f)
         << "]";
      return os.str();
    }
  }
  return "the block's threads wait at collectives that can never complete";
}

}  // namespace runner_detail

using namespace runner_detail;

void syncthreads(const void* site) {
  Block& b = *t_block;
  Fiber& f = *t_fiber;
  if (b.arrived == 0) {
    b.barrier_site = site;
  } else if (site != b.barrier_site) {
    kernel_fault("threads of one block wait at two different __syncthreads() calls (a barrier in divergent code)");
  }
  f.wait = Wait::Block;
  if (++b.arrived == static_cast<int>(b.threads.size())) {
    for (Fiber& g : b.threads) g.wait = Wait::None;
    b.arrived = 0;
    recorder_barrier();
  }
  yield_until_released(f);
}

namespace {

// The running lane's arrival at a warp collective; it returns once the collective has completed.
void arrive(WarpOp op, unsigned mask, uint64_t value, int param, int width, WarpTreeFn tree, const void* site) {
  Block& b = *t_block;
  Fiber& f = *t_fiber;
  const int lane = f.linear & 31, warp = f.linear >> 5;
  // Built only for a report: an ostringstream per lane and collective was a quarter of the time an
  // emulated ResNet-50 step spent (its batch-norm reductions shuffle in every warp).
  const auto mask_hex = [mask] {
    std::ostringstream m;
    m << "0x" << std::hex << mask;
    return m.str();
  };
  if (((mask >> lane) & 1u) == 0) kernel_fault("warp collective with mask " + mask_hex() + " called by lane " +
                                               std::to_string(lane) + ", which the mask does not name");
  if ((mask & ~lanes_present(b, warp)) != 0) {
    kernel_fault("warp collective mask " + mask_hex() + " names lanes that do not exist (the block has " +
                 std::to_string(b.threads.size()) + " threads)");
  }
  if (width < 1 || width > 32 || (width & (width - 1)) != 0) {
    kernel_fault("shuffle width " + std::to_string(width) + " is not a power of two in [1, 32]");
  }
  WarpState& w = b.warps[static_cast<size_t>(warp)];
  if (w.arrived == 0) {
    w.mask = mask;
    w.op = op;
    w.site = site;
    w.tree = tree;
  } else if (w.mask != mask || w.op != op || w.site != site) {
    kernel_fault("lanes of one warp are in different warp collectives at once (mask " + mask_hex() +
                 "): divergent shuffles or votes");
  }
  f.op = op;
  f.value = value;
  f.param = param;
  f.width = width;
  f.wait = Wait::Warp;
  w.arrived |= 1u << lane;
  if (w.arrived == w.mask) complete_warp(b, warp, w);
  yield_until_released(f);
}

}  // namespace

uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int param, int width, const void* site) {
  arrive(op, mask, value, param, width, nullptr, site);
  return t_fiber->result;
}

void warp_tree(void* values, WarpTreeFn tree, int last, const void* site) {
  arrive(WarpOp::ShflDownTree, 0xffffffffu, reinterpret_cast<uintptr_t>(values), last, 32, tree, site);
}

}  // namespace minidl::cuda::emu
