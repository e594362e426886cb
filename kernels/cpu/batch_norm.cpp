// CPU batch norm: the reference the CUDA kernels are checked against, and what the CPU experiments
// train with. Statistics accumulate in double so f32 results match PyTorch's to rounding, and the
// running-stat update follows PyTorch exactly (biased variance to normalise, unbiased to track).
// The fused forms (+ residual add + ReLU) run the same loops with the add and the mask inside, so
// in f32 and f64 they give the composed ops' values bit for bit.
#include <cmath>
#include <cstdint>
#include <initializer_list>
#include <type_traits>
#include <vector>

#include "kernels/cpu/batch_norm_planes.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/half.h"
#include "kernels/common/checks.h"
#include "kernels/cpu/workspace.h"

namespace minidl::cpu {
namespace {

using namespace bn_detail;   // PlaneBuffer, affine_plane, apply_affine, prefetch_plane, plane sums

// Per-channel tensors ([C], any stride) are read into and written from double, so their dtype
// need not match x's (mixed precision keeps them f32 under f16 activations).
std::vector<double> load_channels(const Tensor& t, int64_t C, double fallback) {
  std::vector<double> v(static_cast<size_t>(C), fallback);
  if (!t.defined()) return v;
  MINIDL_CHECK(t.numel() == C, "batch_norm (cpu): per-channel tensor ", t.meta(), " should have ", C,
               " elements");
  const int64_t st = t.dim() == 0 ? 0 : t.stride(0);
  for (int64_t c = 0; c < C; ++c) {
    switch (t.dtype()) {
      case DType::f32: v[c] = t.data<float>()[c * st]; break;
      case DType::f64: v[c] = t.data<double>()[c * st]; break;
      case DType::f16: v[c] = static_cast<float>(t.data<Half>()[c * st]); break;
      case DType::bf16: v[c] = static_cast<float>(t.data<BFloat16>()[c * st]); break;
      default: MINIDL_FAIL("batch_norm (cpu): per-channel tensor ", t.meta(), " must be f32, f64, f16 or bf16");
    }
  }
  return v;
}

void store_channels(const Tensor& t, const std::vector<double>& v) {
  if (!t.defined()) return;
  const int64_t C = static_cast<int64_t>(v.size());
  MINIDL_CHECK(t.numel() == C, "batch_norm (cpu): per-channel output ", t.meta(), " should have ", C,
               " elements");
  const int64_t st = t.dim() == 0 ? 0 : t.stride(0);
  for (int64_t c = 0; c < C; ++c) {
    switch (t.dtype()) {
      case DType::f32: t.data<float>()[c * st] = static_cast<float>(v[c]); break;
      case DType::f64: t.data<double>()[c * st] = v[c]; break;
      case DType::f16: t.data<Half>()[c * st] = Half(static_cast<float>(v[c])); break;
      case DType::bf16: t.data<BFloat16>()[c * st] = BFloat16(static_cast<float>(v[c])); break;
      default: MINIDL_FAIL("batch_norm (cpu): per-channel tensor ", t.meta(), " must be f32, f64, f16 or bf16");
    }
  }
}

using Layout = common::ChannelLayout;  // x viewed as [N, C, S]

Layout layout_of(const Tensor& x, const char* what) {
  return common::channel_layout("cpu", x, "batch_norm", what, /*allow_channels_last=*/false);
}

// What the fused forms add around batch norm: a residual (undefined: none) and the ReLU, forward;
// the ReLU's output whose sign masks the incoming gradient (undefined: no mask) and where the
// masked gradient goes (the residual's gradient), backward. Tensors contiguous, of x's dtype.
struct Tail {
  Tensor residual;
  bool relu = false;
};
struct GradTail {
  Tensor y;      // the forward's output: gm = y > 0 ? gy : 0
  Tensor gres;   // receives gm (the residual's gradient)
};

template <typename T>
const T* data_or_null(const Tensor& t) {
  return t.defined() ? t.data<T>() : nullptr;
}

template <typename T>
void forward_train(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& running_mean,
                   const Tensor& running_var, double momentum, double eps, const Tensor& y,
                   const Tensor& save_mean, const Tensor& save_invstd, const Tail& tail) {
  const Layout L = layout_of(x, "x");
  const std::vector<double> w = load_channels(weight, L.C, 1.0);
  const std::vector<double> b = load_channels(bias, L.C, 0.0);
  std::vector<double> mean(static_cast<size_t>(L.C)), var(static_cast<size_t>(L.C)),
      invstd(static_cast<size_t>(L.C));
  using A = compute_t<T>;
  const T* xd = x.data<T>();
  const T* rd = data_or_null<T>(tail.residual);
  T* yd = y.data<T>();
  const int64_t n = L.N * L.S, plane_bytes = L.S * static_cast<int64_t>(sizeof(T));
  std::vector<double> alpha(static_cast<size_t>(L.C));
  // Per channel: two passes (mean, then squared deviations) in double, no cancellation for large
  // means, then the output while the channel's planes are still in cache: x comes from memory once.
#pragma omp parallel if (L.C > 1 && L.N * L.C * L.S > 32768)
  {
  PlaneBuffer<T> bx, br, by;
  const bool ahead = channel_ahead_fits(L.N * plane_bytes * (rd != nullptr ? 2 : 1));
#pragma omp for schedule(static)
  for (int64_t c = 0; c < L.C; ++c) {
    auto plane = [&](int64_t i) { return (i * L.C + c) * L.S; };
    double s = 0.0;
    for (int64_t i = 0; i < L.N; ++i) {
      if (!ahead && i + 1 < L.N) prefetch_plane(xd + plane(i + 1), plane_bytes);
      s += plane_sum(bx.in(xd + plane(i), L.S), L.S);
    }
    const double m = n > 0 ? s / static_cast<double>(n) : 0.0;
    double sq = 0.0;
    for (int64_t i = 0; i < L.N; ++i) sq += plane_sq_dev(bx.in(xd + plane(i), L.S), L.S, m);
    mean[c] = m;
    var[c] = n > 0 ? sq / static_cast<double>(n) : 0.0;
    invstd[c] = 1.0 / std::sqrt(var[c] + eps);
    alpha[c] = invstd[c] * w[c];
    for (int64_t i = 0; i < L.N; ++i) {
      if (ahead && c + 1 < L.C) {  // the next channel's plane i, while this pass runs from cache
        prefetch_plane(xd + plane(i) + L.S, plane_bytes);
        if (rd != nullptr) prefetch_plane(rd + plane(i) + L.S, plane_bytes);
      } else if (rd != nullptr && i + 1 < L.N) {
        prefetch_plane(rd + plane(i + 1), plane_bytes);
      }
      const A* rp = rd != nullptr ? br.in(rd + plane(i), L.S) : nullptr;
      affine_plane<A>(bx.in(xd + plane(i), L.S), by.scratch(yd + plane(i), L.S), rp, L.S, static_cast<A>(m),
                      static_cast<A>(alpha[c]), static_cast<A>(b[c]), tail.relu);
      by.out(yd + plane(i), L.S);
    }
  }
  }
  store_channels(save_mean, mean);
  store_channels(save_invstd, invstd);

  if (running_mean.defined() || running_var.defined()) {
    // PyTorch tracks the unbiased variance; with one value per channel it would divide by zero,
    // so the front-end refuses that case before we get here.
    const double unbias = n > 1 ? static_cast<double>(n) / static_cast<double>(n - 1) : 1.0;
    if (running_mean.defined()) {
      std::vector<double> rm = load_channels(running_mean, L.C, 0.0);
      for (int64_t c = 0; c < L.C; ++c) rm[c] = (1.0 - momentum) * rm[c] + momentum * mean[c];
      store_channels(running_mean, rm);
    }
    if (running_var.defined()) {
      std::vector<double> rv = load_channels(running_var, L.C, 1.0);
      for (int64_t c = 0; c < L.C; ++c) rv[c] = (1.0 - momentum) * rv[c] + momentum * var[c] * unbias;
      store_channels(running_var, rv);
    }
  }
}

// save_mean / save_invstd (may be undefined) receive the statistics used, for a fused backward.
template <typename T>
void forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& mean_t,
                  const Tensor& var_t, double eps, const Tensor& y, const Tensor& save_mean,
                  const Tensor& save_invstd, const Tail& tail) {
  const Layout L = layout_of(x, "x");
  const std::vector<double> w = load_channels(weight, L.C, 1.0);
  const std::vector<double> b = load_channels(bias, L.C, 0.0);
  const std::vector<double> mean = load_channels(mean_t, L.C, 0.0);
  const std::vector<double> var = load_channels(var_t, L.C, 1.0);
  std::vector<double> alpha(static_cast<size_t>(L.C)), invstd(static_cast<size_t>(L.C));
  for (int64_t c = 0; c < L.C; ++c) {
    invstd[c] = 1.0 / std::sqrt(var[c] + eps);
    alpha[c] = w[c] / std::sqrt(var[c] + eps);
  }
  apply_affine<T>(x.data<T>(), y.data<T>(), L, mean, alpha, b, data_or_null<T>(tail.residual), tail.relu);
  store_channels(save_mean, mean);
  store_channels(save_invstd, invstd);
}

// training: gx through the batch statistics; otherwise gx = gm * invstd * w (running statistics).
// gm = y > 0 ? gy : 0 with a mask (tail.y), else gy; it is written to the residual's gradient when
// there is one (tail.gres), else rebuilt for each pass.
template <typename T>
void backward(const Tensor& gy, const Tensor& x, const Tensor& weight, const Tensor& save_mean,
              const Tensor& save_invstd, bool training, const Tensor& gx, const Tensor& gweight,
              const Tensor& gbias, const GradTail& tail) {
  using A = compute_t<T>;
  const Layout L = layout_of(x, "x");
  const Layout G = layout_of(gy, "gy");
  MINIDL_CHECK(G.N == L.N && G.C == L.C && G.S == L.S, "batch_norm_backward (cpu): gy ", gy.meta(),
               " does not match x ", x.meta());
  const std::vector<double> w = load_channels(weight, L.C, 1.0);
  const std::vector<double> mean = load_channels(save_mean, L.C, 0.0);
  const std::vector<double> invstd = load_channels(save_invstd, L.C, 1.0);
  std::vector<double> sum_gy(static_cast<size_t>(L.C)), dot(static_cast<size_t>(L.C));
  const T* xd = x.data<T>();
  const T* gd = gy.data<T>();
  const T* yd = data_or_null<T>(tail.y);
  T* gres = tail.gres.defined() ? tail.gres.data<T>() : nullptr;
  T* gxd = gx.defined() ? gx.data<T>() : nullptr;
  const int64_t n = L.N * L.S;
  const double inv_n = n > 0 ? 1.0 / static_cast<double>(n) : 0.0;
#pragma omp parallel if (L.C > 1 && L.N * L.C * L.S > 32768)
  {
    PlaneBuffer<T> bg, by, bm, br, bx, bo;   // gy, y, gm (into gres), gres read back, x, gx
    std::vector<A> masked;                   // gm when there is no residual's gradient to hold it
    // One plane of gm as A values (written to gres too when there is one).
    auto plane_grad = [&](int64_t base) -> const A* {
      const A* g = bg.in(gd + base, L.S);
      if (yd == nullptr) return g;
      const A* yv = by.in(yd + base, L.S);
      A* out;
      if (gres != nullptr) {
        out = bm.scratch(gres + base, L.S);
      } else {
        masked.resize(static_cast<size_t>(L.S));
        out = masked.data();
      }
      for (int64_t k = 0; k < L.S; ++k) out[k] = yv[k] > A(0) ? g[k] : A(0);
      if (gres != nullptr) bm.out(gres + base, L.S);
      return out;
    };
    const int64_t bytes = L.S * static_cast<int64_t>(sizeof(T));
    // Only with an output pass (gx wanted) is there a pass from cache to prefetch the next channel in.
    const bool ahead = gxd != nullptr && channel_ahead_fits(L.N * bytes * (yd != nullptr ? 3 : 2));
#pragma omp for schedule(static)
    for (int64_t c = 0; c < L.C; ++c) {
      const double m = mean[c];
      double sg = 0.0, sd = 0.0;
      for (int64_t i = 0; i < L.N; ++i) {
        const int64_t base = (i * L.C + c) * L.S;
        if (!ahead && i + 1 < L.N) {  // the next plane's operands, L.C planes away
          const int64_t next = base + L.C * L.S;
          prefetch_plane(gd + next, bytes);
          prefetch_plane(xd + next, bytes);
          if (yd != nullptr) prefetch_plane(yd + next, bytes);
        }
        const A* g = plane_grad(base);
        plane_grad_sums(g, bx.in(xd + base, L.S), L.S, m, sg, sd);
      }
      sum_gy[c] = sg;
      dot[c] = sd;
      if (gxd == nullptr) continue;
      // gx = (gy - mean(gy) - xhat * mean(gy * xhat)) * invstd * w, with xhat = (x - m) * invstd.
      const double is = invstd[c];
      const double grad_mean = training ? sg * inv_n : 0.0;
      const double proj = training ? sd * is * is * inv_n : 0.0;
      const double scale = is * w[c];
      for (int64_t i = 0; i < L.N; ++i) {
        const int64_t base = (i * L.C + c) * L.S;
        if (ahead && c + 1 < L.C) {  // the next channel's plane i, while this pass runs from cache
          prefetch_plane(gd + base + L.S, bytes);
          prefetch_plane(xd + base + L.S, bytes);
          if (yd != nullptr) prefetch_plane(yd + base + L.S, bytes);
        }
        const A* g = gres != nullptr ? br.in(gres + base, L.S) : plane_grad(base);
        const A* xv = bx.in(xd + base, L.S);
        A* out = bo.scratch(gxd + base, L.S);
        for (int64_t k = 0; k < L.S; ++k) {
          const double xm = static_cast<double>(xv[k]) - m;
          out[k] = static_cast<A>((static_cast<double>(g[k]) - grad_mean - xm * proj) * scale);
        }
        bo.out(gxd + base, L.S);
      }
    }
  }
  if (gweight.defined()) {
    std::vector<double> gw(static_cast<size_t>(L.C));
    for (int64_t c = 0; c < L.C; ++c) gw[c] = dot[c] * invstd[c];
    store_channels(gweight, gw);
  }
  store_channels(gbias, sum_gy);
}

void check_float(const Tensor& x, const char* op) {
  MINIDL_CHECK(x.dtype() == DType::f32 || x.dtype() == DType::f64, op, " (cpu): x ", x.meta(),
               " must be f32 or f64; convert with .to(DType::f32)");
}

void unstage(const Tensor& tmp, const Tensor& dst) { narrow_into(tmp, dst); }

void check_act_layout(const char* op, const Tensor& x, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    MINIDL_CHECK(t->shape() == x.shape() && t->dtype() == x.dtype(), op, " (cpu): ", t->meta(),
                 " does not match the input ", x.meta());
  }
}

// An operand as the fused loops read it: contiguous NCHW in its own dtype (a channels-last tensor
// is copied to NCHW; the reference favours one code path over speed).
Tensor staged_input(const Tensor& t) { return t.defined() ? t.contiguous() : t; }
// An output the fused loops can write: t itself when contiguous, else a contiguous temporary of
// its dtype that unstage copies back.
Tensor staged_output(const Tensor& t) {
  if (!t.defined() || t.is_contiguous()) return t;
  return empty(t.shape(), {t.dtype(), t.device(), false});
}

void check_act_dtype(const Tensor& x, const char* op) {
  MINIDL_CHECK(is_floating(x.dtype()), op, " (cpu): x ", x.meta(),
               " must be f32, f64, f16 or bf16; convert with .to(DType::f32)");
}

}  // namespace

BatchNormForwardStage stage_batch_norm_forward(const Tensor& x, const Tensor& y) {
  BatchNormForwardStage s;
  s.x = staged_input(x);
  s.y = staged_output(y);
  return s;
}

BatchNormBackwardStage stage_batch_norm_backward(const Tensor& gy, const Tensor& x, const Tensor& gx) {
  BatchNormBackwardStage s;
  s.gy = staged_input(gy);
  s.x = staged_input(x);
  s.gx = staged_output(gx);
  return s;
}

// The fused forms stage the plain batch norm's operands first, then their own.
BatchNormActForwardStage stage_batch_norm_act_forward(const Tensor& x, const Tensor& residual, const Tensor& y) {
  const BatchNormForwardStage plain = stage_batch_norm_forward(x, y);
  return {plain.x, plain.y, staged_input(residual)};
}

BatchNormActBackwardStage stage_batch_norm_act_backward(const Tensor& gy, const Tensor& x, const Tensor& y,
                                                        const Tensor& gx, const Tensor& gresidual) {
  const BatchNormBackwardStage plain = stage_batch_norm_backward(gy, x, gx);
  const Tensor ys = staged_input(y);
  return {plain.gy, plain.x, plain.gx, ys, staged_output(gresidual)};
}

void CpuBackend::batch_norm_forward_train(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                          const Tensor& running_mean, const Tensor& running_var, double momentum,
                                          double eps, const Tensor& y, const Tensor& save_mean,
                                          const Tensor& save_invstd) {
  if (is_half(x) || is_half(y)) {  // f16, bf16 activations: f32 compute, statistics in double as for f32
    return in_f32(y, [&](const Tensor& yf) {
      batch_norm_forward_train(widen_half(x), weight, bias, running_mean, running_var, momentum, eps, yf, save_mean,
                               save_invstd);
    });
  }
  check_float(x, "batch_norm");
  const BatchNormForwardStage st = stage_batch_norm_forward(x, y);   // channels-last: through NCHW copies
  if (x.dtype() == DType::f32) {
    forward_train<float>(st.x, weight, bias, running_mean, running_var, momentum, eps, st.y, save_mean, save_invstd,
                         {});
  } else {
    forward_train<double>(st.x, weight, bias, running_mean, running_var, momentum, eps, st.y, save_mean, save_invstd,
                          {});
  }
  unstage(st.y, y);
}

void CpuBackend::batch_norm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                         const Tensor& mean, const Tensor& var, double eps, const Tensor& y) {
  if (is_half(x) || is_half(y)) {
    return in_f32(y, [&](const Tensor& yf) {
      batch_norm_forward_eval(widen_half(x), weight, bias, mean, var, eps, yf);
    });
  }
  check_float(x, "batch_norm");
  const BatchNormForwardStage st = stage_batch_norm_forward(x, y);
  if (x.dtype() == DType::f32) {
    forward_eval<float>(st.x, weight, bias, mean, var, eps, st.y, {}, {}, {});
  } else {
    forward_eval<double>(st.x, weight, bias, mean, var, eps, st.y, {}, {}, {});
  }
  unstage(st.y, y);
}

void CpuBackend::batch_norm_backward(const Tensor& gy, const Tensor& x, const Tensor& weight,
                                     const Tensor& save_mean, const Tensor& save_invstd, const Tensor& gx,
                                     const Tensor& gweight, const Tensor& gbias) {
  if (is_half(gy) || is_half(x) || is_half(gx)) {  // per-channel gradients are written in their own dtype
    return in_f32(gx, [&](const Tensor& gxf) {
      batch_norm_backward(widen_half(gy), widen_half(x), weight, save_mean, save_invstd, gxf, gweight, gbias);
    });
  }
  check_float(x, "batch_norm_backward");
  MINIDL_CHECK(gy.dtype() == x.dtype(), "batch_norm_backward (cpu): gy ", gy.meta(), " and x ", x.meta(),
               " must have the same dtype");
  const BatchNormBackwardStage st = stage_batch_norm_backward(gy, x, gx);
  if (x.dtype() == DType::f32) {
    backward<float>(st.gy, st.x, weight, save_mean, save_invstd, true, st.gx, gweight, gbias, {});
  } else {
    backward<double>(st.gy, st.x, weight, save_mean, save_invstd, true, st.gx, gweight, gbias, {});
  }
  unstage(st.gx, gx);
}

void CpuBackend::batch_norm_act_forward(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                        const Tensor& bias, const Tensor& running_mean, const Tensor& running_var,
                                        bool training, double momentum, double eps, const Tensor& y,
                                        const Tensor& save_mean, const Tensor& save_invstd) {
  const char* op = "batch_norm_relu";
  check_act_layout(op, x, {&residual, &y});
  const BatchNormActForwardStage st = stage_batch_norm_act_forward(x, residual, y);
  const Tensor &xs = st.x, &ys = st.y;
  const Tail tail{st.residual, true};
  check_act_dtype(xs, op);
  dispatch_floating(xs.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    if (training) {
      forward_train<T>(xs, weight, bias, running_mean, running_var, momentum, eps, ys, save_mean, save_invstd, tail);
    } else {
      forward_eval<T>(xs, weight, bias, running_mean, running_var, eps, ys, save_mean, save_invstd, tail);
    }
  });
  unstage(ys, y);
}

void CpuBackend::batch_norm_act_backward(const Tensor& gy, const Tensor& x, const Tensor& y, const Tensor& weight,
                                         const Tensor& /*bias*/, const Tensor& save_mean, const Tensor& save_invstd,
                                         bool training, const Tensor& gx, const Tensor& gresidual,
                                         const Tensor& gweight, const Tensor& gbias) {
  const char* op = "batch_norm_relu backward";
  check_act_layout(op, x, {&gy, &y, &gx, &gresidual});
  const BatchNormActBackwardStage st = stage_batch_norm_act_backward(gy, x, y, gx, gresidual);
  const Tensor &gys = st.gy, &xs = st.x, &gxs = st.gx;
  const GradTail tail{st.y, st.gresidual};
  check_act_dtype(xs, op);
  dispatch_floating(xs.dtype(), op, [&](auto tag) {
    using T = decltype(tag);
    backward<T>(gys, xs, weight, save_mean, save_invstd, training, gxs, gweight, gbias, tail);
  });
  unstage(gxs, gx);
  unstage(tail.gres, gresidual);
}

}  // namespace minidl::cpu
