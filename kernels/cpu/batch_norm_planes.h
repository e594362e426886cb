// The per-plane numerics of the CPU batch norm (batch_norm.cpp): the f16 plane buffers, the
// affine (+ residual + ReLU) output loops and the double-accumulated plane sums. One (n, c) plane
// of S contiguous values at a time; batch_norm.cpp walks the planes and owns the statistics.
#pragma once
#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "kernels/common/checks.h"
#include "kernels/cpu/half.h"

namespace minidl::cpu::bn_detail {

// f16 activations are computed in f32 one plane at a time: a plane is widened into a per-thread
// f32 buffer (F16C, half.h), the f32 loops run on it unchanged, and a result plane is narrowed
// back. That gives the bits of staging the whole tensor through f32 copies (what this kernel did
// before) without the copies: five f32 tensors at once in a fused backward under autocast. Plain
// f32 and f64 planes are used in place. The buffers are the loops' own scratch (a plane of S
// values each), like a register file, not tensors.
template <typename T>
class PlaneBuffer {
 public:
  using A = compute_t<T>;
  // The plane [p, p + n) as A values: p itself, or its widened copy.
  const A* in(const T* p, int64_t n) {
    if constexpr (std::is_same_v<T, A>) {
      return p;
    } else {
      buf_.resize(static_cast<size_t>(n));
      half_to_float(p, buf_.data(), n);
      return buf_.data();
    }
  }
  // Where to compute the plane that goes to p: p itself, or the buffer (then out() narrows it).
  A* scratch(T* p, int64_t n) {
    if constexpr (std::is_same_v<T, A>) {
      return p;
    } else {
      buf_.resize(static_cast<size_t>(n));
      return buf_.data();
    }
  }
  void out(T* p, int64_t n) {
    if constexpr (!std::is_same_v<T, A>) float_to_half(buf_.data(), p, n);
  }

 private:
  std::vector<A> buf_;
};

// y = (x - mean[c]) * alpha[c] + bias[c], then + residual and ReLU when asked (residual null: no
// add), parallel over (n, c) planes. Subtracting the mean first keeps f32 outputs accurate when
// |mean| is much larger than the spread. Each variant is its own loop so each vectorises.
template <typename T>
void apply_affine(const T* x, T* y, const common::ChannelLayout& L, const std::vector<double>& mean, const std::vector<double>& alpha,
                  const std::vector<double>& bias, const T* residual = nullptr, bool relu = false) {
  using A = compute_t<T>;
  const int64_t planes = L.N * L.C;
#pragma omp parallel if (planes * L.S > 32768)
  {
    PlaneBuffer<T> bx, br, by;
#pragma omp for schedule(static)
    for (int64_t p = 0; p < planes; ++p) {
      const int64_t c = p % L.C;
      const A m = static_cast<A>(mean[c]);
      const A a = static_cast<A>(alpha[c]);
      const A b = static_cast<A>(bias[c]);
      const A* xp = bx.in(x + p * L.S, L.S);
      A* yp = by.scratch(y + p * L.S, L.S);
      const A* rp = residual != nullptr ? br.in(residual + p * L.S, L.S) : nullptr;
      if (rp != nullptr) {
        for (int64_t s = 0; s < L.S; ++s) {
          const A z = (xp[s] - m) * a + b;
          const A t = z + rp[s];
          yp[s] = relu ? (t > A(0) ? t : A(0)) : t;
        }
      } else if (relu) {
        for (int64_t s = 0; s < L.S; ++s) {
          const A z = (xp[s] - m) * a + b;
          yp[s] = z > A(0) ? z : A(0);
        }
      } else {
        for (int64_t s = 0; s < L.S; ++s) yp[s] = (xp[s] - m) * a + b;
      }
      by.out(y + p * L.S, L.S);
    }
  }
}

// Per-plane sums with four independent accumulators: the compiler may not reorder floating-point
// adds, so a single accumulator would make these loops add-latency bound.
template <typename T>
double plane_sum(const T* p, int64_t n) {
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  int64_t k = 0;
  for (; k + 4 <= n; k += 4) {
    a0 += static_cast<double>(p[k]);
    a1 += static_cast<double>(p[k + 1]);
    a2 += static_cast<double>(p[k + 2]);
    a3 += static_cast<double>(p[k + 3]);
  }
  for (; k < n; ++k) a0 += static_cast<double>(p[k]);
  return (a0 + a1) + (a2 + a3);
}

template <typename T>
double plane_sq_dev(const T* p, int64_t n, double m) {
  double a[4] = {0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 4 <= n; k += 4) {
    for (int j = 0; j < 4; ++j) {
      const double d = static_cast<double>(p[k + j]) - m;
      a[j] += d * d;
    }
  }
  for (; k < n; ++k) {
    const double d = static_cast<double>(p[k]) - m;
    a[0] += d * d;
  }
  return (a[0] + a[1]) + (a[2] + a[3]);
}

// Adds sum(g) and sum(g * (x - m)) over one plane.
template <typename T>
void plane_grad_sums(const T* g, const T* x, int64_t n, double m, double& sg, double& sd) {
  double a[4] = {0, 0, 0, 0}, b[4] = {0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 4 <= n; k += 4) {
    for (int j = 0; j < 4; ++j) {
      const double gv = static_cast<double>(g[k + j]);
      a[j] += gv;
      b[j] += gv * (static_cast<double>(x[k + j]) - m);
    }
  }
  for (; k < n; ++k) {
    const double gv = static_cast<double>(g[k]);
    a[0] += gv;
    b[0] += gv * (static_cast<double>(x[k]) - m);
  }
  sg += (a[0] + a[1]) + (a[2] + a[3]);
  sd += (b[0] + b[1]) + (b[2] + b[3]);
}

}  // namespace minidl::cpu::bn_detail
