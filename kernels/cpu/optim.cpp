// The CPU's fused Adam/AdamW step: every parameter of a group in one multi-threaded pass that
// reads p, g, m, v and writes p, m, v once. optim::Adam::update() runs ten tensor ops per
// parameter instead, single-threaded, with four temporaries the size of the parameter: on the
// Keras study's small CNN (41 M parameters) that made an Adam step cost about 120 ms more than an
// SGD step on 2 cores, more than the forward pass at batch 16.
//
// The arithmetic is update()'s to the bit, so a run gives the same weights fused or not: each
// tensor op rounds to f32 once, scalars are rounded to f32 first (as a scalar operand is), and
// `x + alpha * y` (Tensor::add_ with alpha) is one fused multiply-add where the compiler contracts
// the elementwise kernel's loop into one, i.e. when the build targets FMA (-march=native on an FMA
// machine), two roundings otherwise. This file is compiled with -ffp-contract=off so that the
// compiler fuses nothing else. tests/optim/optimizer_fused_test.cpp compares both paths bit for bit.
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "kernels/cpu/cpu_backend.h"

namespace minidl::cpu {
namespace {

// Tensor::add_(y, alpha) on f32: x + alpha * y as kernels/cpu/elementwise.cpp computes it.
inline float add_scaled(float x, float alpha, float y) {
#if defined(__FMA__)
  return std::fma(alpha, y, x);
#else
  return x + alpha * y;
#endif
}

// PyTorch's maximum: NaN propagates (elementwise.cpp's apply_arith).
inline float maximum(float a, float b) {
  if (std::isnan(a) || std::isnan(b)) return a + b;
  return a > b ? a : b;
}

// One parameter's scalars, each rounded to f32 as update()'s scalar operands are.
struct AdamScalars {
  float decay;        // AdamW: p *= 1 - lr * wd
  float wd;           // Adam: g += wd * p
  float beta1, one_minus_beta1, beta2, one_minus_beta2;
  float bc2_sqrt;     // sqrt(1 - beta2^t)
  float eps;          // eps, or Keras' eps / sqrt(1 - beta2^t)
  float neg_step;     // -lr / (1 - beta1^t)
};

struct AdamSlice {
  float *p, *m, *v, *vmax;
  const float* g;
  int64_t n;
  size_t param;       // index into the scalars
};

constexpr int64_t kSliceElems = 1 << 16;   // 256 KiB of each stream: L2-sized, many slices to share out

// Contiguous f32 of `like`'s shape on `like`'s device.
bool flat_f32_like(const Tensor& t, const Tensor& like) {
  return t.defined() && t.device() == like.device() && t.dtype() == DType::f32 && t.is_contiguous() &&
         t.shape() == like.shape();
}

}  // namespace

bool fused_adam_qualifies(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                          const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                          const std::vector<Tensor>& max_exp_avg_sq, const std::vector<int64_t>& steps,
                          const AdamHyper& h) {
  const size_t n = params.size();
  if (n == 0 || h.skip_if != nullptr || h.lr_device != nullptr || h.step_device != nullptr || grads.size() != n || exp_avg.size() != n || exp_avg_sq.size() != n ||
      steps.size() != n || (h.amsgrad && max_exp_avg_sq.size() != n)) {
    return false;
  }
  for (size_t i = 0; i < n; ++i) {
    const Tensor& p = params[i];
    if (!p.defined() || p.device().target() != DeviceType::CPU || p.device() != params[0].device() ||
        !flat_f32_like(p, p) || !flat_f32_like(grads[i], p) || !flat_f32_like(exp_avg[i], p) ||
        !flat_f32_like(exp_avg_sq[i], p) || (h.amsgrad && !flat_f32_like(max_exp_avg_sq[i], p))) {
      return false;
    }
  }
  return true;
}

bool CpuBackend::fused_adam_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                                 const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                                 const std::vector<Tensor>& max_exp_avg_sq, const std::vector<int64_t>& steps,
                                 const AdamHyper& h) {
  if (!fused_adam_qualifies(params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, steps, h)) return false;
  const size_t n = params.size();
  std::vector<AdamScalars> sc(n);
  std::vector<AdamSlice> slices;
  for (size_t i = 0; i < n; ++i) {
    MINIDL_CHECK(steps[i] >= 1, "fused_adam_step (cpu): step ", steps[i], " of parameter ", i, " must be >= 1");
    const auto step = static_cast<double>(steps[i]);
    const double bc1 = 1.0 - std::pow(h.beta1, step);
    const double bc2_sqrt = std::sqrt(1.0 - std::pow(h.beta2, step));
    sc[i] = {static_cast<float>(1.0 - h.lr * h.weight_decay),
             static_cast<float>(h.weight_decay),
             static_cast<float>(h.beta1),
             static_cast<float>(1.0 - h.beta1),
             static_cast<float>(h.beta2),
             static_cast<float>(1.0 - h.beta2),
             static_cast<float>(bc2_sqrt),
             static_cast<float>(h.keras_eps ? h.eps / bc2_sqrt : h.eps),
             static_cast<float>(-(h.lr / bc1))};
    const int64_t numel = params[i].numel();
    for (int64_t off = 0; off < numel; off += kSliceElems) {
      slices.push_back({params[i].data<float>() + off, exp_avg[i].data<float>() + off,
                        exp_avg_sq[i].data<float>() + off,
                        h.amsgrad ? max_exp_avg_sq[i].data<float>() + off : nullptr, grads[i].data<float>() + off,
                        std::min(kSliceElems, numel - off), i});
    }
  }
  const bool wd = h.weight_decay != 0.0, decoupled = h.decoupled, maximize = h.maximize, amsgrad = h.amsgrad;
  const auto count = static_cast<int64_t>(slices.size());
#pragma omp parallel for schedule(static) if (count > 1)
  for (int64_t k = 0; k < count; ++k) {
    const AdamSlice& s = slices[static_cast<size_t>(k)];
    const AdamScalars& c = sc[s.param];
    float *p = s.p, *m = s.m, *v = s.v, *vmax = s.vmax;
    const float* g = s.g;
    for (int64_t j = 0; j < s.n; ++j) {
      float gj = maximize ? -g[j] : g[j];
      if (decoupled) {
        p[j] = p[j] * c.decay;
      } else if (wd) {
        gj = add_scaled(gj, c.wd, p[j]);
      }
      m[j] = add_scaled(m[j] * c.beta1, c.one_minus_beta1, gj);
      v[j] = add_scaled(v[j] * c.beta2, c.one_minus_beta2, gj * gj);
      float second = v[j];
      if (amsgrad) second = vmax[j] = maximum(vmax[j], v[j]);
      const float denom = std::sqrt(second) / c.bc2_sqrt + c.eps;
      p[j] = add_scaled(p[j], c.neg_step, m[j] / denom);
    }
  }
  return true;
}

}  // namespace minidl::cpu
