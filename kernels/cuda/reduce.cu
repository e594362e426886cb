// CUDA reductions over any set of dims of a strided tensor: one block per output, threads stride
// over the reduced elements, and warp shuffles combine them. An output with many elements and few
// outputs beside it (a whole-tensor sum) is split across blocks: each block reduces one chunk into
// a partial, and a second kernel combines an output's partials in chunk order. The split depends
// on the shape only (reduce_chunks), never on the GPU, so the bits are the same everywhere. The
// first H100 run measured a whole-tensor sum of 256 MiB at 2 GB/s on one block
// (lab/results/bench/gpu_check_2026-11-26_bbe331e.md). Many short outputs (a global average pool's
// 7x7) take a warp each instead of a block (reduce_warp_kernel); sums over one stride whose
// outputs lie side by side (the channels-last pool) a thread each (reduce_cols_kernel). Reduced
// elements that lie contiguously are read without the offset calculator. Sums accumulate in
// double (floating: f32, f64, f16) or int64 as on the CPU; max/min keep the first extreme index
// and let NaN win, as PyTorch does.
#include <algorithm>
#include <limits>

#include "kernels/cuda/context.cuh"
#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/device/common.cuh"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/workspace.h"

namespace minidl::cuda {
namespace {

// Offsets of the kept (outputs) and reduced dims of x, each in row-major order; each output's R
// reduced elements in `splits` chunks of `chunk` (the last one shorter).
struct ReduceGeom {
  OffsetCalc<1> kept, red;
  int64_t O, R;
  int64_t splits, chunk;
  bool contiguous;   // an output's reduced element r is at its base + r
};

// A split output's partial: the chunk's sum, or its (best, index).
constexpr size_t kPartialBytes = 16;
template <typename T>
struct BestAt {
  T v;
  int64_t i;
};
static_assert(sizeof(BestAt<double>) == kPartialBytes && sizeof(BestAt<int64_t>) == kPartialBytes);

template <typename C>
__device__ __forceinline__ bool is_nan(C v) {
  if constexpr (std::is_floating_point_v<C>) return ::isnan(v);
  else return false;
}

// (best, idx) candidates: NaN beats numbers (first NaN wins), then the extreme, then the lower index.
// Values compare in T's compute type (f16 as f32).
template <typename T>
__device__ __forceinline__ bool better(bool is_max, T vt, int64_t i, T bt, int64_t bi) {
  using C = typename Compute<T>::type;
  if (bi < 0) return i >= 0;
  if (i < 0) return false;
  const C v = cvt<C>(vt), best = cvt<C>(bt);
  const bool vn = is_nan(v), bn = is_nan(best);
  if (vn || bn) return vn && (!bn || i < bi);
  if (v == best) return i < bi;
  return is_max ? v > best : v < best;
}

template <typename T>
__device__ __forceinline__ T load_reduced(const T* xo, const ReduceGeom& g, int64_t r) {
  if (g.contiguous) return xo[r];
  int64_t off[1];
  g.red.get(r, off);
  return xo[off[0]];
}

// max/min (and arg) of elements r0, r0 + step, ... below end, then across the warp: lane 0 holds
// the warp's (best, index), by better()'s rules; bi = -1 for a warp that saw nothing.
template <typename T>
__device__ __forceinline__ void warp_extreme(bool is_max, const T* xo, const ReduceGeom& g, int64_t r0, int64_t end,
                                             int64_t step, T& best, int64_t& bi) {
  best = cvt<T>(0.0f);
  bi = -1;
  for (int64_t r = r0; r < end; r += step) {
    const T v = load_reduced(xo, g, r);
    if (better<T>(is_max, v, r, best, bi)) {
      best = v;
      bi = r;
    }
  }
#pragma unroll
  for (int d = 16; d > 0; d >>= 1) {
    const T ov = __shfl_down_sync(0xffffffffu, best, d);
    const int64_t oi = __shfl_down_sync(0xffffffffu, bi, d);
    if (better<T>(is_max, ov, oi, best, bi)) {
      best = ov;
      bi = oi;
    }
  }
}

template <typename Out, typename Acc>
__device__ __forceinline__ void write_sum(ReduceOp op, Acc s, int64_t R, Out* out) {
  if (op == ReduceOp::Mean) {
    const double m = R > 0 ? static_cast<double>(s) / static_cast<double>(R) : __longlong_as_double(0x7ff8000000000000LL);
    *out = cvt<Out>(m);
  } else {
    *out = cvt<Out>(s);
  }
}

// Work item w: output w / splits, chunk w % splits. With one split the block writes the output;
// with more, its partial (combine_kernel finishes).
template <typename T, typename Out>
__global__ void reduce_kernel(ReduceOp op, const T* x, ReduceGeom g, Out* out, void* partials) {
  using Acc = std::conditional_t<std::is_integral_v<T>, int64_t, double>;   // f16 sums in double too
  MINIDL_SHARED_ARRAY(Acc, s_sum, 32);
  MINIDL_SHARED_ARRAY(T, s_best, 32);
  MINIDL_SHARED_ARRAY(int64_t, s_idx, 32);
  const bool ext = op != ReduceOp::Sum && op != ReduceOp::Mean;
  const bool is_max = op == ReduceOp::Max || op == ReduceOp::ArgMax;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t w = blockIdx.x; w < g.O * g.splits; w += gridDim.x) {
    const int64_t o = w / g.splits, begin = (w % g.splits) * g.chunk;
    const int64_t end = begin + g.chunk < g.R ? begin + g.chunk : g.R;
    int64_t base[1];
    g.kept.get(o, base);
    const T* xo = x + base[0];
    if (!ext) {
      // Four loads in flight before their adds (the same additions in the same order as one at a
      // time): a thread's loads, not its adds, bound a memory-bound reduction.
      Acc s = 0;
      const int64_t step = blockDim.x;
      int64_t r = begin + threadIdx.x;
      for (; r + 3 * step < end; r += 4 * step) {
        const T v0 = load_reduced(xo, g, r), v1 = load_reduced(xo, g, r + step);
        const T v2 = load_reduced(xo, g, r + 2 * step), v3 = load_reduced(xo, g, r + 3 * step);
        s += cvt<Acc>(v0);
        s += cvt<Acc>(v1);
        s += cvt<Acc>(v2);
        s += cvt<Acc>(v3);
      }
      for (; r < end; r += step) s += cvt<Acc>(load_reduced(xo, g, r));
      s = block_sum<Acc>(s, s_sum);
      if (threadIdx.x == 0) {
        if (g.splits == 1) write_sum<Out>(op, s, g.R, out + o);
        else static_cast<Acc*>(partials)[2 * w] = s;   // 16-byte slots
      }
      __syncthreads();
      continue;
    }
    T best;
    int64_t bi;
    warp_extreme(is_max, xo, g, begin + threadIdx.x, end, blockDim.x, best, bi);
    __syncthreads();
    if (lane == 0) {
      s_best[warp] = best;
      s_idx[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int k = 1; k < static_cast<int>(blockDim.x >> 5); ++k) {
        if (better<T>(is_max, s_best[k], s_idx[k], best, bi)) {
          best = s_best[k];
          bi = s_idx[k];
        }
      }
      if (g.splits > 1) static_cast<BestAt<T>*>(partials)[w] = {best, bi};
      else if (op == ReduceOp::ArgMax || op == ReduceOp::ArgMin) out[o] = cvt<Out>(bi);
      else out[o] = cvt<Out>(best);
    }
    __syncthreads();
  }
}

// Outputs of few elements each (up to kWarpR, e.g. a global average pool's 7x7), many of them:
// a warp per output, kBlockWarps outputs per block, lanes striding over the elements and shuffles
// combining them (no shared memory, no barrier), where reduce_kernel would spend a whole block
// and two barriers on 49 elements.
constexpr int64_t kWarpR = 128;
constexpr int kBlockWarps = 8;
template <typename T, typename Out>
__global__ void reduce_warp_kernel(ReduceOp op, const T* x, ReduceGeom g, Out* out) {
  using Acc = std::conditional_t<std::is_integral_v<T>, int64_t, double>;
  const bool ext = op != ReduceOp::Sum && op != ReduceOp::Mean;
  const bool is_max = op == ReduceOp::Max || op == ReduceOp::ArgMax;
  const int lane = threadIdx.x & 31;
  const int64_t warps = static_cast<int64_t>(gridDim.x) * (blockDim.x >> 5);
  for (int64_t o = static_cast<int64_t>(blockIdx.x) * (blockDim.x >> 5) + (threadIdx.x >> 5); o < g.O; o += warps) {
    int64_t base[1];
    g.kept.get(o, base);
    const T* xo = x + base[0];
    if (!ext) {
      Acc s = 0;
      for (int64_t r = lane; r < g.R; r += 32) s += cvt<Acc>(load_reduced(xo, g, r));
      s = warp_sum(s);
      if (lane == 0) write_sum<Out>(op, s, g.R, out + o);
      continue;
    }
    T best;
    int64_t bi;
    warp_extreme(is_max, xo, g, lane, g.R, 32, best, bi);
    if (lane == 0) out[o] = (op == ReduceOp::ArgMax || op == ReduceOp::ArgMin) ? cvt<Out>(bi) : cvt<Out>(best);
  }
}

// Sums whose outputs lie side by side in memory and whose reduced elements share one stride (a
// channels-last global average pool: output (n, c) sums x[n][h][w][c] over h, w, stride C): a
// thread per output, adding its elements in order, so a warp reads 32 neighbouring values at each
// step. A warp per output there read 32 values C apart (one sector each): 342 µs for ResNet-50's
// pool at batch 256 on an H100, against 20 µs for PyTorch's.
template <typename T, typename Out>
__global__ void reduce_cols_kernel(ReduceOp op, const T* x, ReduceGeom g, Out* out) {
  using Acc = std::conditional_t<std::is_integral_v<T>, int64_t, double>;
  const int64_t rs = g.red.strides[0][0];
  MINIDL_GRID_STRIDE(o, g.O) {
    int64_t base[1];
    g.kept.get(o, base);
    const T* xo = x + base[0];
    Acc s = 0;
    int64_t r = 0;
    for (; r + 3 < g.R; r += 4) {   // four loads in flight, added in order
      const T v0 = xo[r * rs], v1 = xo[(r + 1) * rs], v2 = xo[(r + 2) * rs], v3 = xo[(r + 3) * rs];
      s += cvt<Acc>(v0);
      s += cvt<Acc>(v1);
      s += cvt<Acc>(v2);
      s += cvt<Acc>(v3);
    }
    for (; r < g.R; ++r) s += cvt<Acc>(xo[r * rs]);
    write_sum<Out>(op, s, g.R, out + o);
  }
}

// Whether a sum takes reduce_cols_kernel: one chunk, the reduced elements along one stride, and the
// outputs' innermost dim contiguous and at least a warp wide; short outputs (at most kShortR
// elements), or enough outputs to fill the GPU with threads (kManyO) for up to kColsR each; fewer
// and longer ones keep a block each (a thread would add thousands of values alone).
constexpr int64_t kShortR = 128, kManyO = 16384, kColsR = 4096;
bool column_sum(ReduceOp op, const ReduceGeom& g) {
  if (op != ReduceOp::Sum && op != ReduceOp::Mean) return false;
  if (g.splits != 1 || g.red.ndim != 1 || g.kept.ndim < 1) return false;
  if (g.R > kColsR || (g.R > kShortR && g.O < kManyO)) return false;
  const int inner = g.kept.ndim - 1;
  return g.kept.strides[inner][0] == 1 && g.kept.sizes[inner] >= 32 && g.red.strides[0][0] != 1;
}

// A split output's partials, combined in chunk order by one thread: the same bits on every run.
template <typename T, typename Out>
__global__ void combine_kernel(ReduceOp op, ReduceGeom g, const void* partials, Out* out) {
  using Acc = std::conditional_t<std::is_integral_v<T>, int64_t, double>;
  const bool ext = op != ReduceOp::Sum && op != ReduceOp::Mean;
  const bool is_max = op == ReduceOp::Max || op == ReduceOp::ArgMax;
  for (int64_t o = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; o < g.O;
       o += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (!ext) {
      const Acc* p = static_cast<const Acc*>(partials) + 2 * o * g.splits;
      Acc s = 0;
      for (int64_t k = 0; k < g.splits; ++k) s += p[2 * k];
      write_sum<Out>(op, s, g.R, out + o);
      continue;
    }
    const BestAt<T>* p = static_cast<const BestAt<T>*>(partials) + o * g.splits;
    T best = p[0].v;
    int64_t bi = p[0].i;
    for (int64_t k = 1; k < g.splits; ++k) {
      if (better<T>(is_max, p[k].v, p[k].i, best, bi)) {
        best = p[k].v;
        bi = p[k].i;
      }
    }
    out[o] = (op == ReduceOp::ArgMax || op == ReduceOp::ArgMin) ? cvt<Out>(bi) : cvt<Out>(best);
  }
}

template <typename T, typename Out>
void launch(DeviceContext& ctx, ReduceOp op, const Tensor& x, const ReduceGeom& g, const Tensor& out) {
  if (column_sum(op, g)) {
    MINIDL_LAUNCH("reduce", (reduce_cols_kernel<T, Out>), grid_for(g.O), kThreads, 0, ctx.stream(), op,
                  static_cast<const T*>(x.data_ptr()), g, static_cast<Out*>(out.data_ptr()));
    return;
  }
  if (g.splits == 1 && g.R <= kWarpR && g.O >= 2 * kBlockWarps) {
    const int64_t want = (g.O + kBlockWarps - 1) / kBlockWarps;
    const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(want, int64_t{1} << 20));
    MINIDL_LAUNCH("reduce", (reduce_warp_kernel<T, Out>), blocks, 32 * kBlockWarps, 0, ctx.stream(), op,
                  static_cast<const T*>(x.data_ptr()), g, static_cast<Out*>(out.data_ptr()));
    return;
  }
  int threads = 32;
  while (threads < 256 && threads < g.chunk) threads *= 2;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(g.O * g.splits, int64_t{1} << 20));
  const DeviceBuffer partials(ctx, g.splits > 1 ? static_cast<size_t>(g.O * g.splits) * kPartialBytes : 0);
  MINIDL_LAUNCH("reduce", (reduce_kernel<T, Out>), blocks, threads, 0, ctx.stream(), op,
                static_cast<const T*>(x.data_ptr()), g, static_cast<Out*>(out.data_ptr()), partials.get());
  if (g.splits == 1) return;
  const unsigned cblocks = static_cast<unsigned>(std::min<int64_t>((g.O + 255) / 256, 4096));
  MINIDL_LAUNCH("reduce combine", (combine_kernel<T, Out>), cblocks, 256, 0, ctx.stream(), op, g,
                static_cast<const void*>(partials.get()), static_cast<Out*>(out.data_ptr()));
}

// (splits, chunk) of each output's R reduced elements. Fewer outputs than about a thousand blocks'
// worth, each with at least 16 K elements: chunks of at least 8 K elements (a multiple of 8, so each
// starts as aligned as the first), enough to give the GPU about 1024 blocks; otherwise one chunk.
std::pair<int64_t, int64_t> reduce_chunks(int64_t outputs, int64_t reduced) {
  constexpr int64_t kBlocks = 1024, kMinChunk = 8192;
  if (outputs <= 0 || outputs >= kBlocks || reduced < 2 * kMinChunk) return {1, reduced};
  const int64_t want = std::min((kBlocks + outputs - 1) / outputs, reduced / kMinChunk);
  const int64_t chunk = ((reduced + want - 1) / want + 7) / 8 * 8;
  return {(reduced + chunk - 1) / chunk, chunk};
}

int64_t outputs_of(const Shape& shape, const std::vector<int64_t>& dims, int64_t* reduced) {
  int64_t o = 1, r = 1;
  for (int64_t d = 0; d < static_cast<int64_t>(shape.size()); ++d)
    (std::find(dims.begin(), dims.end(), d) != dims.end() ? r : o) *= shape[static_cast<size_t>(d)];
  *reduced = r;
  return o;
}

}  // namespace

size_t reduce_scratch_bytes(const Tensor& x, const std::vector<int64_t>& dims) {
  int64_t r = 0;
  const int64_t o = outputs_of(x.shape(), dims, &r);
  const int64_t splits = reduce_chunks(o, r).first;
  return splits > 1 ? static_cast<size_t>(o * splits) * kPartialBytes : 0;
}

void CudaBackend::reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, const Tensor& out) {
  const char* name = op == ReduceOp::Sum ? "sum" : op == ReduceOp::Mean ? "mean" : op == ReduceOp::Max ? "max"
                   : op == ReduceOp::Min ? "min" : op == ReduceOp::ArgMax ? "argmax" : "argmin";
  check_cuda(name, {&x, &out});
  check_contiguous(name, {&out});
  Shape ks, kst, rs, rst;
  for (int64_t d = 0; d < x.dim(); ++d) {
    const bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
    (reduced ? rs : ks).push_back(x.shape()[d]);
    (reduced ? rst : kst).push_back(x.strides()[d]);
  }
  const int64_t O = numel_of(ks), R = numel_of(rs);
  const auto [splits, chunk] = reduce_chunks(O, R);
  ReduceGeom g{make_offset_calc<1>(ks, {&kst}, name), make_offset_calc<1>(rs, {&rst}, name), O, R, splits, chunk,
               false};
  g.contiguous = g.red.contiguous();   // the reduced dims merge into one of stride 1 (or none)
  MINIDL_CHECK(out.numel() == g.O, name, " (cuda): output ", out.meta(), " should have ", g.O, " elements");
  if (g.O == 0) return;
  DeviceContext& ctx = context_of(x);
  dispatch_arith(x.dtype(), name, [&](auto tag) {
    using T = decltype(tag);
    {
      switch (op) {
        case ReduceOp::Sum:
        case ReduceOp::Mean:
          switch (out.dtype()) {
            case DType::f32: return launch<T, float>(ctx, op, x, g, out);
            case DType::f64: return launch<T, double>(ctx, op, x, g, out);
            case DType::i32: return launch<T, int32_t>(ctx, op, x, g, out);
            case DType::i64: return launch<T, int64_t>(ctx, op, x, g, out);
            case DType::f16: return launch<T, __half>(ctx, op, x, g, out);
            case DType::bf16: return launch<T, __nv_bfloat16>(ctx, op, x, g, out);
            default: MINIDL_FAIL(name, " (cuda): unsupported output dtype ", out.meta());
          }
        case ReduceOp::Max:
        case ReduceOp::Min:
          MINIDL_CHECK(out.dtype() == x.dtype(), name, " (cuda): output ", out.meta(), " must have x's dtype");
          return launch<T, T>(ctx, op, x, g, out);
        case ReduceOp::ArgMax:
        case ReduceOp::ArgMin:
          MINIDL_CHECK(out.dtype() == DType::i64, name, " (cuda): output ", out.meta(), " must be i64");
          return launch<T, int64_t>(ctx, op, x, g, out);
      }
    }
  });
}

}  // namespace minidl::cuda
