// CUDA reductions over any set of dims of a strided tensor: one block per output, threads stride
// over the reduced elements, and warp shuffles combine them. Sums accumulate in double (floating)
// (f32, f64, f16) or int64 as on the CPU; max/min keep the first extreme index and let NaN win, as PyTorch does.
#include <algorithm>
#include <limits>

#include "kernels/cuda/context.cuh"
#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/device/common.cuh"
#include "kernels/cuda/device/launch.cuh"

namespace minidl::cuda {
namespace {

// Offsets of the kept (outputs) and reduced dims of x, each in row-major order.
struct ReduceGeom {
  OffsetCalc<1> kept, red;
  int64_t O, R;
};

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

template <typename T, typename Out>
__global__ void reduce_kernel(ReduceOp op, const T* x, ReduceGeom g, Out* out) {
  using Acc = std::conditional_t<std::is_integral_v<T>, int64_t, double>;   // f16 sums in double too
  MINIDL_SHARED_ARRAY(Acc, s_sum, 32);
  MINIDL_SHARED_ARRAY(T, s_best, 32);
  MINIDL_SHARED_ARRAY(int64_t, s_idx, 32);
  const bool ext = op != ReduceOp::Sum && op != ReduceOp::Mean;
  const bool is_max = op == ReduceOp::Max || op == ReduceOp::ArgMax;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int64_t o = blockIdx.x; o < g.O; o += gridDim.x) {
    int64_t base[1];
    g.kept.get(o, base);
    const T* xo = x + base[0];
    if (!ext) {
      Acc s = 0;
      for (int64_t r = threadIdx.x; r < g.R; r += blockDim.x) {
        int64_t off[1];
        g.red.get(r, off);
        s += cvt<Acc>(xo[off[0]]);
      }
      s = block_sum<Acc>(s, s_sum);
      if (threadIdx.x == 0) {
        if (op == ReduceOp::Mean) {
          const double m = g.R > 0 ? static_cast<double>(s) / static_cast<double>(g.R)
                                   : __longlong_as_double(0x7ff8000000000000LL);
          out[o] = cvt<Out>(m);
        } else {
          out[o] = cvt<Out>(s);
        }
      }
      __syncthreads();
      continue;
    }
    T best = cvt<T>(0.0f);
    int64_t bi = -1;
    for (int64_t r = threadIdx.x; r < g.R; r += blockDim.x) {
      int64_t off[1];
      g.red.get(r, off);
      const T v = xo[off[0]];
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
    __syncthreads();
    if (lane == 0) {
      s_best[warp] = best;
      s_idx[warp] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      for (int w = 1; w < static_cast<int>(blockDim.x >> 5); ++w) {
        if (better<T>(is_max, s_best[w], s_idx[w], best, bi)) {
          best = s_best[w];
          bi = s_idx[w];
        }
      }
      if (op == ReduceOp::ArgMax || op == ReduceOp::ArgMin) out[o] = cvt<Out>(bi);
      else out[o] = cvt<Out>(best);
    }
    __syncthreads();
  }
}

template <typename T, typename Out>
void launch(ReduceOp op, const Tensor& x, const ReduceGeom& g, const Tensor& out, cudaStream_t stream) {
  int threads = 32;
  while (threads < 256 && threads < g.R) threads *= 2;
  const unsigned blocks = static_cast<unsigned>(std::min<int64_t>(g.O, int64_t{1} << 20));
  MINIDL_LAUNCH("reduce", (reduce_kernel<T, Out>), blocks, threads, 0, stream, op, static_cast<const T*>(x.data_ptr()),
                g, static_cast<Out*>(out.data_ptr()));
}

}  // namespace

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
  ReduceGeom g{make_offset_calc<1>(ks, {&kst}, name), make_offset_calc<1>(rs, {&rst}, name), numel_of(ks),
               numel_of(rs)};
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
            case DType::f32: return launch<T, float>(op, x, g, out, ctx.stream());
            case DType::f64: return launch<T, double>(op, x, g, out, ctx.stream());
            case DType::i32: return launch<T, int32_t>(op, x, g, out, ctx.stream());
            case DType::i64: return launch<T, int64_t>(op, x, g, out, ctx.stream());
            case DType::f16: return launch<T, __half>(op, x, g, out, ctx.stream());
            default: MINIDL_FAIL(name, " (cuda): unsupported output dtype ", out.meta());
          }
        case ReduceOp::Max:
        case ReduceOp::Min:
          MINIDL_CHECK(out.dtype() == x.dtype(), name, " (cuda): output ", out.meta(), " must have x's dtype");
          return launch<T, T>(op, x, g, out, ctx.stream());
        case ReduceOp::ArgMax:
        case ReduceOp::ArgMin:
          MINIDL_CHECK(out.dtype() == DType::i64, name, " (cuda): output ", out.meta(), " must be i64");
          return launch<T, int64_t>(op, x, g, out, ctx.stream());
      }
    }
  });
}

}  // namespace minidl::cuda
