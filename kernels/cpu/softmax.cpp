// CPU softmax / log-softmax over any dim and the NLL gather: the reference for the CUDA kernels
// and the loss path of every CPU experiment. Softmax subtracts the max and sums in double, so
// large logits neither overflow nor lose the small probabilities.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/half.h"
#include "kernels/common/checks.h"

namespace minidl::cpu {
namespace {

using Layout = common::SoftmaxLayout;

// Inner positions handled together: strided access along C then touches whole cache lines.
constexpr int64_t kLanes = 64;

// The loops below share out runs of up to kLanes inner positions of each outer slice among the
// threads: `blocks` runs a slice, outer * blocks in all. Run t starts at element `base` (its element
// c of lane j is at base + c * L.inner + j) and covers `lanes` positions.
struct LaneRun {
  int64_t base, lanes;
};
int64_t lane_blocks(const Layout& L) { return (L.inner + kLanes - 1) / kLanes; }
LaneRun lane_run(const Layout& L, int64_t blocks, int64_t t) {
  const int64_t o = t / blocks;
  const int64_t i0 = (t % blocks) * kLanes;
  return {o * L.C * L.inner + i0, std::min(kLanes, L.inner - i0)};
}

template <typename T>
void forward(const T* x, T* y, const Layout& L, bool log) {
  const int64_t blocks = lane_blocks(L);
#pragma omp parallel for schedule(static) if (L.outer * L.C * L.inner > 16384)
  for (int64_t t = 0; t < L.outer * blocks; ++t) {
    const auto [base, lanes] = lane_run(L, blocks, t);
    const T* xb = x + base;
    T* yb = y + base;
    T mx[kLanes];
    double sum[kLanes];
    for (int64_t j = 0; j < lanes; ++j) {
      mx[j] = -std::numeric_limits<T>::infinity();
      sum[j] = 0.0;
    }
    for (int64_t c = 0; c < L.C; ++c) {
      for (int64_t j = 0; j < lanes; ++j) mx[j] = std::max(mx[j], xb[c * L.inner + j]);
    }
    // exp in T (its arguments are <= 0, so it cannot overflow), sums in double. A slice that is
    // all -inf gives exp(-inf - -inf) = NaN, as in PyTorch.
    for (int64_t c = 0; c < L.C; ++c) {
      for (int64_t j = 0; j < lanes; ++j) {
        const T e = std::exp(xb[c * L.inner + j] - mx[j]);
        sum[j] += static_cast<double>(e);
        if (!log) yb[c * L.inner + j] = e;
      }
    }
    if (log) {
      double lse[kLanes];  // logsumexp
      for (int64_t j = 0; j < lanes; ++j) lse[j] = static_cast<double>(mx[j]) + std::log(sum[j]);
      for (int64_t c = 0; c < L.C; ++c) {
        for (int64_t j = 0; j < lanes; ++j) {
          yb[c * L.inner + j] = static_cast<T>(static_cast<double>(xb[c * L.inner + j]) - lse[j]);
        }
      }
    } else {
      T inv[kLanes];
      for (int64_t j = 0; j < lanes; ++j) inv[j] = static_cast<T>(1.0 / sum[j]);
      for (int64_t c = 0; c < L.C; ++c) {
        for (int64_t j = 0; j < lanes; ++j) yb[c * L.inner + j] *= inv[j];
      }
    }
  }
}

// softmax: gx = y * (gy - sum_c gy * y);  log_softmax: gx = gy - exp(y) * sum_c gy.
template <typename T>
void backward(const T* gy, const T* y, T* gx, const Layout& L, bool log) {
  const int64_t blocks = lane_blocks(L);
#pragma omp parallel for schedule(static) if (L.outer * L.C * L.inner > 16384)
  for (int64_t t = 0; t < L.outer * blocks; ++t) {
    const auto [base, lanes] = lane_run(L, blocks, t);
    double acc[kLanes];
    for (int64_t j = 0; j < lanes; ++j) acc[j] = 0.0;
    for (int64_t c = 0; c < L.C; ++c) {
      const int64_t at = base + c * L.inner;
      for (int64_t j = 0; j < lanes; ++j) {
        const double g = static_cast<double>(gy[at + j]);
        acc[j] += log ? g : g * static_cast<double>(y[at + j]);
      }
    }
    for (int64_t c = 0; c < L.C; ++c) {
      const int64_t at = base + c * L.inner;
      for (int64_t j = 0; j < lanes; ++j) {
        const double g = static_cast<double>(gy[at + j]);
        if (log) {
          gx[at + j] = static_cast<T>(g - static_cast<double>(std::exp(y[at + j])) * acc[j]);
        } else {
          gx[at + j] = static_cast<T>(static_cast<double>(y[at + j]) * (g - acc[j]));
        }
      }
    }
  }
}

void check_float(const Tensor& t, const char* op, const char* what) {
  MINIDL_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64, op, " (cpu): ", what, " ", t.meta(),
               " must be f32 or f64; convert with .to(DType::f32)");
}

}  // namespace

void CpuBackend::softmax_forward(const Tensor& x, int64_t dim, bool log, const Tensor& y) {
  const char* op = log ? "log_softmax" : "softmax";
  if (is_half(x) || is_half(y)) {  // f16, bf16: computed in f32, rounded once
    MINIDL_CHECK(y.dtype() == x.dtype(), op, " (cpu): output ", y.meta(), " must have x's dtype ", x.meta());
    return in_f32(y, [&](const Tensor& yf) { softmax_forward(widen_half(x), dim, log, yf); });
  }
  check_float(x, op, "x");
  MINIDL_CHECK(y.dtype() == x.dtype() && y.shape() == x.shape() && y.is_contiguous(), op, " (cpu): output ",
               y.meta(), " must be contiguous with x's shape and dtype ", x.meta());
  const Layout L = common::softmax_layout("cpu", x, dim, op);
  dispatch_wide(x.dtype(), op, [&](auto t) {
    using T = decltype(t);
    forward<T>(x.data<T>(), y.data<T>(), L, log);
  });
}

void CpuBackend::softmax_backward(const Tensor& gy, const Tensor& y, int64_t dim, bool log, const Tensor& gx) {
  const char* op = log ? "log_softmax_backward" : "softmax_backward";
  if (is_half(gy) || is_half(y) || is_half(gx)) {
    MINIDL_CHECK(gy.dtype() == y.dtype() && gx.dtype() == y.dtype(), op, " (cpu): gy ", gy.meta(), ", y ", y.meta(),
                 " and gx ", gx.meta(), " must share their dtype");
    return in_f32(gx, [&](const Tensor& gxf) { softmax_backward(widen_half(gy), widen_half(y), dim, log, gxf); });
  }
  check_float(y, op, "y");
  MINIDL_CHECK(gy.dtype() == y.dtype() && gy.shape() == y.shape() && gx.dtype() == y.dtype() &&
                   gx.shape() == y.shape() && gx.is_contiguous(),
               op, " (cpu): gy ", gy.meta(), ", y ", y.meta(), " and gx ", gx.meta(),
               " must share shape and dtype");
  const Layout L = common::softmax_layout("cpu", y, dim, op);
  common::softmax_layout("cpu", gy, dim, op);  // contiguity
  dispatch_wide(y.dtype(), op, [&](auto t) {
    using T = decltype(t);
    backward<T>(gy.data<T>(), y.data<T>(), gx.data<T>(), L, log);
  });
}

namespace {

template <typename T>
void nll_fwd(const Tensor& log_probs, const Tensor& target, const Tensor& losses) {
  const int64_t N = log_probs.size(0), C = log_probs.size(1);
  const int64_t* tg = target.data<int64_t>();
  const int64_t ts = target.stride(0);
  // Validate every target before writing anything, so a bad batch leaves no partial result and the
  // error (not a wild read) is what the user sees.
  for (int64_t n = 0; n < N; ++n) {
    const int64_t t = tg[n * ts];
    MINIDL_CHECK(t >= 0 && t < C, "cross_entropy/nll_loss: target[", n, "] = ", t,
                 " is out of range for C = ", C, " classes; targets must be class indices in [0, ", C,
                 ") (check the label encoding or the number of classes of the model's output layer)");
  }
  const T* lp = log_probs.data<T>();
  T* out = losses.data<T>();
  const int64_t os = losses.stride(0);
  for (int64_t n = 0; n < N; ++n) out[n * os] = -lp[n * C + tg[n * ts]];
}

template <typename T>
void nll_bwd(const Tensor& g, const Tensor& target, const Tensor& glogp) {
  const int64_t N = glogp.size(0), C = glogp.size(1);
  const int64_t* tg = target.data<int64_t>();
  const int64_t ts = target.stride(0);
  const T* gd = g.data<T>();
  const int64_t gs = g.dim() == 0 ? 0 : g.stride(0);
  T* out = glogp.data<T>();
  std::fill(out, out + N * C, T(0));
  for (int64_t n = 0; n < N; ++n) {
    const int64_t t = tg[n * ts];
    MINIDL_CHECK(t >= 0 && t < C, "nll_loss backward: target[", n, "] = ", t, " is out of range for C = ", C);
    out[n * C + t] = -gd[n * gs];
  }
}

}  // namespace

void CpuBackend::nll_forward(const Tensor& log_probs, const Tensor& target, const Tensor& losses) {
  if (is_half(log_probs) || is_half(losses)) {
    MINIDL_CHECK(losses.dtype() == log_probs.dtype(), "nll_loss (cpu): losses ", losses.meta(),
                 " must have the input's dtype ", log_probs.meta());
    return in_f32(losses, [&](const Tensor& lf) { nll_forward(widen_half(log_probs), target, lf); });
  }
  check_float(log_probs, "nll_loss", "log_probs");
  common::check_nll_forward("cpu", log_probs, target, losses);
  dispatch_wide(log_probs.dtype(), "nll_loss", [&](auto t) { nll_fwd<decltype(t)>(log_probs, target, losses); });
}

void CpuBackend::nll_backward(const Tensor& g, const Tensor& target, const Tensor& glogp) {
  if (is_half(g) || is_half(glogp)) {
    MINIDL_CHECK(g.dtype() == glogp.dtype(), "nll_loss_backward (cpu): g ", g.meta(), " must have glogp's dtype ",
                 glogp.meta());
    return in_f32(glogp, [&](const Tensor& gf) { nll_backward(widen_half(g), target, gf); });
  }
  check_float(glogp, "nll_loss_backward", "glogp");
  common::check_nll_backward("cpu", g, target, glogp);
  dispatch_wide(glogp.dtype(), "nll_loss_backward", [&](auto t) { nll_bwd<decltype(t)>(g, target, glogp); });
}

}  // namespace minidl::cpu
