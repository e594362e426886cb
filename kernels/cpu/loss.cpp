// CPU fused losses: softmax cross-entropy (with label smoothing) and binary cross-entropy on
// logits, the reference for kernels/cuda/loss.cu. One pass per row instead of log_softmax + nll +
// a smoothing mean, so a loss allocates no [N, C] temporary and large logits stay finite.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/half.h"
#include "kernels/common/checks.h"

namespace minidl::cpu {
namespace {

constexpr int64_t kParallelWork = 16384;

// Row n of logits [N, C]: max in the compute type, sum of exp in double (as softmax.cpp), lse in
// double. eps > 0 adds the uniform component; it is skipped at 0 so an inf logit elsewhere in the
// row cannot turn 0 * inf into a NaN.
template <typename T>
void ce_fwd(const T* x, const int64_t* tg, int64_t ts, int64_t N, int64_t C, double eps, T* losses, int64_t ls,
            double* lse) {
  using Cp = compute_t<T>;
#pragma omp parallel for schedule(static) if (N * C > kParallelWork)
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    Cp mx = -std::numeric_limits<Cp>::infinity();
    for (int64_t c = 0; c < C; ++c) mx = std::max(mx, static_cast<Cp>(xr[c]));
    double s = 0.0, sx = 0.0;
    for (int64_t c = 0; c < C; ++c) {
      const Cp v = static_cast<Cp>(xr[c]);
      s += static_cast<double>(std::exp(v - mx));
      sx += static_cast<double>(v);
    }
    const double l = static_cast<double>(mx) + std::log(s);
    double loss = (1.0 - eps) * (l - static_cast<double>(static_cast<Cp>(xr[tg[n * ts]])));
    if (eps > 0.0) loss += eps * (l - sx / static_cast<double>(C));
    lse[n] = l;
    losses[n * ls] = static_cast<T>(static_cast<Cp>(loss));
  }
}

// softmax - smoothed one-hot, times the row's upstream gradient; exp's argument x - lse is
// formed in double (lse is large when the logits are) and rounded once to the compute type.
template <typename T>
void ce_bwd(const T* g, int64_t gs, const T* x, const int64_t* tg, int64_t ts, const double* lse, int64_t N,
            int64_t C, double eps, T* gx) {
  using Cp = compute_t<T>;
  const Cp hit = static_cast<Cp>(1.0 - eps), uniform = static_cast<Cp>(eps / static_cast<double>(C));
#pragma omp parallel for schedule(static) if (N * C > kParallelWork)
  for (int64_t n = 0; n < N; ++n) {
    const T* xr = x + n * C;
    T* gr = gx + n * C;
    const Cp gn = static_cast<Cp>(g[n * gs]);
    const int64_t t = tg[n * ts];
    for (int64_t c = 0; c < C; ++c) {
      const Cp p = std::exp(static_cast<Cp>(static_cast<double>(static_cast<Cp>(xr[c])) - lse[n]));
      const Cp q = p - (c == t ? hit : Cp(0)) - uniform;
      gr[c] = static_cast<T>(gn * q);
    }
  }
}

template <typename T>
void bce_fwd(const T* x, const T* y, int64_t n, T* out) {
  using Cp = compute_t<T>;
#pragma omp parallel for schedule(static) if (n > kParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const Cp xv = static_cast<Cp>(x[i]), yv = static_cast<Cp>(y[i]);
    // max(x, 0) - x*y + log(1 + exp(-|x|)): exp never overflows, log1p keeps the tail exact.
    out[i] = static_cast<T>(std::max(xv, Cp(0)) - xv * yv + std::log1p(std::exp(-std::abs(xv))));
  }
}

template <typename T>
void bce_bwd(const T* g, int64_t gs, const T* x, const T* y, int64_t n, T* gx, T* gy) {
  using Cp = compute_t<T>;
#pragma omp parallel for schedule(static) if (n > kParallelWork)
  for (int64_t i = 0; i < n; ++i) {
    const Cp gv = static_cast<Cp>(g[i * gs]), xv = static_cast<Cp>(x[i]);
    if (gx != nullptr) {
      const Cp sig = Cp(1) / (Cp(1) + std::exp(-xv));   // the Sigmoid of elementwise.cpp
      gx[i] = static_cast<T>(gv * (sig - static_cast<Cp>(y[i])));
    }
    if (gy != nullptr) gy[i] = static_cast<T>(-gv * xv);
  }
}

template <typename T>
T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

}  // namespace

void CpuBackend::cross_entropy_forward(const Tensor& logits, const Tensor& target, double label_smoothing,
                                       const Tensor& losses, const Tensor& lse) {
  const char* op = "cross_entropy";
  common::check_cross_entropy_forward("cpu", logits, target, losses, lse);
  const int64_t N = logits.size(0), C = logits.size(1);
  const int64_t* tg = target.data<int64_t>();
  const int64_t ts = target.stride(0);
  // Every target is validated before anything is written (the message of nll_forward).
  for (int64_t n = 0; n < N; ++n) {
    const int64_t t = tg[n * ts];
    MINIDL_CHECK(t >= 0 && t < C, "cross_entropy: target[", n, "] = ", t, " is out of range for C = ", C,
                 " classes; targets must be class indices in [0, ", C,
                 ") (check the label encoding or the number of classes of the model's output layer)");
  }
  dispatch_floating(logits.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    ce_fwd<T>(logits.data<T>(), tg, ts, N, C, label_smoothing, losses.data<T>(), losses.stride(0),
              lse.data<double>());
  });
}

void CpuBackend::cross_entropy_backward(const Tensor& g, const Tensor& logits, const Tensor& target,
                                        const Tensor& lse, double label_smoothing, const Tensor& glogits) {
  const char* op = "cross_entropy_backward";
  common::check_cross_entropy_backward("cpu", g, logits, target, lse, glogits);
  const int64_t N = logits.size(0), C = logits.size(1);
  const int64_t* tg = target.data<int64_t>();
  const int64_t ts = target.stride(0);
  for (int64_t n = 0; n < N; ++n) {
    MINIDL_CHECK(tg[n * ts] >= 0 && tg[n * ts] < C, op, ": target[", n, "] = ", tg[n * ts],
                 " is out of range for C = ", C);
  }
  const int64_t gs = g.dim() == 0 ? 0 : g.stride(0);
  dispatch_floating(logits.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    ce_bwd<T>(g.data<T>(), gs, logits.data<T>(), tg, ts, lse.data<double>(), N, C, label_smoothing,
              glogits.data<T>());
  });
}

void CpuBackend::bce_with_logits_forward(const Tensor& x, const Tensor& y, const Tensor& loss) {
  const char* op = "binary_cross_entropy_with_logits";
  MINIDL_CHECK(y.dtype() == x.dtype() && loss.dtype() == x.dtype() && y.shape() == x.shape() &&
                   loss.shape() == x.shape() && x.is_contiguous() && y.is_contiguous() && loss.is_contiguous(),
               op, " (cpu): x ", x.meta(), ", y ", y.meta(), " and loss ", loss.meta(),
               " must be contiguous with one shape and dtype");
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    bce_fwd<T>(x.data<T>(), y.data<T>(), x.numel(), loss.data<T>());
  });
}

void CpuBackend::bce_with_logits_backward(const Tensor& g, const Tensor& x, const Tensor& y, const Tensor& gx,
                                          const Tensor& gy) {
  const char* op = "binary_cross_entropy_with_logits_backward";
  MINIDL_CHECK(y.dtype() == x.dtype() && g.dtype() == x.dtype() && y.shape() == x.shape() &&
                   g.shape() == x.shape() && x.is_contiguous() && y.is_contiguous(),
               op, " (cpu): g ", g.meta(), ", x ", x.meta(), " and y ", y.meta(),
               " must share shape and dtype (x, y contiguous)");
  for (const Tensor* out : {&gx, &gy}) {
    MINIDL_CHECK(!out->defined() || (out->dtype() == x.dtype() && out->shape() == x.shape() && out->is_contiguous()),
                 op, " (cpu): gradient output ", out->meta(), " must be contiguous with x's shape and dtype");
  }
  if (!gx.defined() && !gy.defined()) return;
  const int64_t gs = common::grad_step("cpu", g, op);
  dispatch_floating(x.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    bce_bwd<T>(g.data<T>(), gs, x.data<T>(), y.data<T>(), x.numel(), data_or_null<T>(gx), data_or_null<T>(gy));
  });
}

}  // namespace minidl::cpu
