// Device-side building blocks shared by the hand-written kernels: the C++ type of each DType,
// conversions that round exactly as the CPU backend does (double -> float -> half or bfloat16,
// round to nearest even), the strided offset calculator, warp/block reductions and launch sizing.
#pragma once
#include <algorithm>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <array>
#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"
#include "kernels/common/dispatch.h"

namespace minidl::cuda {

// ---- Types ----

template <typename T>
struct Compute { using type = T; };   // arithmetic type of T
template <>
struct Compute<__half> { using type = float; };
template <>
struct Compute<__nv_bfloat16> { using type = float; };

template <typename To, typename From>
__device__ __forceinline__ To cvt(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (std::is_same_v<From, __half>) {
    return cvt<To>(__half2float(v));
  } else if constexpr (std::is_same_v<From, __nv_bfloat16>) {
    return cvt<To>(__bfloat162float(v));
  } else if constexpr (std::is_same_v<To, __half>) {
    if constexpr (std::is_same_v<From, bool>) return __float2half_rn(v ? 1.0f : 0.0f);
    else return __float2half_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, __nv_bfloat16>) {
    if constexpr (std::is_same_v<From, bool>) return __float2bfloat16_rn(v ? 1.0f : 0.0f);
    else return __float2bfloat16_rn(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From{};
  } else {
    return static_cast<To>(v);
  }
}

// Dtype dispatch (kernels/common/dispatch.h): dispatch_x(dtype, op, f) calls f(T{}) with T the
// C++ type of the dtype, __half for f16 and __nv_bfloat16 for bf16 (both computed in f32,
// Compute). The same names take the same dtypes on the CPU backend.
inline constexpr common::Dispatch<__half, common::DTypeFamily::All, __nv_bfloat16> dispatch_all{"cuda"};
inline constexpr common::Dispatch<__half, common::DTypeFamily::Floating, __nv_bfloat16> dispatch_floating{"cuda"};
inline constexpr common::Dispatch<__half, common::DTypeFamily::Arith, __nv_bfloat16> dispatch_arith{"cuda"};
// f32 and f64 only, for the kernels that widen 16-bit operands to f32 before they dispatch (softmax, NLL).
inline constexpr common::Dispatch<void, common::DTypeFamily::Floating> dispatch_wide{"cuda"};

// ---- Strided iteration ----

constexpr int kMaxDims = 12;

// Maps a row-major linear index over a shape to element offsets of N operands. Built on the host
// with size-1 dims dropped and contiguous runs merged, so most tensors end up with 1-2 dims.
template <int N>
struct OffsetCalc {
  int ndim = 0;
  int64_t sizes[kMaxDims];
  int64_t strides[kMaxDims][N];

  __device__ __forceinline__ void get(int64_t lin, int64_t (&off)[N]) const {
#pragma unroll
    for (int k = 0; k < N; ++k) off[k] = 0;
    for (int d = ndim - 1; d >= 0; --d) {
      const int64_t i = lin % sizes[d];
      lin /= sizes[d];
#pragma unroll
      for (int k = 0; k < N; ++k) off[k] += i * strides[d][k];
    }
  }
  // Whether every operand is contiguous (one dim of stride 1, or nothing to iterate).
  bool contiguous() const {
    if (ndim == 0) return true;
    if (ndim > 1) return false;
    for (int k = 0; k < N; ++k) {
      if (strides[0][k] != 1) return false;
    }
    return true;
  }
};

template <int N>
OffsetCalc<N> make_offset_calc(const Shape& shape, const std::array<const Shape*, N>& strides, const char* op) {
  std::vector<int64_t> sz;
  std::array<std::vector<int64_t>, N> st;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;
    sz.push_back(shape[d]);
    for (int k = 0; k < N; ++k) st[k].push_back((*strides[k])[d]);
  }
  for (size_t i = sz.size(); i-- > 1;) {   // merge dim i into i-1 when all operands allow it
    bool ok = true;
    for (int k = 0; k < N; ++k) ok = ok && st[k][i - 1] == st[k][i] * sz[i];
    if (!ok) continue;
    sz[i - 1] *= sz[i];
    sz.erase(sz.begin() + static_cast<int64_t>(i));
    for (int k = 0; k < N; ++k) {
      st[k][i - 1] = st[k][i];
      st[k].erase(st[k].begin() + static_cast<int64_t>(i));
    }
  }
  MINIDL_CHECK(static_cast<int>(sz.size()) <= kMaxDims, op, " (cuda): ", sz.size(),
               " non-mergeable dims after coalescing, at most ", kMaxDims, " are supported; make the operand "
               "contiguous first (shape ", shape_str(shape), ")");
  OffsetCalc<N> c;
  c.ndim = static_cast<int>(sz.size());
  for (int d = 0; d < c.ndim; ++d) {
    c.sizes[d] = sz[d];
    for (int k = 0; k < N; ++k) c.strides[d][k] = st[k][d];
  }
  return c;
}

// make_offset_calc over the dims in operand 0's memory order (largest stride first, stable), for
// the elementwise ops, whose visiting order is free: channels-last operands of a channels-last
// output merge into one contiguous dim (the vector kernels), a broadcast bias into two. A
// contiguous operand 0 keeps the logical order, so NCHW calls are unchanged.
template <int N>
OffsetCalc<N> make_elementwise_calc(const Shape& shape, const std::array<const Shape*, N>& strides, const char* op) {
  std::vector<size_t> order(shape.size());
  for (size_t d = 0; d < order.size(); ++d) order[d] = d;
  const Shape& lead = *strides[0];
  std::stable_sort(order.begin(), order.end(), [&](size_t a, size_t b) { return lead[a] > lead[b]; });
  Shape sorted_shape(shape.size());
  std::array<Shape, N> sorted;
  std::array<const Shape*, N> ptrs;
  for (int k = 0; k < N; ++k) {
    // push_back, not resize + assignment: GCC 12 warned of a bogus 2^64-byte memset in resize's
    // inlined fill (-Wstringop-overflow) when this header was compiled for the emulator.
    sorted[k].reserve(order.size());
    for (const size_t d : order) sorted[k].push_back((*strides[k])[d]);
    ptrs[k] = &sorted[k];
  }
  for (size_t d = 0; d < order.size(); ++d) sorted_shape[d] = shape[order[d]];
  return make_offset_calc<N>(sorted_shape, ptrs, op);
}

// ---- Vector accesses ----

// V elements read or written as one access (16 bytes for V = vec_width<T>()).
template <typename T, int V>
struct alignas(sizeof(T) * V) Vec {
  T v[V];
};

template <typename T>
__host__ __device__ constexpr int vec_width() { return 16 / static_cast<int>(sizeof(T)) > 0 ? 16 / static_cast<int>(sizeof(T)) : 1; }

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

// ---- Launch sizing ----

constexpr int kThreads = 256;

// Blocks for a grid-stride loop over n items: enough to fill the GPU, never more than needed.
inline unsigned grid_for(int64_t n, int threads = kThreads) {
  const int64_t want = (n + threads - 1) / threads;
  const int64_t cap = int64_t{132} * 32;   // ~32 blocks per SM of an H100; loops cover the rest
  return static_cast<unsigned>(std::max<int64_t>(1, std::min(want, cap)));
}

#define MINIDL_GRID_STRIDE(i, n)                                                                      \
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < (n);              \
       i += static_cast<int64_t>(blockDim.x) * gridDim.x)

// ---- Reductions ----

// The sum of the full warp's values in lane 0 (a shuffle-down tree; the emulated device runs the
// tree as one collective with the same additions: MINIDL_EMU_WARP_TREES in cuda_emu/device_api.h).
template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
#if defined(MINIDL_CUDA_EMU) && MINIDL_EMU_WARP_TREES
  T a[1] = {v};
  ::minidl::cuda::emu::warp_shfl_down_sums(a, 1);
  return a[0];
#else
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xffffffffu, v, o);
  return v;
#endif
}

// Sum over the block (blockDim.x a multiple of 32, at most 1024); the result is valid in thread 0.
// `scratch` holds 32 values of T in shared memory (a T* under nvcc, a checked view in the emulator).
template <typename T, typename SharedT>
__device__ __forceinline__ T block_sum(T v, SharedT scratch) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  v = warp_sum(v);
  __syncthreads();   // scratch may still be read by a previous call
  if (lane == 0) scratch[warp] = v;
  __syncthreads();
  const int nwarps = (blockDim.x + 31) >> 5;
  v = threadIdx.x < nwarps ? scratch[threadIdx.x] : T(0);
  if (warp == 0) v = warp_sum(v);
  return v;
}

}  // namespace minidl::cuda
