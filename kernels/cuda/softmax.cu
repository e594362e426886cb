// CUDA softmax / log-softmax over the middle dim of [outer, C, inner] and the NLL gather. One warp
// per (outer, inner) row: max in T, sum of exp in double (as the CPU reference), shuffles to
// combine. NLL validates the targets on the device and throws naming the first bad one.
#include <array>
#include <tuple>

#include "kernels/common/checks.h"
#include "kernels/cuda/context.cuh"
#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/device/common.cuh"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/device/math.cuh"

namespace minidl::cuda {
namespace {

using Layout = common::SoftmaxLayout;


template <typename T>
__device__ __forceinline__ T warp_max(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const T u = __shfl_xor_sync(0xffffffffu, v, o);
    v = (u > v || u != u) ? u : v;   // NaN wins (the CPU ignores it in the max, but then exp gives NaN anyway)
  }
  return v;
}

constexpr int kWarpsPerBlock = 8;

// T is float or double here (f16 is widened to f32 by the entry points, as on the CPU).
template <typename T>
__global__ void softmax_fwd_kernel(const T* x, T* y, Layout L, bool log) {
  const int lane = threadIdx.x & 31;
  const int64_t rows = L.outer * L.inner;
  const int64_t warp0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t row = warp0; row < rows; row += nwarps) {
    const int64_t o = row / L.inner, in = row % L.inner;
    const T* xr = x + o * L.C * L.inner + in;
    T* yr = y + o * L.C * L.inner + in;
    T mx = -INFINITY;
    for (int64_t c = lane; c < L.C; c += 32) {
      const T v = xr[c * L.inner];
      mx = (v > mx || v != v) ? v : mx;
    }
    mx = warp_max(mx);
    double sum = 0;
    for (int64_t c = lane; c < L.C; c += 32) {
      const T e = d_exp(xr[c * L.inner] - mx);
      sum += static_cast<double>(e);
      if (!log) yr[c * L.inner] = e;
    }
    sum = warp_sum(sum);
    sum = __shfl_sync(0xffffffffu, sum, 0);
    if (log) {
      const double lse = static_cast<double>(mx) + ::log(sum);
      for (int64_t c = lane; c < L.C; c += 32) yr[c * L.inner] = static_cast<T>(static_cast<double>(xr[c * L.inner]) - lse);
    } else {
      const T inv = static_cast<T>(1.0 / sum);
      for (int64_t c = lane; c < L.C; c += 32) yr[c * L.inner] *= inv;
    }
  }
}

// softmax: gx = y * (gy - sum gy*y); log_softmax: gx = gy - exp(y) * sum gy.
template <typename T>
__global__ void softmax_bwd_kernel(const T* gy, const T* y, T* gx, Layout L, bool log) {
  const int lane = threadIdx.x & 31;
  const int64_t rows = L.outer * L.inner;
  const int64_t warp0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t row = warp0; row < rows; row += nwarps) {
    const int64_t base = (row / L.inner) * L.C * L.inner + row % L.inner;
    double acc = 0;
    for (int64_t c = lane; c < L.C; c += 32) {
      const double g = static_cast<double>(gy[base + c * L.inner]);
      acc += log ? g : g * static_cast<double>(y[base + c * L.inner]);
    }
    acc = warp_sum(acc);
    acc = __shfl_sync(0xffffffffu, acc, 0);
    for (int64_t c = lane; c < L.C; c += 32) {
      const int64_t at = base + c * L.inner;
      const double g = static_cast<double>(gy[at]);
      gx[at] = log ? static_cast<T>(g - static_cast<double>(d_exp(y[at])) * acc)
                   : static_cast<T>(static_cast<double>(y[at]) * (g - acc));
    }
  }
}

// Records the first (lowest) out-of-range target index in *bad (initialised to N).
__global__ void nll_validate_kernel(const int64_t* target, int64_t ts, int64_t N, int64_t C, unsigned long long* bad) {
  MINIDL_GRID_STRIDE(n, N) {
    const int64_t t = target[n * ts];
    if (t < 0 || t >= C) atomicMin(bad, static_cast<unsigned long long>(n));
  }
}

template <typename T>
__global__ void nll_fwd_kernel(const T* lp, const int64_t* target, int64_t ts, int64_t N, int64_t C, T* out,
                               int64_t os) {
  MINIDL_GRID_STRIDE(n, N) { out[n * os] = -lp[n * C + target[n * ts]]; }
}

template <typename T>
__global__ void nll_bwd_kernel(const T* g, int64_t gs, const int64_t* target, int64_t ts, int64_t N, int64_t C,
                               T* out) {
  MINIDL_GRID_STRIDE(i, N * C) {
    const int64_t n = i / C, c = i % C;
    out[i] = c == target[n * ts] ? -g[n * gs] : T(0);
  }
}

unsigned warp_grid(int64_t rows) {
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, int64_t{132} * 16)));
}

// Throws like the CPU when a target is outside [0, C); synchronises to read the verdict.
void validate_targets(DeviceContext& ctx, const Tensor& target, int64_t N, int64_t C, const char* what) {
  // Not inside a CUDA graph capture (a host sync): its caller checks the targets on the host.
  if (N == 0 || ctx.capturing()) return;
  Tensor flag = empty({1}, {DType::i64, target.device(), false});
  const unsigned long long init = static_cast<unsigned long long>(N);
  MINIDL_CUDA_CHECK(cudaMemcpyAsync(flag.data_ptr(), &init, sizeof(init), cudaMemcpyHostToDevice, ctx.stream()));
  MINIDL_LAUNCH_NOWAIT(what, nll_validate_kernel, grid_for(N), kThreads, 0, ctx.stream(),
                       static_cast<const int64_t*>(target.data_ptr()), target.stride(0), N, C,
                       static_cast<unsigned long long*>(flag.data_ptr()));
  unsigned long long bad = 0;
  MINIDL_CUDA_CHECK(cudaMemcpyAsync(&bad, flag.data_ptr(), sizeof(bad), cudaMemcpyDeviceToHost, ctx.stream()));
  ctx.synchronize();
  if (bad >= init) return;
  int64_t t = 0;
  MINIDL_CUDA_CHECK(cudaMemcpyAsync(&t, static_cast<const int64_t*>(target.data_ptr()) + static_cast<int64_t>(bad) * target.stride(0),
                                    sizeof(t), cudaMemcpyDeviceToHost, ctx.stream()));
  ctx.synchronize();
  MINIDL_FAIL(what, ": target[", bad, "] = ", t, " is out of range for C = ", C,
              " classes; targets must be class indices in [0, ", C,
              ") (check the label encoding or the number of classes of the model's output layer)");
}

// f16 and bf16 operands (pure 16-bit models, where autocast does not lift the loss to f32) are
// computed in f32 and rounded once, as the CPU backend does (widen_half / narrow_into).
bool any_half(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    if (t->defined() && (t->dtype() == DType::f16 || t->dtype() == DType::bf16)) return true;
  }
  return false;
}
Tensor f32_like(const Tensor& t) { return empty(t.shape(), {DType::f32, t.device(), false}); }
// The f16 path of an entry point: f32 tensors for the inputs `ins`, then for `out`, are made (in
// that order), the inputs are widened into theirs, run(inputs' f32..., out's f32) computes in f32,
// and the result is rounded into `out` once.
template <class... In, class Run>
void in_f32(CudaBackend& b, const std::tuple<const In&...>& ins, const Tensor& out, Run run) {
  std::apply(
      [&](const auto&... in) {
        const std::array<Tensor, sizeof...(In)> wide{f32_like(in)...};
        const Tensor out_f32 = f32_like(out);
        size_t i = 0;
        (b.copy(in, wide[i++]), ...);
        std::apply([&](const auto&... w) { run(w..., out_f32); }, wide);
        b.copy(out_f32, out);
      },
      ins);
}

}  // namespace

void CudaBackend::softmax_forward(const Tensor& x, int64_t dim, bool log, const Tensor& y) {
  const char* op = log ? "log_softmax" : "softmax";
  check_cuda(op, {&x, &y});
  if (any_half({&x, &y})) {
    MINIDL_CHECK(y.dtype() == x.dtype(), op, " (cuda): output ", y.meta(), " must have x's dtype ", x.meta());
    return in_f32(*this, std::tie(x), y,
                  [&](const Tensor& xf, const Tensor& yf) { softmax_forward(xf, dim, log, yf); });
  }
  MINIDL_CHECK(y.dtype() == x.dtype() && y.shape() == x.shape() && y.is_contiguous(), op, " (cuda): output ",
               y.meta(), " must be contiguous with x's shape and dtype ", x.meta());
  const Layout L = common::softmax_layout("cuda", x, dim, op);
  if (x.numel() == 0) return;
  DeviceContext& ctx = context_of(x);
  dispatch_wide(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    MINIDL_LAUNCH(op, (softmax_fwd_kernel<T>), warp_grid(L.outer * L.inner), 32 * kWarpsPerBlock, 0, ctx.stream(),
                  static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()), L, log);
  });
}

void CudaBackend::softmax_backward(const Tensor& gy, const Tensor& y, int64_t dim, bool log, const Tensor& gx) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  check_cuda(op, {&gy, &y, &gx});
  if (any_half({&gy, &y, &gx})) {
    MINIDL_CHECK(gy.dtype() == y.dtype() && gx.dtype() == y.dtype(), op, " (cuda): gy ", gy.meta(), ", y ", y.meta(),
                 " and gx ", gx.meta(), " must share their dtype");
    return in_f32(*this, std::tie(gy, y), gx, [&](const Tensor& gyf, const Tensor& yf, const Tensor& gxf) {
      softmax_backward(gyf, yf, dim, log, gxf);
    });
  }
  MINIDL_CHECK(gy.dtype() == y.dtype() && gy.shape() == y.shape() && gx.dtype() == y.dtype() &&
                   gx.shape() == y.shape() && gx.is_contiguous(),
               op, " (cuda): gy ", gy.meta(), ", y ", y.meta(), " and gx ", gx.meta(), " must share shape and dtype");
  const Layout L = common::softmax_layout("cuda", y, dim, op);
  common::softmax_layout("cuda", gy, dim, op);
  if (y.numel() == 0) return;
  DeviceContext& ctx = context_of(y);
  dispatch_wide(y.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    MINIDL_LAUNCH(op, (softmax_bwd_kernel<T>), warp_grid(L.outer * L.inner), 32 * kWarpsPerBlock, 0, ctx.stream(),
                  static_cast<const T*>(gy.data_ptr()), static_cast<const T*>(y.data_ptr()),
                  static_cast<T*>(gx.data_ptr()), L, log);
  });
}

void CudaBackend::nll_forward(const Tensor& log_probs, const Tensor& target, const Tensor& losses) {
  check_cuda("nll_loss", {&log_probs, &target, &losses});
  if (any_half({&log_probs, &losses})) {
    MINIDL_CHECK(losses.dtype() == log_probs.dtype(), "nll_loss (cuda): losses ", losses.meta(),
                 " must have the input's dtype ", log_probs.meta());
    return in_f32(*this, std::tie(log_probs), losses,
                  [&](const Tensor& lpf, const Tensor& lf) { nll_forward(lpf, target, lf); });
  }
  const int64_t N = common::check_nll_forward("cuda", log_probs, target, losses), C = log_probs.size(1);
  DeviceContext& ctx = context_of(log_probs);
  validate_targets(ctx, target, N, C, "cross_entropy/nll_loss");
  if (N == 0) return;
  dispatch_wide(log_probs.dtype(), "nll_loss", [&](auto tag) {
    using T = decltype(tag);
    MINIDL_LAUNCH_NOWAIT("nll_loss", (nll_fwd_kernel<T>), grid_for(N), kThreads, 0, ctx.stream(),
                         static_cast<const T*>(log_probs.data_ptr()), static_cast<const int64_t*>(target.data_ptr()),
                         target.stride(0), N, C, static_cast<T*>(losses.data_ptr()), losses.stride(0));
  });
}

void CudaBackend::nll_backward(const Tensor& g, const Tensor& target, const Tensor& glogp) {
  check_cuda("nll_loss_backward", {&g, &target, &glogp});
  if (any_half({&g, &glogp})) {
    MINIDL_CHECK(g.dtype() == glogp.dtype(), "nll_loss_backward (cuda): g ", g.meta(), " must have glogp's dtype ",
                 glogp.meta());
    return in_f32(*this, std::tie(g), glogp,
                  [&](const Tensor& gf, const Tensor& glf) { nll_backward(gf, target, glf); });
  }
  const int64_t N = common::check_nll_backward("cuda", g, target, glogp), C = glogp.size(1);
  DeviceContext& ctx = context_of(glogp);
  validate_targets(ctx, target, N, C, "nll_loss backward");
  if (N * C == 0) return;
  dispatch_wide(glogp.dtype(), "nll_loss_backward", [&](auto tag) {
    using T = decltype(tag);
    MINIDL_LAUNCH_NOWAIT("nll_loss_backward", (nll_bwd_kernel<T>), grid_for(N * C), kThreads, 0, ctx.stream(),
                         static_cast<const T*>(g.data_ptr()), g.dim() == 0 ? 0 : g.stride(0),
                         static_cast<const int64_t*>(target.data_ptr()), target.stride(0), N, C,
                         static_cast<T*>(glogp.data_ptr()));
  });
}

}  // namespace minidl::cuda
