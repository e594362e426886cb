// Device pieces of the batch-norm kernels, plain and fused with the residual add and ReLU
// (batch_norm.cu forward, batch_norm_backward.cu): the per-channel tensor view, the two layouts'
// walks over x, vector accesses, deterministic per-block reductions and the launch geometry.
// docs/cuda/kernels.md "Fused batch norm + ReLU" explains the passes and why the work is split this way.
#pragma once
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <type_traits>

#include "core/tensor.h"
#include "kernels/cuda/device/common.cuh"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/workspace.h"

namespace minidl::cuda {

// A per-channel tensor ([C], any stride) seen from the device: f32, f64, or absent (fallback).
struct Channel {
  void* p = nullptr;
  int64_t stride = 0;
  bool f64 = false;
  __device__ __forceinline__ double get(int64_t c, double fallback) const {
    if (p == nullptr) return fallback;
    return f64 ? static_cast<const double*>(p)[c * stride] : static_cast<double>(static_cast<const float*>(p)[c * stride]);
  }
  __device__ __forceinline__ void set(int64_t c, double v) const {
    if (p == nullptr) return;
    if (f64) static_cast<double*>(p)[c * stride] = v;
    else static_cast<float*>(p)[c * stride] = static_cast<float>(v);
  }
};

// Checks t ([C] f32/f64 on the GPU, or undefined: absent) and views it.
Channel channel(const Tensor& t, int64_t C, const char* op);

namespace bn {

constexpr int kBlock = 256;   // threads per block of every fused kernel (8 warps)

// x as the kernels see it. Planar: contiguous NCHW with H * W > 1, x[(n * C + c) * S + s]. Rows:
// channels-last (or NCHW with S == 1, the same memory), x[r * C + c] with R = N * H * W rows.
struct Geo {
  int64_t N = 0;   // planar: the batch; rows: the rows R
  int64_t C = 0;
  int64_t S = 1;   // planar: H * W (a multiple of V); rows: 1
  int V = 1;       // elements per vector access (16, 8 or 1 bytes' worth: V divides S or C)
  bool rows = false;
  int cx = 1;      // rows: threads of a block side by side along the channels (a power of 2, <= 32)
  int G = 1;       // blocks per channel (planar) or per channel tile (rows): gridDim.y
  __host__ __device__ int64_t count() const { return N * S; }   // values per channel
};

// Per-channel normalisation y = (x - m) * a + b: m and a from the saved statistics when given
// (invstd), else from running ones (var, eps), a = invstd * weight, b = bias.
struct Affine {
  Channel mean, invstd, var, weight, bias;
  double eps = 0;
  template <typename A>
  __device__ __forceinline__ void at(int64_t c, A& m, A& a, A& b) const {
    const double is = invstd.p != nullptr ? invstd.get(c, 1.0) : 1.0 / ::sqrt(var.get(c, 1.0) + eps);
    m = static_cast<A>(mean.get(c, 0.0));
    a = static_cast<A>(is * weight.get(c, 1.0));
    b = static_cast<A>(bias.get(c, 0.0));
  }
};

// Where the ReLU's mask comes from in a backward pass: none (plain batch norm, or a gradient that
// is already masked), the saved output (y > 0), or x through the forward's own arithmetic.
enum class Mask : int { None, FromY, FromX };

template <typename T, int V>
__device__ __forceinline__ Vec<T, V> load(const T* p, int64_t off) {
  return *reinterpret_cast<const Vec<T, V>*>(p + off);
}
template <typename T, int V>
__device__ __forceinline__ void store(T* p, int64_t off, const Vec<T, V>& v) {
  *reinterpret_cast<Vec<T, V>*>(p + off) = v;
}

// One rounding, never contracted differently by two compilers: the forward and the backward
// (which rebuilds the ReLU's mask) compute z = fma(x - m, a, b) the same way on the GPU and on
// the emulated device.
__device__ __forceinline__ float fma_rn(float a, float b, float c) { return ::fmaf(a, b, c); }
__device__ __forceinline__ double fma_rn(double a, double b, double c) { return ::fma(a, b, c); }

// The pre-activation of one element: fma(x - m, a, b) in the compute type.
template <typename A>
__device__ __forceinline__ A affine(A x, A m, A a, A b) {
  return fma_rn(x - m, a, b);
}

// This thread's channels: planar, channel blockIdx.x (all V lanes); rows, V consecutive channels
// from c0 = (tile * cx + tx) * V, where tx = threadIdx.x % cx. Inactive threads (past C) still
// take part in the block's reductions.
template <bool kRows, int V>
__device__ __forceinline__ int64_t first_channel(const Geo& g, bool& active) {
  if constexpr (kRows) {
    const int64_t c0 = (static_cast<int64_t>(blockIdx.x) * g.cx + threadIdx.x % g.cx) * V;
    active = c0 < g.C;
    return c0;
  } else {
    active = true;
    return blockIdx.x;
  }
}

// Element offset of channel c's first value (the statistics' shift).
__device__ __forceinline__ int64_t first_offset(const Geo& g, int64_t c) { return g.rows ? c : c * g.S; }

// Calls f(offset) for every vector this thread owns. Planar: block (c, k) takes the k-th of G equal
// slices of channel c's N * S / V vectors; its threads stride through the slice by blockDim.x, so
// a warp reads consecutive vectors of one plane (the (n, s) position advances without a division
// per step). Rows: rows blockIdx.y * ry + ty, then every ry * G rows (ry = blockDim.x / cx rows per
// block pass), each at the thread's V channels: a warp reads 32 / cx consecutive rows' channel span.
template <bool kRows, int V, typename F>
__device__ __forceinline__ void walk(const Geo& g, int64_t c0, F&& f) {
  if constexpr (kRows) {
    const int ry = static_cast<int>(blockDim.x) / g.cx;
    const int64_t step = static_cast<int64_t>(ry) * gridDim.y;
    for (int64_t r = static_cast<int64_t>(blockIdx.y) * ry + threadIdx.x / g.cx; r < g.N; r += step) {
      f(r * g.C + c0);
    }
  } else {
    const int64_t SV = g.S / V, NV = g.N * SV;
    const int64_t chunk = (NV + gridDim.y - 1) / gridDim.y;
    const int64_t lo = static_cast<int64_t>(blockIdx.y) * chunk;
    const int64_t hi = NV < lo + chunk ? NV : lo + chunk;
    int64_t i = lo + threadIdx.x;
    if (i >= hi) return;
    int64_t n = i / SV, sv = i % SV;
    const int64_t step = blockDim.x, dn = step / SV, ds = step % SV;
    for (; i < hi; i += step) {
      f(((n * g.C + c0) * SV + sv) * V);
      sv += ds;
      n += dn;
      if (sv >= SV) {
        sv -= SV;
        ++n;
      }
    }
  }
}

// walk() with a thread's loads issued ahead of their use: load(offset) reads one position's
// operands (the vectors it returns), use(offset, loaded) computes and stores. Channels-last rows are
// taken kUnroll at a time, their loads first, so a thread keeps kUnroll loads in flight instead of
// one: an 8-byte row access (batch_norm_rows_bytes) with one load in flight leaves 16 KB a fully
// occupied SM waiting on memory, about half of what HBM's latency asks for (Little's law), and the
// H200 measured these kernels at 35-69% of its bandwidth against 79% for the two-operand
// binary_vec_kernel (lab/results/bench/gpu_check_2026-11-26_ab67ceb.md). The positions are used in walk()'s order,
// so every sum adds the same values in the same order: the same bits. The planar walk (and U = 1)
// is walk().
constexpr int kUnroll = 4;   // the statistics, the apply and the backward's pass 2 (pass 1: see there)
// The four walking kernels are compiled for at least this many resident blocks per SM (half of
// an SM's warps; __launch_bounds__ caps their registers at 64): kUnroll loads in flight per thread
// need registers, and without the cap the backward's pass 2 took 93 and fitted two blocks.
constexpr int kMinBlocks = 4;
// U: positions a thread loads ahead. kUnroll for rows of 8-byte accesses and narrower (the default,
// batch_norm_rows_bytes); one, as before, for 16-byte rows (MINIDL_CUDA_BN_ROWS_BYTES=16), whose
// kernels already need more than 64 registers with one. The minimum of resident blocks follows.
template <typename T, int V>
__host__ __device__ constexpr bool wide_rows() {
  return sizeof(T) * V > 8;
}
template <typename T, int V>
__host__ __device__ constexpr int unroll_for() {
  return wide_rows<T, V>() ? 1 : kUnroll;
}
template <typename T, int V, bool kRows>
__host__ __device__ constexpr int min_blocks_for() {
  return kRows && wide_rows<T, V>() ? 1 : kMinBlocks;
}
template <bool kRows, int V, int U, typename Load, typename Use>
__device__ __forceinline__ void walk_loaded(const Geo& g, int64_t c0, Load&& load, Use&& use) {
  if constexpr (kRows && U > 1) {
    using Loaded = decltype(load(int64_t{0}));
    const int ry = static_cast<int>(blockDim.x) / g.cx;
    const int64_t step = static_cast<int64_t>(ry) * gridDim.y;
    int64_t r = static_cast<int64_t>(blockIdx.y) * ry + threadIdx.x / g.cx;
    for (; r + (U - 1) * step < g.N; r += U * step) {
      Loaded v[U];
#pragma unroll
      for (int u = 0; u < U; ++u) v[u] = load((r + u * step) * g.C + c0);
#pragma unroll
      for (int u = 0; u < U; ++u) use((r + u * step) * g.C + c0, v[u]);
    }
    for (; r < g.N; r += step) use(r * g.C + c0, load(r * g.C + c0));
  } else {
    walk<kRows, V>(g, c0, [&](int64_t off) { use(off, load(off)); });
  }
}

// The vectors of up to three operands at one position, for walk_loaded's load: an absent operand
// (nullptr) is not read, and its vector is never used.
template <typename T, int V>
struct Operands {
  Vec<T, V> v[3];
};
template <typename T, int V>
__device__ __forceinline__ Operands<T, V> load_operands(int64_t off, const T* a, const T* b = nullptr,
                                                         const T* c = nullptr) {
  Operands<T, V> o;
  o.v[0] = load<T, V>(a, off);
  if (b != nullptr) o.v[1] = load<T, V>(b, off);
  if (c != nullptr) o.v[2] = load<T, V>(c, off);
  return o;
}

// Per-thread sums of two quantities per lane: a few values in the compute type A, then into double
// every kFlush vectors, so f32 rounding never builds up over a long walk.
template <typename A, int L>
struct PairSums {
  static constexpr int kFlush = 8;
  double s[L], q[L];
  A fs[L], fq[L];
  int pending = 0;
  __device__ __forceinline__ PairSums() {
#pragma unroll
    for (int j = 0; j < L; ++j) {
      s[j] = q[j] = 0;
      fs[j] = fq[j] = A(0);
    }
  }
  __device__ __forceinline__ void flush() {
#pragma unroll
    for (int j = 0; j < L; ++j) {
      s[j] += static_cast<double>(fs[j]);
      q[j] += static_cast<double>(fq[j]);
      fs[j] = fq[j] = A(0);
    }
    pending = 0;
  }
  __device__ __forceinline__ void end_vector() {
    if (++pending == kFlush) flush();
  }
};

// Writes the block's totals of s and q per channel to part[(blockIdx.y * C + c) * 2 + {0, 1}], in
// a fixed order (no atomics): planar, one tree over the block; rows, a shuffle tree over the
// threads of one warp that share tx, then the warps in order through shared memory.
template <bool kRows, int L, typename A>
__device__ __forceinline__ void write_block_sums(PairSums<A, L>& ps, const Geo& g, int64_t c0, double* part) {
  ps.flush();
  if constexpr (!kRows) {
    MINIDL_SHARED_ARRAY(double, scratch, 32);
    const double s = block_sum<double>(ps.s[0], scratch);
    const double q = block_sum<double>(ps.q[0], scratch);
    if (threadIdx.x == 0) {
      part[(static_cast<int64_t>(blockIdx.y) * g.C + c0) * 2] = s;
      part[(static_cast<int64_t>(blockIdx.y) * g.C + c0) * 2 + 1] = q;
    }
  } else {
    MINIDL_SHARED_ARRAY(double, sh, (kBlock / 32) * 32 * 8);   // warps x (cx * L <= 256) channels
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = blockDim.x >> 5;
    const int width = g.cx * L;
    const int64_t tile0 = static_cast<int64_t>(blockIdx.x) * width;   // the tile's first channel
    for (int which = 0; which < 2; ++which) {
      double v[L];
#pragma unroll
      for (int j = 0; j < L; ++j) v[j] = which == 0 ? ps.s[j] : ps.q[j];
#if defined(MINIDL_CUDA_EMU) && MINIDL_EMU_WARP_TREES   // the same tree as one collective (common.cuh)
      ::minidl::cuda::emu::warp_shfl_down_sums(v, g.cx);
#else
      for (int o = 16; o >= g.cx; o >>= 1) {
#pragma unroll
        for (int j = 0; j < L; ++j) v[j] += __shfl_down_sync(0xffffffffu, v[j], o);
      }
#endif
      __syncthreads();   // the previous round's reads are done
      if (lane < g.cx) {
#pragma unroll
        for (int j = 0; j < L; ++j) sh[warp * width + lane * L + j] = v[j];
      }
      __syncthreads();
      const int t = threadIdx.x;
      if (t < width && tile0 + t < g.C) {
        double total = 0;
        for (int w = 0; w < nwarps; ++w) total += sh[w * width + t];
        part[(static_cast<int64_t>(blockIdx.y) * g.C + tile0 + t) * 2 + which] = total;
      }
    }
    (void)c0;
  }
}

// The partials buffer of a forward: G x C pairs (s, q), then each channel's shift K (its first
// value, written by the statistics pass) so the finalize never reads x.
__host__ __device__ inline int64_t shift_index(const Geo& g, int64_t c) { return int64_t{g.G} * g.C * 2 + c; }

// Channel c's totals of the G partial pairs part[(k * C + c) * 2 + {0, 1}], summed by P lanes (a
// warp, P = 32, or the whole block, P = kBlock): lane l adds k = l, l + P, ... in order, then a fixed
// shuffle (and shared-memory) tree: deterministic, no atomics. One thread per channel summing G
// partials serially was latency-bound (the step-time model's "latency" rows); a warp per channel
// still was with channels-last grids, whose channels have up to 2048 partials each (every channel
// of a tile gets all of the tile's G blocks): the six finalize kernels took 2.3 ms of a ResNet-50
// AMP step at batch 256 on an H100, 0.6 ms in NCHW. finalize_lanes() picks P. Valid in
// lane 0 of the channel's lanes.
template <int P, typename SharedT>
__device__ __forceinline__ void channel_totals(const Geo& g, const double* part, int64_t c, double& s, double& q,
                                               SharedT scratch) {
  s = 0;
  q = 0;
  for (int k = static_cast<int>(threadIdx.x & (P - 1)); k < g.G; k += P) {
    s += part[(static_cast<int64_t>(k) * g.C + c) * 2];
    q += part[(static_cast<int64_t>(k) * g.C + c) * 2 + 1];
  }
  if constexpr (P == 32) {
    s = warp_sum(s);
    q = warp_sum(q);
    (void)scratch;
  } else {
    s = block_sum<double>(s, scratch);
    q = block_sum<double>(q, scratch);
  }
}

// Lanes per channel of the finalize kernels: a warp for up to 128 partials (4 each), else a block.
inline int finalize_lanes(const Geo& g) { return g.G > 128 ? kBlock : 32; }

// A loop over channels for P lanes each: P = 32, warp w of the grid takes c = w, w + warps, ...;
// P = kBlock, block b takes c = b, b + blocks, ... (all of a channel's lanes run the same
// iterations, so their shuffles and barriers see every lane). Launch with finalize_grid().
#define MINIDL_CHANNEL_STRIDE(P, c, n)                                                          \
  for (int64_t c = (P) == 32 ? (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5  \
                             : static_cast<int64_t>(blockIdx.x);                                    \
       c < (n); c += (P) == 32 ? (static_cast<int64_t>(blockDim.x) * gridDim.x) >> 5 : gridDim.x)
inline unsigned finalize_grid(const Geo& g, int P) {
  return P == 32 ? grid_for(g.C * 32) : static_cast<unsigned>(std::min<int64_t>(std::max<int64_t>(g.C, 1), 65535));
}

// Calls f(integral_constant P) with finalize_lanes(g).
template <typename F>
void with_finalize_lanes(const Geo& g, F&& f) {
  if (finalize_lanes(g) == 32) f(std::integral_constant<int, 32>{});
  else f(std::integral_constant<int, kBlock>{});
}

// Host side: the layout, vector width and grid of one call (every tensor in `same` must share x's
// shape, dtype and layout). split > 0 forces G (tests use it to run several blocks per channel on
// small tensors); 0 sizes G to fill the GPU.
Geo geometry(const Tensor& x, std::initializer_list<const Tensor*> same, const char* op);
dim3 grid_of(const Geo& g);
// The temporaries of one forward / backward call with geometry g (workspace.h): the kernels
// allocate exactly these, and the meta device's model of a GPU asks for the same numbers.
BatchNormScratch forward_scratch(const Geo& g, DType dt, bool training, bool keeps_mean, bool keeps_invstd);
BatchNormScratch backward_scratch(const Geo& g, int64_t numel, bool training, bool wants_gweight, bool wants_gbias,
                                  bool with_residual);

// Calls f(T{}, integral_constant V, bool_constant rows) for the kernels' instantiations: f16 and
// bf16 with V 8/4/1, f32 4/2/1, f64 1 (f64 is the reference dtype: no vector path).
template <typename F>
void dispatch(const Geo& g, DType dt, const char* op, F&& f) {
  auto rows = [&](auto tag, auto v) {
    if (g.rows) f(tag, v, std::true_type{});
    else f(tag, v, std::false_type{});
  };
  using I1 = std::integral_constant<int, 1>;
  using I2 = std::integral_constant<int, 2>;
  using I4 = std::integral_constant<int, 4>;
  using I8 = std::integral_constant<int, 8>;
  switch (dt) {
    case DType::f16:
      if (g.V == 8) return rows(__half{}, I8{});
      if (g.V == 4) return rows(__half{}, I4{});
      return rows(__half{}, I1{});
    case DType::bf16:
      if (g.V == 8) return rows(__nv_bfloat16{}, I8{});
      if (g.V == 4) return rows(__nv_bfloat16{}, I4{});
      return rows(__nv_bfloat16{}, I1{});
    case DType::f32:
      if (g.V == 4) return rows(float{}, I4{});
      if (g.V == 2) return rows(float{}, I2{});
      return rows(float{}, I1{});
    case DType::f64: return rows(double{}, I1{});
    default:
      MINIDL_FAIL(op, " (cuda): x must be f32, f64, f16 or bf16, got ", dtype_name(dt), "; convert with .to(DType::f32)");
  }
}

}  // namespace bn
}  // namespace minidl::cuda
