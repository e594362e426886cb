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

// One plane of the affine output: y = (x - m) * a + b, then + residual and ReLU when asked
// (r null: no add). Subtracting the mean first keeps f32 outputs accurate when |mean| is much
// larger than the spread. Each variant is its own loop so each vectorises.
template <typename A>
void affine_plane(const A* xp, A* yp, const A* rp, int64_t n, A m, A a, A b, bool relu) {
  if (rp != nullptr) {
    for (int64_t s = 0; s < n; ++s) {
      const A z = (xp[s] - m) * a + b;
      const A t = z + rp[s];
      yp[s] = relu ? (t > A(0) ? t : A(0)) : t;
    }
  } else if (relu) {
    for (int64_t s = 0; s < n; ++s) {
      const A z = (xp[s] - m) * a + b;
      yp[s] = z > A(0) ? z : A(0);
    }
  } else {
    for (int64_t s = 0; s < n; ++s) yp[s] = (xp[s] - m) * a + b;
  }
}

// y = (x - mean[c]) * alpha[c] + bias[c], then + residual and ReLU when asked (residual null: no
// add), parallel over (n, c) planes.
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
      const A* rp = residual != nullptr ? br.in(residual + p * L.S, L.S) : nullptr;
      affine_plane<A>(bx.in(x + p * L.S, L.S), by.scratch(y + p * L.S, L.S), rp, L.S, static_cast<A>(mean[c]),
                      static_cast<A>(alpha[c]), static_cast<A>(bias[c]), relu);
      by.out(y + p * L.S, L.S);
    }
  }
}

// Asks for a plane's cache lines ahead of its use. The per-channel loops visit a channel's planes
// N x C x S values apart; the hardware prefetchers stop at page boundaries, so each plane of a
// small image (4 KiB at 32 x 32) would start with a stall on memory for every line.
inline void prefetch_plane(const void* p, int64_t bytes) {
  const char* c = static_cast<const char*>(p);
  for (int64_t off = 0; off < bytes; off += 64) __builtin_prefetch(c + off, 0, 3);
}

// Whether a channel's planes of every operand (bytes in all) fit in the private cache beside the
// current channel's: then each channel's last pass (which reads from cache) asks for the next
// channel's planes, whose first pass then finds them there. The channels' planes are C planes
// apart in memory, so without this each one starts with a wait on memory (one-plane-ahead
// prefetches inside the first pass hid only part of it: backward ran at 19 GB/s on one core).
inline bool channel_ahead_fits(int64_t bytes) { return bytes <= (int64_t{384} << 10); }

// Per-plane sums in double over kLanes independent accumulators: value k goes to lane k % kLanes
// whatever the plane's address, and the lanes are added in a fixed tree at the end, so a sum never
// depends on where the data sits (an `omp simd` reduction would: its peel for alignment moves
// values between lanes). The compiler keeps each add's order and still vectorises across lanes
// (two 8-double vectors), where a single accumulator would serialise every add.
constexpr int kLanes = 16;

inline double sum_lanes(const double (&a)[kLanes]) {
  double t[kLanes / 2];
  for (int j = 0; j < kLanes / 2; ++j) t[j] = a[j] + a[j + kLanes / 2];
  return ((t[0] + t[4]) + (t[2] + t[6])) + ((t[1] + t[5]) + (t[3] + t[7]));
}

template <typename T>
double plane_sum(const T* p, int64_t n) {
  double a[kLanes] = {};
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes) {
    for (int j = 0; j < kLanes; ++j) a[j] += static_cast<double>(p[k + j]);
  }
  for (int j = 0; k + j < n; ++j) a[j] += static_cast<double>(p[k + j]);
  return sum_lanes(a);
}

template <typename T>
double plane_sq_dev(const T* p, int64_t n, double m) {
  double a[kLanes] = {};
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const double d = static_cast<double>(p[k + j]) - m;
      a[j] += d * d;
    }
  }
  for (int j = 0; k + j < n; ++j) {
    const double d = static_cast<double>(p[k + j]) - m;
    a[j] += d * d;
  }
  return sum_lanes(a);
}

// Adds sum(g) and sum(g * (x - m)) over one plane.
template <typename T>
void plane_grad_sums(const T* g, const T* x, int64_t n, double m, double& sg, double& sd) {
  double a[kLanes] = {}, b[kLanes] = {};
  int64_t k = 0;
  for (; k + kLanes <= n; k += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const double gv = static_cast<double>(g[k + j]);
      a[j] += gv;
      b[j] += gv * (static_cast<double>(x[k + j]) - m);
    }
  }
  for (int j = 0; k + j < n; ++j) {
    const double gv = static_cast<double>(g[k + j]);
    a[j] += gv;
    b[j] += gv * (static_cast<double>(x[k + j]) - m);
  }
  sg += sum_lanes(a);
  sd += sum_lanes(b);
}

}  // namespace minidl::cpu::bn_detail
