// CUDA fused losses, the device side of kernels/cpu/loss.cpp: softmax cross-entropy forward (one
// warp per row: max, sum of exp in double and the logits' sum by warp shuffles, plus the target
// check) and backward (one grid-stride pass from the saved logsumexp), and elementwise BCE on logits.
#include "kernels/common/checks.h"
#include "kernels/cuda/context.cuh"
#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/device/common.cuh"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/device/math.cuh"

namespace minidl::cuda {
namespace {


// Maximum over the warp, in every lane. A NaN never wins (the CPU's std::max(mx, v) keeps mx), so
// the max is the CPU's bit for bit; a NaN logit still makes the row's sum, and so its loss, NaN.
template <typename T>
__device__ __forceinline__ T warp_max_all(T v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const T u = __shfl_xor_sync(0xffffffffu, v, o);
    v = u > v ? u : v;
  }
  return v;
}

constexpr int kWarpsPerBlock = 8;

unsigned warp_grid(int64_t rows) {
  const int64_t blocks = (rows + kWarpsPerBlock - 1) / kWarpsPerBlock;
  return static_cast<unsigned>(std::max<int64_t>(1, std::min<int64_t>(blocks, int64_t{132} * 16)));
}

// One warp per row n (grid-stride over rows). A target outside [0, C) skips its row and records
// N - n in *bad with atomicMax, so the host finds the lowest bad row (0: all good).
template <typename T>
__global__ void ce_fwd_kernel(const T* x, const int64_t* tg, int64_t ts, int64_t N, int64_t C, double eps, T* losses,
                              int64_t ls, double* lse, unsigned long long* bad) {
  using Cp = typename Compute<T>::type;
  const int lane = threadIdx.x & 31;
  const int64_t warp0 = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int64_t nwarps = (static_cast<int64_t>(gridDim.x) * blockDim.x) >> 5;
  for (int64_t n = warp0; n < N; n += nwarps) {
    const int64_t t = tg[n * ts];   // the same for every lane: the branch is warp-uniform
    if (t < 0 || t >= C) {
      if (lane == 0) atomicMax(bad, static_cast<unsigned long long>(N - n));
      continue;
    }
    const T* xr = x + n * C;
    Cp mx = -INFINITY;
    for (int64_t c = lane; c < C; c += 32) {
      const Cp v = cvt<Cp>(xr[c]);
      mx = v > mx ? v : mx;
    }
    mx = warp_max_all(mx);
    double s = 0.0, sx = 0.0;
    for (int64_t c = lane; c < C; c += 32) {
      const Cp v = cvt<Cp>(xr[c]);
      s += static_cast<double>(d_exp(v - mx));
      sx += static_cast<double>(v);
    }
    s = warp_sum(s);   // valid in lane 0
    sx = warp_sum(sx);
    if (lane == 0) {
      const double l = static_cast<double>(mx) + ::log(s);
      double loss = (1.0 - eps) * (l - static_cast<double>(cvt<Cp>(xr[t])));
      if (eps > 0.0) loss += eps * (l - sx / static_cast<double>(C));   // 0 * inf must not make a NaN
      lse[n] = l;
      losses[n * ls] = cvt<T>(static_cast<Cp>(loss));
    }
  }
}

// glogits = g[n] * (exp(x - lse[n]) - (c == t) * (1 - eps) - eps / C), one thread per element.
// x - lse is formed in double and rounded once, as on the CPU.
template <typename T>
__global__ void ce_bwd_kernel(const T* g, int64_t gs, const T* x, const int64_t* tg, int64_t ts, const double* lse,
                              int64_t N, int64_t C, double eps, T* gx) {
  using Cp = typename Compute<T>::type;
  const Cp hit = static_cast<Cp>(1.0 - eps), uniform = static_cast<Cp>(eps / static_cast<double>(C));
  MINIDL_GRID_STRIDE(i, N * C) {
    const int64_t n = i / C, c = i % C;
    const Cp p = d_exp(static_cast<Cp>(static_cast<double>(cvt<Cp>(x[i])) - lse[n]));
    const Cp q = p - (c == tg[n * ts] ? hit : Cp(0)) - uniform;
    gx[i] = cvt<T>(cvt<Cp>(g[n * gs]) * q);
  }
}

// max(x, 0) - x*y + log1p(exp(-|x|)); the max is written as the CPU's std::max (NaN stays NaN).
template <typename T>
__global__ void bce_fwd_kernel(const T* x, const T* y, int64_t n, T* out) {
  using Cp = typename Compute<T>::type;
  MINIDL_GRID_STRIDE(i, n) {
    const Cp xv = cvt<Cp>(x[i]), yv = cvt<Cp>(y[i]);
    const Cp pos = xv < Cp(0) ? Cp(0) : xv;
    out[i] = cvt<T>(pos - xv * yv + d_log1p(d_exp(-d_abs(xv))));
  }
}

// gx = g * (sigmoid(x) - y), gy = -g * x; gs 0 reads one broadcast g. Null outputs are skipped.
template <typename T>
__global__ void bce_bwd_kernel(const T* g, int64_t gs, const T* x, const T* y, int64_t n, T* gx, T* gy) {
  using Cp = typename Compute<T>::type;
  MINIDL_GRID_STRIDE(i, n) {
    const Cp gv = cvt<Cp>(g[i * gs]), xv = cvt<Cp>(x[i]);
    if (gx != nullptr) {
      const Cp sig = Cp(1) / (Cp(1) + d_exp(-xv));   // elementwise.cu's Sigmoid
      gx[i] = cvt<T>(gv * (sig - cvt<Cp>(y[i])));
    }
    if (gy != nullptr) gy[i] = cvt<T>(-gv * xv);
  }
}

template <typename T>
T* ptr_or_null(const Tensor& t) {
  return t.defined() ? static_cast<T*>(t.data_ptr()) : nullptr;
}

}  // namespace

void CudaBackend::cross_entropy_forward(const Tensor& logits, const Tensor& target, double label_smoothing,
                                        const Tensor& losses, const Tensor& lse) {
  const char* op = "cross_entropy";
  check_cuda(op, {&logits, &target, &losses, &lse});
  common::check_cross_entropy_forward("cuda", logits, target, losses, lse);
  const int64_t N = logits.size(0), C = logits.size(1);
  if (N == 0) return;
  DeviceContext& ctx = context_of(logits);
  // The kernel checks the targets as it goes; reading its verdict is this op's one host sync (the
  // composed log_softmax + nll_loss had the same sync in nll_forward).
  DeviceBuffer flag(ctx, sizeof(unsigned long long));
  auto* bad = static_cast<unsigned long long*>(flag.get());
  MINIDL_CUDA_CHECK(cudaMemsetAsync(bad, 0, sizeof(unsigned long long), ctx.stream()));
  dispatch_floating(logits.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    MINIDL_LAUNCH("cross_entropy_forward", (ce_fwd_kernel<T>), warp_grid(N), 32 * kWarpsPerBlock, 0, ctx.stream(),
                  static_cast<const T*>(logits.data_ptr()), static_cast<const int64_t*>(target.data_ptr()),
                  target.stride(0), N, C, label_smoothing, static_cast<T*>(losses.data_ptr()), losses.stride(0),
                  static_cast<double*>(lse.data_ptr()), bad);
  });
  // A CUDA graph capture cannot read the verdict (a host sync): the graph's caller checks the
  // targets on the host before copying them into the captured batch (docs/cuda/graphs.md).
  if (ctx.capturing()) return;
  unsigned long long verdict = 0;
  MINIDL_CUDA_CHECK(cudaMemcpyAsync(&verdict, bad, sizeof(verdict), cudaMemcpyDeviceToHost, ctx.stream()));
  ctx.synchronize();
  if (verdict == 0) return;
  const int64_t row = N - static_cast<int64_t>(verdict);
  int64_t t = 0;
  MINIDL_CUDA_CHECK(cudaMemcpyAsync(&t, static_cast<const int64_t*>(target.data_ptr()) + row * target.stride(0),
                                    sizeof(t), cudaMemcpyDeviceToHost, ctx.stream()));
  ctx.synchronize();
  MINIDL_FAIL("cross_entropy: target[", row, "] = ", t, " is out of range for C = ", C,
              " classes; targets must be class indices in [0, ", C,
              ") (check the label encoding or the number of classes of the model's output layer)");
}

void CudaBackend::cross_entropy_backward(const Tensor& g, const Tensor& logits, const Tensor& target,
                                         const Tensor& lse, double label_smoothing, const Tensor& glogits) {
  const char* op = "cross_entropy_backward";
  check_cuda(op, {&g, &logits, &target, &lse, &glogits});
  common::check_cross_entropy_backward("cuda", g, logits, target, lse, glogits);
  const int64_t N = logits.size(0), C = logits.size(1);
  // No target check here (it would cost a host sync): the forward validated these targets, and a
  // bad one could only drop its one-hot term, never read out of bounds.
  if (N * C == 0) return;
  DeviceContext& ctx = context_of(logits);
  const int64_t gs = g.dim() == 0 ? 0 : g.stride(0);
  dispatch_floating(logits.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    MINIDL_LAUNCH_NOWAIT("cross_entropy_backward", (ce_bwd_kernel<T>), grid_for(N * C), kThreads, 0, ctx.stream(),
                         static_cast<const T*>(g.data_ptr()), gs, static_cast<const T*>(logits.data_ptr()),
                         static_cast<const int64_t*>(target.data_ptr()), target.stride(0),
                         static_cast<const double*>(lse.data_ptr()), N, C, label_smoothing,
                         static_cast<T*>(glogits.data_ptr()));
  });
}

void CudaBackend::bce_with_logits_forward(const Tensor& x, const Tensor& y, const Tensor& loss) {
  const char* op = "binary_cross_entropy_with_logits";
  check_cuda(op, {&x, &y, &loss});
  MINIDL_CHECK(y.dtype() == x.dtype() && loss.dtype() == x.dtype() && y.shape() == x.shape() &&
                   loss.shape() == x.shape(),
               op, " (cuda): x ", x.meta(), ", y ", y.meta(), " and loss ", loss.meta(), " must share shape and dtype");
  check_contiguous(op, {&x, &y, &loss});
  const int64_t n = x.numel();
  if (n == 0) return;
  DeviceContext& ctx = context_of(x);
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    MINIDL_LAUNCH_NOWAIT("bce_with_logits_forward", (bce_fwd_kernel<T>), grid_for(n), kThreads, 0, ctx.stream(),
                         static_cast<const T*>(x.data_ptr()), static_cast<const T*>(y.data_ptr()), n,
                         static_cast<T*>(loss.data_ptr()));
  });
}

void CudaBackend::bce_with_logits_backward(const Tensor& g, const Tensor& x, const Tensor& y, const Tensor& gx,
                                           const Tensor& gy) {
  const char* op = "binary_cross_entropy_with_logits_backward";
  check_cuda(op, {&g, &x, &y, &gx, &gy});
  MINIDL_CHECK(y.dtype() == x.dtype() && g.dtype() == x.dtype() && y.shape() == x.shape() && g.shape() == x.shape(),
               op, " (cuda): g ", g.meta(), ", x ", x.meta(), " and y ", y.meta(), " must share shape and dtype");
  check_contiguous(op, {&x, &y, &gx, &gy});
  for (const Tensor* out : {&gx, &gy}) {
    MINIDL_CHECK(!out->defined() || (out->dtype() == x.dtype() && out->shape() == x.shape()), op,
                 " (cuda): gradient output ", out->meta(), " must have x's shape and dtype");
  }
  const int64_t n = x.numel();
  if (n == 0 || (!gx.defined() && !gy.defined())) return;
  const int64_t gs = common::grad_step("cuda", g, op);
  DeviceContext& ctx = context_of(x);
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    MINIDL_LAUNCH_NOWAIT("bce_with_logits_backward", (bce_bwd_kernel<T>), grid_for(n), kThreads, 0, ctx.stream(),
                         static_cast<const T*>(g.data_ptr()), gs, static_cast<const T*>(x.data_ptr()),
                         static_cast<const T*>(y.data_ptr()), n, ptr_or_null<T>(gx), ptr_or_null<T>(gy));
  });
}

}  // namespace minidl::cuda
