// The kernel runner of the emulated device: a grid runs block after block; a block's threads are
// Boost.Context fibers that the scheduler resumes in turn until each finishes or waits at a
// collective (__syncthreads, a warp shuffle or vote: collectives.cpp). When no thread can run and
// some have not finished, the collective can never complete: a divergent __syncthreads or a
// shuffle mask naming a lane that does not take part. Those and launch configurations the hardware
// rejects are reported, naming the kernel, block and thread.
// First: the device language's definitions must precede the CUDA headers (as with -include).
#include "cuda_emu/device_api.h"
// Then this file's own header.
#include "cuda_emu/runner.h"

#include <sys/mman.h>

#include <algorithm>
#include <boost/context/fiber.hpp>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "core/error.h"

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/common_interface_defs.h>
#endif
#include "cuda_emu/access_recorder.h"
#include "cuda_emu/profiler.h"
#include "cuda_emu/runner_block.h"
#include "cuda_emu/runtime_state.h"
#include "cuda_emu/shared_arena.h"

thread_local uint3 threadIdx, blockIdx;
thread_local dim3 blockDim, gridDim;

namespace minidl::cuda::emu {
using namespace runner_detail;

namespace {

// Fiber stacks, mapped once per OS thread with a guard page below each and reused by every block.
constexpr size_t kStackBytes = size_t{128} << 10;
struct StackPool {
  bctx::stack_context allocate() {
    auto& free = free_list();
    char* base;
    if (!free.empty()) {
      base = free.back();
      free.pop_back();
    } else {
      void* p = mmap(nullptr, kStackBytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
      MINIDL_CHECK(p != MAP_FAILED, "emulated CUDA device: cannot map a fiber stack of ", kStackBytes, " bytes");
      mprotect(p, 4096, PROT_NONE);   // overflowing the stack faults instead of corrupting a neighbour
      base = static_cast<char*>(p);
    }
    bctx::stack_context sc;
    sc.size = kStackBytes;
    sc.sp = base + kStackBytes;
    last_stack() = base;
    return sc;
  }
  void deallocate(bctx::stack_context& sc) noexcept { free_list().push_back(static_cast<char*>(sc.sp) - sc.size); }
  // The stack the last allocate() gave (the fiber constructor calls it), for ASan's switch notes.
  static char*& last_stack() {
    static thread_local char* p = nullptr;
    return p;
  }
  static std::vector<char*>& free_list() {
    static thread_local std::vector<char*> free;
    return free;
  }
};

// Every stack switch is announced to ASan in its build (ASan must know which stack is live, or an
// exception thrown on a fiber stack looks like a stack overflow); no-ops otherwise.
#if defined(__SANITIZE_ADDRESS__)
thread_local const void* t_sched_bottom = nullptr;
thread_local size_t t_sched_size = 0;
void entered_fiber(Fiber& f) { __sanitizer_finish_switch_fiber(f.fake_stack, &t_sched_bottom, &t_sched_size); }
void leaving_fiber(Fiber& f, bool finished) {
  __sanitizer_start_switch_fiber(finished ? nullptr : &f.fake_stack, t_sched_bottom, t_sched_size);
}
#else
void entered_fiber(Fiber&) {}
void leaving_fiber(Fiber&, bool) {}
#endif

// Scheduler side: runs `f` until it waits or finishes.
void resume(Fiber& f) {
#if defined(__SANITIZE_ADDRESS__)
  void* fake = nullptr;
  __sanitizer_start_switch_fiber(&fake, f.stack_bottom, kStackBytes);
  f.self = std::move(f.self).resume();
  __sanitizer_finish_switch_fiber(fake, nullptr, nullptr);
#else
  f.self = std::move(f.self).resume();
#endif
}

uint64_t initial_seed() {
  const char* s = std::getenv("MINIDL_EMU_SCHEDULE");
  return s != nullptr ? std::strtoull(s, nullptr, 10) : 0;
}
uint64_t g_seed = initial_seed();
// MINIDL_EMU_TRACE=1 prints each launch (kernel, op, grid, block) to stderr: which kernels a test runs.
const bool g_trace = [] {
  const char* s = std::getenv("MINIDL_EMU_TRACE");
  return s != nullptr && std::string(s) == "1";
}();

}  // namespace

namespace runner_detail {

thread_local Block* t_block = nullptr;
thread_local Fiber* t_fiber = nullptr;

std::string dim_str(const uint3& d) {
  std::ostringstream os;
  os << "(" << d.x << ", " << d.y << ", " << d.z << ")";
  return os.str();
}
std::string dim_str(const dim3& d) { return dim_str(uint3{d.x, d.y, d.z}); }

std::string where(const Fiber& f) {
  return "block " + dim_str(f.coords.block_idx) + " thread " + dim_str(f.coords.thread_idx);
}

[[noreturn]] void kernel_fault(const std::string& what) {
  const Block& b = *t_block;
  MINIDL_FAIL("CUDA kernel ", b.info->kernel, " (", b.info->op, ") on the emulated device: ", what,
              t_fiber != nullptr ? " [" + where(*t_fiber) + "]" : std::string());
}

void yield_until_released(Fiber& f) {
  if (f.wait != Wait::None && t_block->direct)
    kernel_fault("a thread must wait at a __syncthreads() or warp collective, but the kernel was launched with "
                 "MINIDL_LAUNCH_NOWAIT (its threads run one after another): launch it with MINIDL_LAUNCH");
  while (f.wait != Wait::None) {
    leaving_fiber(f, false);
    f.sched = std::move(f.sched).resume();
    entered_fiber(f);
    if (t_block->aborting) throw AbortBlock{};
  }
  t_fiber = &f;
  t_record_thread = f.linear;
  enter(f.coords);
}

}  // namespace runner_detail

namespace {

// Resumes every suspended fiber of a faulted block so it leaves through AbortBlock.
void abort_block(Block& b) {
  b.aborting = true;
  for (Fiber& f : b.threads) {
    if (f.done || !f.self) continue;
    t_fiber = &f;
    resume(f);
  }
  t_fiber = nullptr;
}

std::string config_error(const LaunchInfo& info) {
  const dim3 g = info.grid, bl = info.block;
  const uint64_t threads = uint64_t{bl.x} * bl.y * bl.z;
  std::string why;
  if (g.x == 0 || g.y == 0 || g.z == 0 || threads == 0) why = "an empty grid or block";
  else if (bl.x > 1024 || bl.y > 1024 || bl.z > 64 || threads > 1024) why = "more than 1024 threads per block";
  else if (g.x > 2147483647u || g.y > 65535u || g.z > 65535u) why = "grid y or z over 65535 (or x over 2^31 - 1)";
  else if (const size_t limit = max_dynamic_shared(info.func); info.smem > limit) {
    why = limit == kSharedLimit
              ? "more than 48 KiB of dynamic shared memory without the opt-in attribute (cudaFuncSetAttribute("
                "kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes), up to 227 KiB on an H100)"
              : "more than the " + std::to_string(limit) +
                    " bytes of dynamic shared memory cudaFuncSetAttribute allowed this kernel";
  }
  if (why.empty()) return why;
  return "kernel " + std::string(info.kernel) + " launched with grid " + dim_str(g) + ", block " + dim_str(bl) +
         ", " + std::to_string(info.smem) + " bytes of dynamic shared memory: " + why;
}

}  // namespace

void set_schedule_seed(uint64_t seed) { g_seed = seed; }
uint64_t schedule_seed() { return g_seed; }

SharedArena& running_arena(const char* what) {
  MINIDL_CHECK(t_block != nullptr, what, ": used outside a kernel of the emulated device");
  return t_block->shared;
}

void running_kernel_fault(const std::string& what) { kernel_fault(what); }

namespace {
void execute_grid(const LaunchInfo& info, void (*body)(void*), void* arg);
}  // namespace

void run_grid_erased(const LaunchInfo& info, void (*body)(void*), std::shared_ptr<void> arg) {
  if (device_error() != cudaSuccess) return;   // a faulted device: the launch check reports the fault
  // A launch the hardware rejects runs nothing and leaves the error for cudaGetLastError.
  if (const std::string why = config_error(info); !why.empty()) return set_last_error(cudaErrorInvalidConfiguration, why);
  if (!stream_live(info.stream)) {
    return set_last_error(cudaErrorInvalidResourceHandle,
                          "kernel " + std::string(info.kernel) + " launched on a stream that is not live");
  }
  MINIDL_CHECK(t_block == nullptr, "emulated CUDA device: kernel ", info.kernel, " launched from inside a kernel");
  if (g_trace) {
    std::fprintf(stderr, "[minidl emu] launch %s (%s) grid %s block %s\n", info.kernel, info.op,
                 dim_str(info.grid).c_str(), dim_str(info.block).c_str());
  }
  LaunchInfo issued = info;
  issued.profiled = profiling();   // launches issued while profiling is on are counted when they run
  enqueue(info.stream, [issued, body, arg = std::move(arg)] { execute_grid(issued, body, arg.get()); },
          "kernel " + std::string(info.kernel) + " (" + info.op + ")");
}

namespace {
// Makes a thread's fiber at its first turn, not when its block starts: a thread that finishes
// without waiting gives its stack back before the next one starts, so the threads of a block that
// never waits all run on one stack, warm in the cache, in the scheduler's order.
void start(Fiber& f, Block& b, void (*body)(void*), void* arg) {
  f.self = bctx::fiber(std::allocator_arg, StackPool{}, [&f, body, arg, &b](bctx::fiber&& s) {
    f.sched = std::move(s);
    entered_fiber(f);
    try {
      body(arg);
    } catch (const AbortBlock&) {   // the block faulted elsewhere: just finish
    } catch (...) {
      if (!b.error) b.error = std::current_exception();
    }
    f.done = true;
    f.wait = Wait::None;
    leaving_fiber(f, true);
    return std::move(f.sched);
  });
  f.stack_bottom = StackPool::last_stack();
}

// A block's threads on fibers: each runs until it finishes or waits at a collective, in index
// order (a seeded shuffle under MINIDL_EMU_SCHEDULE), round after round until all have finished.
void run_block_on_fibers(Block& b, std::vector<int>& order, std::mt19937_64& rng, void (*body)(void*), void* arg) {
  for (;;) {
    if (g_seed != 0) std::shuffle(order.begin(), order.end(), rng);
    bool ran = false, all_done = true;
    for (int t : order) {
      Fiber& f = b.threads[static_cast<size_t>(t)];
      if (f.done) continue;
      all_done = false;
      if (f.wait != Wait::None) continue;
      if (!f.self) start(f, b, body, arg);   // its first turn
      t_fiber = &f;
      t_record_thread = f.linear;
      enter(f.coords);
      resume(f);
      ran = true;
      if (b.error) {
        abort_block(b);
        std::rethrow_exception(b.error);
      }
    }
    if (all_done) return;
    if (!ran) {
      t_fiber = nullptr;
      const std::string why = deadlock_report(b);
      abort_block(b);
      kernel_fault(why);
    }
  }
}

// The built-in variables of thread t (linear index) of block `block`.
ThreadCoords coords_of(const LaunchInfo& info, int t, const uint3& block) {
  const unsigned u = static_cast<unsigned>(t);
  return {uint3{u % info.block.x, u / info.block.x % info.block.y, u / (info.block.x * info.block.y)}, block,
          info.block, info.grid};
}

// A block of a kernel that never waits (MINIDL_LAUNCH_NOWAIT): each thread runs to its end on this
// stack, in the order of the fibers' first round (the generator advanced as their two rounds
// advance it), so the schedule, and all the threads compute, is what fibers give, without a
// fiber's creation and two stack switches a thread (most of an elementwise kernel's cost here).
// One record serves every thread in turn: nothing waits, so nothing else reads the others.
void run_block_directly(Block& b, const uint3& block, std::vector<int>& order, std::mt19937_64& rng,
                        void (*body)(void*), void* arg) {
  const LaunchInfo& info = *b.info;
  const int nthreads = static_cast<int>(b.threads.size());
  if (g_seed != 0) {
    for (int t = 0; t < nthreads; ++t) order[static_cast<size_t>(t)] = t;
    std::shuffle(order.begin(), order.end(), rng);
  }
  Fiber& f = b.threads[0];
  t_fiber = &f;
  for (int i = 0; i < nthreads; ++i) {
    const int t = g_seed != 0 ? order[static_cast<size_t>(i)] : i;
    f.linear = t;
    f.coords = coords_of(info, t, block);
    t_record_thread = t;
    enter(f.coords);
    body(arg);   // a fault propagates: no thread waits to be released
  }
  if (g_seed != 0) std::shuffle(order.begin(), order.end(), rng);
}

void execute_grid(const LaunchInfo& info, void (*body)(void*), void* arg) {
  const int nthreads = static_cast<int>(info.block.x * info.block.y * info.block.z);
  Block b;
  b.info = &info;
  b.direct = info.never_waits;
  b.threads.resize(static_cast<size_t>(nthreads));
  b.warps.resize(static_cast<size_t>((nthreads + 31) / 32));
  b.shared.start_launch(info.smem, max_dynamic_shared(info.func) > kSharedLimit ? kSharedOptInLimit : kSharedLimit);
  std::vector<int> order(static_cast<size_t>(nthreads));
  std::mt19937_64 rng(g_seed);
  struct Reset {
    ~Reset() {
      t_block = nullptr;
      t_fiber = nullptr;
      recorder_launch_abort();   // after a fault (a finished launch has handed its recorder on)
    }
  } reset;
  t_block = &b;
  recorder_launch_begin(info, nthreads);
  for (unsigned bz = 0; bz < info.grid.z; ++bz) {
    for (unsigned by = 0; by < info.grid.y; ++by) {
      for (unsigned bx = 0; bx < info.grid.x; ++bx) {
        b.shared.start_block();   // shared memory nothing of this block wrote
        const uint3 block{bx, by, bz};
        if (b.direct) {
          run_block_directly(b, block, order, rng, body, arg);
          recorder_block_end();
          continue;
        }
        for (int t = 0; t < nthreads; ++t) {
          Fiber& f = b.threads[static_cast<size_t>(t)];
          f = Fiber{};
          f.linear = t;
          f.coords = coords_of(info, t, block);
          order[static_cast<size_t>(t)] = t;
        }
        for (WarpState& w : b.warps) w = WarpState{};
        b.arrived = 0;
        run_block_on_fibers(b, order, rng, body, arg);
        recorder_block_end();
      }
    }
  }
  note_static_shared(info.func, b.shared.static_bytes());
  recorder_launch_end(b.shared.static_bytes());
}

}  // namespace

}  // namespace minidl::cuda::emu
