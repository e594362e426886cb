// CUDA batch norm, hand-written to follow the CPU reference exactly: two-pass statistics in double
// (one block per channel, warp-shuffle reductions), biased variance to normalise, unbiased to
// update the running statistics (PyTorch's rule), per-channel tensors in f32 or f64 whatever x is.
#include "kernels/cuda/batch_norm_act.cuh"
#include "kernels/cuda/context.cuh"
#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/device/common.cuh"
#include "kernels/cuda/device/launch.cuh"

namespace minidl::cuda {
namespace {

struct Layout {
  int64_t N, C, S;
};

Layout layout_of(const Tensor& x, const char* op) {
  MINIDL_CHECK(x.dim() >= 2, op, " (cuda): x must be [N, C, ...], got ", x.meta());
  MINIDL_CHECK(x.is_contiguous(), op, " (cuda): x must be contiguous, got strides ", shape_str(x.strides()));
  int64_t S = 1;
  for (int64_t d = 2; d < x.dim(); ++d) S *= x.size(d);
  return {x.size(0), x.size(1), S};
}

constexpr int kStatThreads = 512;

// One block per channel: mean, biased variance, invstd; running-stat update.
template <typename T>
__global__ void stats_kernel(const T* x, Layout L, double eps, double momentum, Channel save_mean,
                             Channel save_invstd, Channel running_mean, Channel running_var, double* mean_out,
                             double* alpha_out, Channel weight) {
  MINIDL_SHARED_ARRAY(double, scratch, 32);
  MINIDL_SHARED_VAR(double, s_mean);
  const int64_t c = blockIdx.x;
  const int64_t n = L.N * L.S;
  double s = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t b = i / L.S, k = i % L.S;
    s += cvt<double>(x[(b * L.C + c) * L.S + k]);
  }
  s = block_sum<double>(s, scratch);
  if (threadIdx.x == 0) s_mean = n > 0 ? s / static_cast<double>(n) : 0.0;
  __syncthreads();
  const double m = s_mean;
  double sq = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t b = i / L.S, k = i % L.S;
    const double d = cvt<double>(x[(b * L.C + c) * L.S + k]) - m;
    sq += d * d;
  }
  sq = block_sum<double>(sq, scratch);
  if (threadIdx.x == 0) {
    const double var = n > 0 ? sq / static_cast<double>(n) : 0.0;
    const double invstd = 1.0 / ::sqrt(var + eps);
    save_mean.set(c, m);
    save_invstd.set(c, invstd);
    mean_out[c] = m;
    alpha_out[c] = invstd * weight.get(c, 1.0);
    const double unbias = n > 1 ? static_cast<double>(n) / static_cast<double>(n - 1) : 1.0;
    if (running_mean.p != nullptr) running_mean.set(c, (1.0 - momentum) * running_mean.get(c, 0.0) + momentum * m);
    if (running_var.p != nullptr)
      running_var.set(c, (1.0 - momentum) * running_var.get(c, 1.0) + momentum * var * unbias);
  }
}

// alpha[c] = weight[c] / sqrt(var[c] + eps) with the given statistics (evaluation).
__global__ void eval_coeff_kernel(int64_t C, double eps, Channel mean, Channel var, Channel weight, double* mean_out,
                                  double* alpha_out) {
  MINIDL_GRID_STRIDE(c, C) {
    mean_out[c] = mean.get(c, 0.0);
    alpha_out[c] = weight.get(c, 1.0) / ::sqrt(var.get(c, 1.0) + eps);
  }
}

// y = (x - mean[c]) * alpha[c] + bias[c], in T's compute type as the CPU does.
template <typename T>
__global__ void apply_kernel(const T* x, T* y, Layout L, const double* mean, const double* alpha, Channel bias) {
  using C = typename Compute<T>::type;
  const int64_t total = L.N * L.C * L.S;
  MINIDL_GRID_STRIDE(i, total) {
    const int64_t c = (i / L.S) % L.C;
    const C m = static_cast<C>(mean[c]), a = static_cast<C>(alpha[c]), b = static_cast<C>(bias.get(c, 0.0));
    y[i] = cvt<T>((cvt<C>(x[i]) - m) * a + b);
  }
}

// One block per channel: sum(gy) and sum(gy * (x - mean)), then gweight, gbias and the gx coefficients.
template <typename T>
__global__ void grad_sums_kernel(const T* gy, const T* x, Layout L, Channel mean, Channel invstd, Channel gweight,
                                 Channel gbias, double* coef) {
  MINIDL_SHARED_ARRAY(double, scratch, 32);
  const int64_t c = blockIdx.x;
  const int64_t n = L.N * L.S;
  const double m = mean.get(c, 0.0);
  double sg = 0, sd = 0;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const int64_t at = ((i / L.S) * L.C + c) * L.S + i % L.S;
    const double g = cvt<double>(gy[at]);
    sg += g;
    sd += g * (cvt<double>(x[at]) - m);
  }
  sg = block_sum<double>(sg, scratch);
  sd = block_sum<double>(sd, scratch);
  if (threadIdx.x == 0) {
    const double is = invstd.get(c, 1.0);
    const double inv_n = n > 0 ? 1.0 / static_cast<double>(n) : 0.0;
    gweight.set(c, sd * is);
    gbias.set(c, sg);
    coef[3 * c + 0] = m;
    coef[3 * c + 1] = sg * inv_n;                          // mean(gy)
    coef[3 * c + 2] = sd * is * is * inv_n;                // projection on xhat
  }
}

// gx = (gy - mean(gy) - (x - m) * proj) * invstd * w, in double as the CPU does.
template <typename T>
__global__ void grad_input_kernel(const T* gy, const T* x, T* gx, Layout L, const double* coef, Channel invstd,
                                  Channel weight) {
  const int64_t total = L.N * L.C * L.S;
  MINIDL_GRID_STRIDE(i, total) {
    const int64_t c = (i / L.S) % L.C;
    const double scale = invstd.get(c, 1.0) * weight.get(c, 1.0);
    const double xm = cvt<double>(x[i]) - coef[3 * c];
    gx[i] = cvt<T>((cvt<double>(gy[i]) - coef[3 * c + 1] - xm * coef[3 * c + 2]) * scale);
  }
}

template <typename F>
void dispatch_bn(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); return;
    case DType::f64: f(double{}); return;
    case DType::f16: f(__half{}); return;
    default: MINIDL_FAIL(op, " (cuda): x must be f32, f64 or f16, got ", dtype_name(t), "; convert with .to(DType::f32)");
  }
}

}  // namespace

void CudaBackend::batch_norm_forward_train(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                           const Tensor& running_mean, const Tensor& running_var, double momentum,
                                           double eps, const Tensor& y, const Tensor& save_mean,
                                           const Tensor& save_invstd) {
  const char* op = "batch_norm";
  check_cuda(op, {&x, &y});
  check_contiguous(op, {&y});
  const Layout L = layout_of(x, op);
  MINIDL_CHECK(y.dtype() == x.dtype() && y.shape() == x.shape(), op, " (cuda): y ", y.meta(), " must match x ", x.meta());
  const Channel w = channel(weight, L.C, op), b = channel(bias, L.C, op), rm = channel(running_mean, L.C, op),
                rv = channel(running_var, L.C, op), sm = channel(save_mean, L.C, op),
                si = channel(save_invstd, L.C, op);
  if (L.C == 0) return;
  DeviceContext& ctx = context_of(x);
  Tensor coeffs = empty({2, L.C}, {DType::f64, x.device(), false});   // mean, alpha
  double* mean_d = static_cast<double*>(coeffs.data_ptr());
  double* alpha_d = mean_d + L.C;
  dispatch_bn(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    MINIDL_LAUNCH("batch_norm statistics", (stats_kernel<T>), static_cast<unsigned>(L.C), kStatThreads, 0, ctx.stream(),
                  static_cast<const T*>(x.data_ptr()), L, eps, momentum, sm, si, rm, rv, mean_d, alpha_d, w);
    if (x.numel() == 0) return;
    MINIDL_LAUNCH("batch_norm apply", (apply_kernel<T>), grid_for(x.numel()), kThreads, 0, ctx.stream(),
                  static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()), L, mean_d, alpha_d, b);
  });
}

void CudaBackend::batch_norm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                          const Tensor& mean, const Tensor& var, double eps, const Tensor& y) {
  const char* op = "batch_norm";
  check_cuda(op, {&x, &y});
  check_contiguous(op, {&y});
  const Layout L = layout_of(x, op);
  MINIDL_CHECK(y.dtype() == x.dtype() && y.shape() == x.shape(), op, " (cuda): y ", y.meta(), " must match x ", x.meta());
  const Channel w = channel(weight, L.C, op), b = channel(bias, L.C, op), m = channel(mean, L.C, op),
                v = channel(var, L.C, op);
  if (x.numel() == 0) return;
  DeviceContext& ctx = context_of(x);
  Tensor coeffs = empty({2, L.C}, {DType::f64, x.device(), false});
  double* mean_d = static_cast<double*>(coeffs.data_ptr());
  double* alpha_d = mean_d + L.C;
  MINIDL_LAUNCH("batch_norm eval coefficients", eval_coeff_kernel, grid_for(L.C), kThreads, 0, ctx.stream(), L.C, eps,
                m, v, w, mean_d, alpha_d);
  dispatch_bn(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    MINIDL_LAUNCH("batch_norm apply", (apply_kernel<T>), grid_for(x.numel()), kThreads, 0, ctx.stream(),
                  static_cast<const T*>(x.data_ptr()), static_cast<T*>(y.data_ptr()), L, mean_d, alpha_d, b);
  });
}

void CudaBackend::batch_norm_backward(const Tensor& gy, const Tensor& x, const Tensor& weight, const Tensor& save_mean,
                                      const Tensor& save_invstd, const Tensor& gx, const Tensor& gweight,
                                      const Tensor& gbias) {
  const char* op = "batch_norm_backward";
  check_cuda(op, {&gy, &x, &gx});
  check_contiguous(op, {&gx});
  const Layout L = layout_of(x, op);
  const Layout G = layout_of(gy, op);
  MINIDL_CHECK(G.N == L.N && G.C == L.C && G.S == L.S && gy.dtype() == x.dtype(), op, " (cuda): gy ", gy.meta(),
               " does not match x ", x.meta());
  MINIDL_CHECK(!gx.defined() || (gx.shape() == x.shape() && gx.dtype() == x.dtype()), op, " (cuda): gx ", gx.meta(),
               " does not match x ", x.meta());
  const Channel w = channel(weight, L.C, op), m = channel(save_mean, L.C, op), is = channel(save_invstd, L.C, op),
                gw = channel(gweight, L.C, op), gb = channel(gbias, L.C, op);
  if (L.C == 0) return;
  DeviceContext& ctx = context_of(x);
  Tensor coef = empty({L.C, 3}, {DType::f64, x.device(), false});
  double* coef_d = static_cast<double*>(coef.data_ptr());
  dispatch_bn(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    MINIDL_LAUNCH("batch_norm_backward sums", (grad_sums_kernel<T>), static_cast<unsigned>(L.C), kStatThreads, 0,
                  ctx.stream(), static_cast<const T*>(gy.data_ptr()), static_cast<const T*>(x.data_ptr()), L, m, is, gw,
                  gb, coef_d);
    if (!gx.defined() || x.numel() == 0) return;
    MINIDL_LAUNCH("batch_norm_backward input", (grad_input_kernel<T>), grid_for(x.numel()), kThreads, 0, ctx.stream(),
                  static_cast<const T*>(gy.data_ptr()), static_cast<const T*>(x.data_ptr()),
                  static_cast<T*>(gx.data_ptr()), L, coef_d, is, w);
  });
}

}  // namespace minidl::cuda
