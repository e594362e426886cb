// Batch norm forward on the GPU, plain and fused with the residual add and ReLU, in NCHW and NHWC:
// a statistics pass that reads x once with many blocks per channel (per-block partial sums, summed
// in a fixed order: no float atomics), a per-channel finalize, and one pass that reads x (and the
// residual) and writes y. Shared pieces (walks, reductions, geometry) are in batch_norm.cuh; the
// backward is batch_norm_backward.cu. Design: docs/cuda/kernels.md "Fused batch norm + ReLU".
#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "core/ops.h"
#include "kernels/cuda/batch_norm.cuh"
#include "kernels/cuda/context.cuh"
#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/runtime.h"
#include "kernels/cuda/workspace.h"

namespace minidl::cuda {
namespace {

std::atomic<int> g_split{0};
std::atomic<int> g_rows_bytes{0};
std::atomic<double> g_plan_scale{1.0};

int rows_bytes_default() {
  static const int bytes = [] {
    const char* s = std::getenv("MINIDL_CUDA_BN_ROWS_BYTES");
    if (s == nullptr || *s == '\0') return 8;
    const std::string v(s);
    MINIDL_CHECK(v == "8" || v == "16", "MINIDL_CUDA_BN_ROWS_BYTES=", v, ": the batch-norm kernels' widest access on ",
                 "channels-last rows is 8 or 16 bytes; unset it for the default (8)");
    return std::stoi(v);
  }();
  return bytes;
}

}  // namespace

void set_batch_norm_split(int blocks) { g_split = std::max(blocks, 0); }
int batch_norm_split() { return g_split; }
void set_batch_norm_rows_bytes(int bytes) {
  MINIDL_CHECK(bytes == 0 || bytes == 8 || bytes == 16, "set_batch_norm_rows_bytes: ", bytes,
               " bytes; the widest access is 8 or 16 (0: the default)");
  g_rows_bytes = bytes;
}
int batch_norm_rows_bytes() { return g_rows_bytes != 0 ? g_rows_bytes.load() : rows_bytes_default(); }
int batch_norm_access_width(const Tensor& x) { return bn::geometry(x, {}, "batch_norm").V; }
void set_launch_plan_scale(double scale) {
  MINIDL_CHECK(scale >= 1.0, "set_launch_plan_scale: scale ", scale, " must be >= 1 (the target's work over the run's)");
  g_plan_scale = scale;
}
double launch_plan_scale() { return g_plan_scale; }

Channel channel(const Tensor& t, int64_t C, const char* op) {
  Channel ch;
  if (!t.defined()) return ch;
  MINIDL_CHECK(t.numel() == C, op, " (cuda): per-channel tensor ", t.meta(), " should have ", C, " elements");
  MINIDL_CHECK(t.dtype() == DType::f32 || t.dtype() == DType::f64, op, " (cuda): per-channel tensor ", t.meta(),
               " must be f32 or f64");
  MINIDL_CHECK(t.device().is_cuda(), op, " (cuda): per-channel tensor ", t.meta(), " is not on the GPU");
  ch.p = t.data_ptr();
  ch.stride = t.dim() == 0 ? 0 : t.stride(0);
  ch.f64 = t.dtype() == DType::f64;
  return ch;
}

namespace bn {

Geo geometry(const Tensor& x, std::initializer_list<const Tensor*> same, const char* op) {
  const common::ChannelLayout L = common::channel_layout("cuda", x, op, "x", /*allow_channels_last=*/true);
  const bool cl = L.channels_last;
  for (const Tensor* t : same) {
    if (!t->defined()) continue;
    MINIDL_CHECK(t->shape() == x.shape() && t->dtype() == x.dtype(), op, " (cuda): ", t->meta(),
                 " does not match x ", x.meta());
    MINIDL_CHECK(cl ? is_channels_last(*t) : t->is_contiguous(), op, " (cuda): ", t->meta(), " must have x's layout (",
                 cl ? "channels-last" : "contiguous", "), got strides ", shape_str(t->strides()));
  }
  Geo g;
  g.C = L.C;
  g.rows = cl || L.S == 1;
  g.N = g.rows ? L.N * L.S : L.N;
  g.S = g.rows ? 1 : L.S;

  // The widest access every operand allows, of 16 bytes (rows: at most batch_norm_rows_bytes()),
  // 8 bytes or one element (the widths dispatch() instantiates): V divides the contiguous run (a
  // plane, or a row of channels) and each base address is aligned to V elements.
  const int esize = static_cast<int>(dtype_size(x.dtype()));
  const int widest = g.rows ? batch_norm_rows_bytes() : 16;
  const int64_t run = g.rows ? g.C : g.S;
  auto aligned = [&](const Tensor& t, int v) {
    return !t.defined() || reinterpret_cast<uintptr_t>(t.data_ptr()) % static_cast<uintptr_t>(esize * v) == 0;
  };
  for (int bytes : {16, 8, esize}) {
    if (bytes > widest && bytes != esize) continue;
    const int v = std::max(bytes / esize, 1);
    if (x.dtype() == DType::f64 && v > 1) continue;   // the reference dtype has no vector path
    bool ok = run % v == 0 && aligned(x, v);
    for (const Tensor* t : same) ok = ok && aligned(*t, v);
    if (ok) {
      g.V = v;
      break;
    }
  }

  // About two waves of 256-thread blocks on an H100 (132 SMs x 8 resident blocks), but at least
  // kMinVectors row vectors (channels-last) or kMinElements values (planar) per thread, so a
  // block's fixed cost (its reduction) stays small. The planar bound counts values, not vectors:
  // the vector width follows the plane's size (an odd 7x7 plane takes V = 1), so a bound in vectors
  // would differ between the step-time model's small sizes and its target.
  constexpr int64_t kTargetBlocks = 2048;
  constexpr int64_t kMinVectors = 4;
  constexpr int64_t kMinElements = 16;
  // The work the grid is planned for: the real one, or the step-time model's target (runtime.h),
  // whose activations are exact multiples of the run's, hence the rounding to the nearest.
  const double scale = g_plan_scale;
  auto planned = [scale](int64_t n) { return static_cast<int64_t>(std::llround(static_cast<double>(n) * scale)); };
  int64_t per_g, cap;
  if (g.rows) {
    g.cx = 1;
    while (g.cx < 32 && g.cx * g.V < g.C) g.cx *= 2;
    per_g = (g.C + g.cx * g.V - 1) / (g.cx * g.V);   // channel tiles
    const int64_t ry = kBlock / g.cx;
    cap = (planned(g.N) + ry * kMinVectors - 1) / (ry * kMinVectors);
  } else {
    per_g = g.C;
    cap = (planned(g.N * g.S) + kBlock * kMinElements - 1) / (kBlock * kMinElements);
  }
  int64_t G = std::min(std::max<int64_t>(1, kTargetBlocks / std::max<int64_t>(per_g, 1)), std::max<int64_t>(cap, 1));
  if (g_split > 0) G = g_split;
  g.G = static_cast<int>(std::min<int64_t>(G, 65535));
  return g;
}

BatchNormScratch forward_scratch(const Geo& g, DType dt, bool training, bool keeps_mean, bool keeps_invstd) {
  BatchNormScratch s;
  const bool snapshot = training || keeps_mean;   // evaluation without save_mean reads the running ones
  s.make_mean = snapshot && !keeps_mean;
  s.make_invstd = snapshot && !keeps_invstd;
  s.stats = g.C;
  s.stats_dtype = dt == DType::f16 || dt == DType::bf16 ? DType::f32 : dt;
  s.partials = training ? shift_index(g, g.C) : 0;   // G x C pairs, then C shifts
  return s;
}

dim3 grid_of(const Geo& g) {
  const int64_t x = g.rows ? (g.C + g.cx * g.V - 1) / (g.cx * g.V) : g.C;
  return dim3(static_cast<unsigned>(x), static_cast<unsigned>(g.G));
}

namespace {

// Per channel, sums of d = x - K and d * d with K the channel's first value: shifting by a value
// of the channel keeps E[d^2] - E[d]^2 free of the cancellation a large mean would cause.
template <typename T, int V, bool kRows>
__global__ void __launch_bounds__(kBlock, min_blocks_for<T, V, kRows>())
    stats_kernel(const T* __restrict__ x, Geo g, double* __restrict__ part) {
  using A = typename Compute<T>::type;
  constexpr int L = kRows ? V : 1;
  bool active;
  const int64_t c0 = first_channel<kRows, V>(g, active);
  A K[L];
#pragma unroll
  for (int j = 0; j < L; ++j) K[j] = active ? cvt<A>(x[first_offset(g, c0 + j)]) : A(0);
  PairSums<A, L> ps;
  if (active) {
    walk_loaded<kRows, V, unroll_for<T, V>()>(
        g, c0, [&](int64_t off) { return load<T, V>(x, off); },
        [&](int64_t, const Vec<T, V>& p) {
#pragma unroll
          for (int k = 0; k < V; ++k) {
            const int j = kRows ? k : 0;
            const A d = cvt<A>(p.v[k]) - K[j];
            ps.fs[j] += d;
            ps.fq[j] = fma_rn(d, d, ps.fq[j]);
          }
          ps.end_vector();
        });
  }
  write_block_sums<kRows>(ps, g, c0, part);
  // The shift, for the finalize: once per channel, by the first row of blocks.
  const bool writes_shift = kRows ? threadIdx.x < static_cast<unsigned>(g.cx) : threadIdx.x == 0;
  if (active && blockIdx.y == 0 && writes_shift) {
#pragma unroll
    for (int j = 0; j < L; ++j) part[shift_index(g, c0 + j)] = static_cast<double>(K[j]);
  }
}

// Per channel (P lanes each, finalize_lanes): the G partial sums, mean and biased variance, saved
// mean and 1 / sqrt(var + eps), and PyTorch's running-statistics update (unbiased variance).
// Evaluation: the running statistics, snapshotted into the saved ones for the backward.
template <int P>
__global__ void finalize_kernel(Geo g, const double* part, Channel running_mean, Channel running_var, double momentum,
                                double eps, bool training, Channel save_mean, Channel save_invstd) {
  MINIDL_SHARED_ARRAY(double, scratch, 32);
  MINIDL_CHANNEL_STRIDE(P, c, g.C) {
    double mean, var;
    if (training) {
      double s, q;
      channel_totals<P>(g, part, c, s, q, scratch);
      if ((threadIdx.x & (P - 1)) != 0) continue;
      const double n = static_cast<double>(g.count());
      const double dm = s / n;
      var = q / n - dm * dm;
      if (!(var > 0)) var = var == var ? 0.0 : var;   // rounding below zero; NaN stays NaN
      mean = part[shift_index(g, c)] + dm;
      const double unbias = n > 1 ? n / (n - 1) : 1.0;
      if (running_mean.p != nullptr) running_mean.set(c, (1.0 - momentum) * running_mean.get(c, 0.0) + momentum * mean);
      if (running_var.p != nullptr)
        running_var.set(c, (1.0 - momentum) * running_var.get(c, 1.0) + momentum * var * unbias);
    } else {
      if ((threadIdx.x & (P - 1)) != 0) continue;
      mean = running_mean.get(c, 0.0);
      var = running_var.get(c, 1.0);
    }
    save_mean.set(c, mean);
    save_invstd.set(c, 1.0 / ::sqrt(var + eps));
  }
}

// y = relu?(fma(x - m, a, b) [+ residual]) in the compute type, rounded once to T. Each thread
// keeps its channels' coefficients in registers for its whole walk.
template <typename T, int V, bool kRows>
__global__ void __launch_bounds__(kBlock, min_blocks_for<T, V, kRows>())
    apply_kernel(const T* __restrict__ x, const T* __restrict__ res, T* __restrict__ y, Geo g, Affine aff, bool relu) {
  using A = typename Compute<T>::type;
  constexpr int L = kRows ? V : 1;
  bool active;
  const int64_t c0 = first_channel<kRows, V>(g, active);
  if (!active) return;
  A m[L], a[L], b[L];
#pragma unroll
  for (int j = 0; j < L; ++j) aff.at(c0 + j, m[j], a[j], b[j]);
  walk_loaded<kRows, V, unroll_for<T, V>()>(
      g, c0, [&](int64_t off) { return load_operands<T, V>(off, x, res); },
      [&](int64_t off, const Operands<T, V>& l) {
        const Vec<T, V>& px = l.v[0];
        const Vec<T, V>& pr = l.v[1];
        Vec<T, V> py;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const int j = kRows ? k : 0;
          A z = affine(cvt<A>(px.v[k]), m[j], a[j], b[j]);
          if (res != nullptr) z = z + cvt<A>(pr.v[k]);
          if (relu) z = z > A(0) ? z : A(0);
          py.v[k] = cvt<T>(z);
        }
        store<T, V>(y, off, py);
      });
}

}  // namespace
}  // namespace bn

namespace {

// Every forward: relu?(batch_norm(x) [+ residual]). Training: batch statistics into save_mean /
// save_invstd (temporaries when the caller wants none), running statistics updated when given.
// Evaluation: running statistics, snapshotted into save_mean / save_invstd when given (the fused
// backward reads them), else read directly by the apply pass.
void forward(const char* op, const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
             const Tensor& running_mean, const Tensor& running_var, bool training, double momentum, double eps,
             const Tensor& y, const Tensor& save_mean, const Tensor& save_invstd, bool relu) {
  using namespace bn;
  check_cuda(op, {&x, &residual, &y});
  const Geo g = geometry(x, {&residual, &y}, op);
  const BatchNormScratch scratch = forward_scratch(g, x.dtype(), training, save_mean.defined(), save_invstd.defined());
  const TensorOptions popts{scratch.stats_dtype, x.device(), false};
  const bool snapshot = training || save_mean.defined();
  const Tensor sm = scratch.make_mean ? empty({scratch.stats}, popts) : save_mean;
  const Tensor si = scratch.make_invstd ? empty({scratch.stats}, popts) : save_invstd;
  Affine aff;
  aff.weight = channel(weight, g.C, op);
  aff.bias = channel(bias, g.C, op);
  const Channel rm = channel(running_mean, g.C, op), rv = channel(running_var, g.C, op);
  MINIDL_CHECK(training || (rm.p != nullptr && rv.p != nullptr), op,
               " (cuda): evaluation needs running_mean and running_var");
  if (snapshot) {
    aff.mean = channel(sm, g.C, op);
    aff.invstd = channel(si, g.C, op);
  } else {
    aff.mean = rm;
    aff.var = rv;
    aff.eps = eps;
  }
  if (g.C == 0) return;
  DeviceContext& ctx = context_of(x);
  const Tensor part = training ? empty({scratch.partials}, {DType::f64, x.device(), false}) : Tensor();
  double* part_d = training ? static_cast<double*>(part.data_ptr()) : nullptr;
  dispatch(g, x.dtype(), op, [&](auto tag, auto vtag, auto rtag) {
    using T = decltype(tag);
    constexpr int V = decltype(vtag)::value;
    constexpr bool R = decltype(rtag)::value;
    const T* xp = static_cast<const T*>(x.data_ptr());
    if (training) MINIDL_LAUNCH(op, (stats_kernel<T, V, R>), grid_of(g), kBlock, 0, ctx.stream(), xp, g, part_d);
    if (snapshot) {
      with_finalize_lanes(g, [&](auto lanes) {
        constexpr int P = decltype(lanes)::value;
        MINIDL_LAUNCH(op, (finalize_kernel<P>), finalize_grid(g, P), kBlock, 0, ctx.stream(), g, part_d, rm, rv,
                      momentum, eps, training, aff.mean, aff.invstd);
      });
    }
    if (x.numel() == 0) return;
    MINIDL_LAUNCH_NOWAIT(op, (apply_kernel<T, V, R>), grid_of(g), kBlock, 0, ctx.stream(), xp,
                         residual.defined() ? static_cast<const T*>(residual.data_ptr()) : nullptr,
                         static_cast<T*>(y.data_ptr()), g, aff, relu);
  });
}

}  // namespace

BatchNormScratch batch_norm_forward_scratch(const Tensor& x, const Tensor& residual, const Tensor& y, bool training,
                                            bool keeps_mean, bool keeps_invstd) {
  const bn::Geo g = bn::geometry(x, {&residual, &y}, "batch_norm");
  return bn::forward_scratch(g, x.dtype(), training, keeps_mean, keeps_invstd);
}

void CudaBackend::batch_norm_forward_train(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                           const Tensor& running_mean, const Tensor& running_var, double momentum,
                                           double eps, const Tensor& y, const Tensor& save_mean,
                                           const Tensor& save_invstd) {
  forward("batch_norm", x, Tensor(), weight, bias, running_mean, running_var, true, momentum, eps, y, save_mean,
          save_invstd, false);
}

void CudaBackend::batch_norm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                          const Tensor& mean, const Tensor& var, double eps, const Tensor& y) {
  forward("batch_norm", x, Tensor(), weight, bias, mean, var, false, 0.0, eps, y, Tensor(), Tensor(), false);
}

void CudaBackend::batch_norm_act_forward(const Tensor& x, const Tensor& residual, const Tensor& weight,
                                         const Tensor& bias, const Tensor& running_mean, const Tensor& running_var,
                                         bool training, double momentum, double eps, const Tensor& y,
                                         const Tensor& save_mean, const Tensor& save_invstd) {
  const char* op = residual.defined() ? "batch_norm_add_relu" : "batch_norm_relu";
  MINIDL_CHECK(save_mean.defined() && save_invstd.defined(), op, " (cuda): save_mean and save_invstd are required");
  forward(op, x, residual, weight, bias, running_mean, running_var, training, momentum, eps, y, save_mean, save_invstd,
          true);
}

}  // namespace minidl::cuda
