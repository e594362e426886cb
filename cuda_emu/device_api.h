// The CUDA device language for the emulated build, force-included (-include) before anything else
// when g++ compiles kernels/cuda/*.cu: the qualifiers, the built-in variables (threadIdx, ... of
// the running fiber), __syncthreads, warp shuffles and votes, atomics and the intrinsics our
// kernels use. Each collective is a barrier of the fiber scheduler (runner.cpp).
#pragma once

// Before any CUDA header: host_defines.h keeps these when they are already defined.
#define __host__
#define __device__
#define __global__
// Shared memory is declared with MINIDL_SHARED_ARRAY / MINIDL_SHARED_VAR (device/shared.cuh), whose
// accesses the runner checks; a bare __shared__ does not compile here.
#define __shared__                                                                              \
  static_assert(false, "emulated device: declare shared memory with MINIDL_SHARED_ARRAY or " \
                       "MINIDL_SHARED_VAR (kernels/cuda/device/shared.cuh)");
#define __constant__ static
#define __launch_bounds__(...)   // a register budget for ptxas: nothing to the emulated device

#include <cuda_runtime_api.h>
#include <vector_functions.h>
#include <vector_types.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace minidl::cuda::emu {

// Collectives: each returns once every participant has arrived (or reports a fault).
void syncthreads(const void* site);
enum class WarpOp : int { ShflIdx, ShflUp, ShflDown, ShflXor, Ballot, Any, All, ShflDownTree };
uint64_t warp_collective(WarpOp op, unsigned mask, uint64_t value, int param, int width, const void* site);

// A whole shuffle-down tree as one collective of the full warp (MINIDL_EMU_WARP_TREES below): each
// lane arrives with its array of values, and the last to arrive runs `tree` over the 32 lanes'
// arrays, which computes in place what the shuffles one by one would leave in each lane.
using WarpTreeFn = void (*)(void* const* lanes, int last);
void warp_tree(void* values, WarpTreeFn tree, int last, const void* site);

// for (o = 16; o >= last; o >>= 1) for each j: v[j] += __shfl_down_sync(0xffffffff, v[j], o), in
// every lane at once: lane l reads lane l + o's value from before the round, or its own where
// l + o is past the warp, and adds it to its own (the order the shuffles give, in T).
template <typename T, int L>
void shfl_down_tree(void* const* lanes, int last) {
  T v[32][L], before[32][L];
  for (int l = 0; l < 32; ++l) std::memcpy(static_cast<void*>(v[l]), lanes[l], sizeof(v[l]));
  for (int o = 16; o >= last; o >>= 1) {
    std::memcpy(static_cast<void*>(before), static_cast<const void*>(v), sizeof(v));
    for (int l = 0; l < 32; ++l)
      for (int j = 0; j < L; ++j) v[l][j] += before[l + o < 32 ? l + o : l][j];
  }
  for (int l = 0; l < 32; ++l) std::memcpy(lanes[l], static_cast<const void*>(v[l]), sizeof(v[l]));
}

// What kernels call (common.cuh, batch_norm.cuh): out of line, so that the site is the caller's,
// as for a shuffle.
template <typename T, int L>
__attribute__((noinline)) void warp_shfl_down_sums(T (&v)[L], int last) {
  warp_tree(v, shfl_down_tree<T, L>, last, __builtin_return_address(0));
}

}  // namespace minidl::cuda::emu

// The emulated device's test build runs a kernel's shuffle-down trees (warp_sum and batch norm's
// per-channel sums) as one collective each (kernels/cuda/device/common.cuh): one by one, each
// shuffle costs every lane two fiber switches, which was about half the time of an emulated
// ResNet step. The profiling build (minidl_emu_prof, __SANITIZE_THREAD__), whose counts price the
// shuffles for the step-time model, and the GPU run them one by one.
#if !defined(__SANITIZE_THREAD__)
#define MINIDL_EMU_WARP_TREES 1
#else
#define MINIDL_EMU_WARP_TREES 0
#endif

namespace minidl::cuda::emu {

template <typename T>
inline T shfl(WarpOp op, unsigned mask, T v, int param, int width, const void* site) {
  static_assert(std::is_trivially_copyable_v<T> && sizeof(T) <= 8, "shuffles move values of at most 8 bytes");
  uint64_t bits = 0;
  std::memcpy(&bits, &v, sizeof(T));
  bits = warp_collective(op, mask, bits, param, width, site);
  T r;
  std::memcpy(static_cast<void*>(&r), &bits, sizeof(T));
  return r;
}

}  // namespace minidl::cuda::emu

// cuda_runtime.h's overloads that take the kernel itself, which it declares for nvcc only.
template <class T>
inline cudaError_t cudaFuncSetAttribute(T* func, cudaFuncAttribute attr, int value) {
  return ::cudaFuncSetAttribute(reinterpret_cast<const void*>(func), attr, value);
}
template <class T>
inline cudaError_t cudaFuncGetAttributes(cudaFuncAttributes* attr, T* func) {
  return ::cudaFuncGetAttributes(attr, reinterpret_cast<const void*>(func));
}

// The built-in variables, set by the scheduler to the running fiber's before each resume (plain
// variables, not macros: cuda_runtime.h names parameters gridDim and blockDim).
extern thread_local uint3 threadIdx, blockIdx;
extern thread_local dim3 blockDim, gridDim;
constexpr int warpSize = 32;

// The call site tells the scheduler whether every thread waits at the same barrier.
__attribute__((noinline)) inline void __syncthreads() {
  ::minidl::cuda::emu::syncthreads(__builtin_return_address(0));
}

#define MINIDL_EMU_SHFL(name, op)                                                                          \
  template <typename T>                                                                                     \
  __attribute__((noinline)) T name(unsigned mask, T v, int param, int width = 32) {                        \
    return ::minidl::cuda::emu::shfl(::minidl::cuda::emu::WarpOp::op, mask, v, param, width,               \
                                     __builtin_return_address(0));                                          \
  }
MINIDL_EMU_SHFL(__shfl_sync, ShflIdx)
MINIDL_EMU_SHFL(__shfl_up_sync, ShflUp)
MINIDL_EMU_SHFL(__shfl_down_sync, ShflDown)
MINIDL_EMU_SHFL(__shfl_xor_sync, ShflXor)
#undef MINIDL_EMU_SHFL

__attribute__((noinline)) inline unsigned __ballot_sync(unsigned mask, int pred) {
  return static_cast<unsigned>(::minidl::cuda::emu::warp_collective(
      ::minidl::cuda::emu::WarpOp::Ballot, mask, pred != 0, 0, 32, __builtin_return_address(0)));
}
__attribute__((noinline)) inline int __any_sync(unsigned mask, int pred) {
  return static_cast<int>(::minidl::cuda::emu::warp_collective(::minidl::cuda::emu::WarpOp::Any, mask, pred != 0, 0,
                                                               32, __builtin_return_address(0)));
}
__attribute__((noinline)) inline int __all_sync(unsigned mask, int pred) {
  return static_cast<int>(::minidl::cuda::emu::warp_collective(::minidl::cuda::emu::WarpOp::All, mask, pred != 0, 0,
                                                               32, __builtin_return_address(0)));
}

// ---- Atomics: the fibers of a launch share one OS thread, but two host threads may launch at once.
// In the profiling build (minidl_emu_prof: -fsanitize=thread instrumentation, __SANITIZE_THREAD__)
// each atomic is one reported access at its call site, as on the GPU (one RED/ATOM instruction),
// not the plain loads and compare-exchanges the emulation is made of: the functions are out of
// line, uninstrumented, and report the address they return to.
#if defined(__SANITIZE_THREAD__)
namespace minidl::cuda::emu {
void record_device_atomic(const void* p, size_t n, const void* pc);
}  // namespace minidl::cuda::emu
#define MINIDL_EMU_ATOMIC inline __attribute__((noinline, no_sanitize_thread))
#define MINIDL_EMU_ATOMIC_HELPER inline __attribute__((no_sanitize_thread))
#define MINIDL_EMU_NOTE_ATOMIC(p) \
  ::minidl::cuda::emu::record_device_atomic(p, sizeof(*(p)), __builtin_return_address(0))
#else
#define MINIDL_EMU_ATOMIC inline
#define MINIDL_EMU_ATOMIC_HELPER inline
#define MINIDL_EMU_NOTE_ATOMIC(p) ((void)0)
#endif

template <typename T>
MINIDL_EMU_ATOMIC T atomicAdd(T* p, T v) {
  MINIDL_EMU_NOTE_ATOMIC(p);
  return __atomic_fetch_add(p, v, __ATOMIC_RELAXED);
}
// Floating point has no fetch-add builtin: a compare-exchange loop, as CUDA documents for double.
template <typename F>
MINIDL_EMU_ATOMIC_HELPER F atomic_add_float(F* p, F v) {
  F old = *p, want;
  do {
    want = old + v;
  } while (!__atomic_compare_exchange(p, &old, &want, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED));
  return old;
}
MINIDL_EMU_ATOMIC float atomicAdd(float* p, float v) {
  MINIDL_EMU_NOTE_ATOMIC(p);
  return atomic_add_float(p, v);
}
MINIDL_EMU_ATOMIC double atomicAdd(double* p, double v) {
  MINIDL_EMU_NOTE_ATOMIC(p);
  return atomic_add_float(p, v);
}
template <typename T>
MINIDL_EMU_ATOMIC T atomicMin(T* p, T v) {
  MINIDL_EMU_NOTE_ATOMIC(p);
  T old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (v < old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
template <typename T>
MINIDL_EMU_ATOMIC T atomicMax(T* p, T v) {
  MINIDL_EMU_NOTE_ATOMIC(p);
  T old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (v > old && !__atomic_compare_exchange_n(p, &old, v, false, __ATOMIC_RELAXED, __ATOMIC_RELAXED)) {
  }
  return old;
}
template <typename T>
MINIDL_EMU_ATOMIC T atomicExch(T* p, T v) {
  MINIDL_EMU_NOTE_ATOMIC(p);
  return __atomic_exchange_n(p, v, __ATOMIC_RELAXED);
}

// ---- Intrinsics: IEEE round-to-nearest single operations (the _rn ones), bit casts, loads.

inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return std::sqrt(a); }
inline double __dadd_rn(double a, double b) { return a + b; }
inline double __dmul_rn(double a, double b) { return a * b; }
inline float __expf(float x) { return std::exp(x); }   // the GPU's is an approximation (2 ulp)
inline float __logf(float x) { return std::log(x); }
inline double __longlong_as_double(long long v) {
  double d;
  std::memcpy(&d, &v, 8);
  return d;
}
inline long long __double_as_longlong(double d) {
  long long v;
  std::memcpy(&v, &d, 8);
  return v;
}
inline int __float_as_int(float f) {
  int v;
  std::memcpy(&v, &f, 4);
  return v;
}
inline float __int_as_float(int v) {
  float f;
  std::memcpy(&f, &v, 4);
  return f;
}
template <typename T>
inline T __ldg(const T* p) {
  return *p;
}
using std::isfinite;
using std::isinf;
using std::isnan;
