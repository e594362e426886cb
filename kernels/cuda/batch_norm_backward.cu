// Batch norm backward on the GPU, plain and fused (ReLU's backward folded in, the residual's
// gradient written on the way): pass 1 reads gy and x (and y when there is a residual), masks gy,
// writes the residual's gradient and sums gm and gm * (x - mean) per channel over many blocks; a
// per-channel finalize; pass 2 reads the masked gradient and x and writes gx. Without a residual
// the mask is rebuilt from x with the forward's own arithmetic, equal to y > 0 bit for bit, so y
// is never read.
#include <cstdint>

#include "kernels/cuda/batch_norm.cuh"
#include "kernels/cuda/context.cuh"
#include "kernels/cuda/cuda_backend.cuh"

namespace minidl::cuda {
namespace bn {
namespace {

// Whether element k of a vector keeps its gradient: y > 0, or (FromX) the forward's rounded
// output fma(x - m, a, b) > 0, which is y > 0 for relu(batch_norm(x)).
template <typename T, typename A>
__device__ __forceinline__ bool keeps(Mask mask, T y, A x, A m, A a, A b) {
  if (mask == Mask::FromY) return cvt<A>(y) > A(0);
  if (mask == Mask::FromX) return cvt<A>(cvt<T>(affine(x, m, a, b))) > A(0);
  return true;
}

// Pass 1: gm = masked gy (written to gres when given), and per channel sum(gm) and
// sum(gm * (x - m)) into part, as the statistics pass does.
template <typename T, int V, bool kRows>
__global__ void __launch_bounds__(kBlock, min_blocks_for<T, V, kRows>())
    grad_sums_kernel(const T* __restrict__ gy, const T* __restrict__ x, const T* __restrict__ y, T* __restrict__ gres,
                     Geo g, Affine aff, Mask mask, double* __restrict__ part) {
  using A = typename Compute<T>::type;
  constexpr int L = kRows ? V : 1;
  bool active;
  const int64_t c0 = first_channel<kRows, V>(g, active);
  A m[L], a[L], b[L];
#pragma unroll
  for (int j = 0; j < L; ++j) {
    m[j] = a[j] = b[j] = A(0);
    if (active) aff.at(c0 + j, m[j], a[j], b[j]);
  }
  PairSums<A, L> ps;
  const T zero = cvt<T>(A(0));
  if (active) {
    // One position at a time (walk, not walk_loaded): the three operands and the double sums of
    // two positions ahead take 80 registers (three blocks an SM, which the step-time model prices
    // as latency-bound, knowing nothing of loads in flight), and four spill past the 64 of four.
    walk<kRows, V>(g, c0, [&](int64_t off) {
      const Vec<T, V> pg = load<T, V>(gy, off);
      const Vec<T, V> px = load<T, V>(x, off);
      Vec<T, V> py;
      if (mask == Mask::FromY) py = load<T, V>(y, off);
      Vec<T, V> pm;
#pragma unroll
      for (int k = 0; k < V; ++k) {
        const int j = kRows ? k : 0;
        const A xv = cvt<A>(px.v[k]);
        pm.v[k] = keeps<T>(mask, mask == Mask::FromY ? py.v[k] : zero, xv, m[j], a[j], b[j]) ? pg.v[k] : zero;
        const A gm = cvt<A>(pm.v[k]);
        ps.fs[j] += gm;
        ps.fq[j] = fma_rn(gm, xv - m[j], ps.fq[j]);
      }
      if (gres != nullptr) store<T, V>(gres, off, pm);
      ps.end_vector();
    });
  }
  write_block_sums<kRows>(ps, g, c0, part);
}

// Per channel (P lanes each, finalize_lanes): the G partial sums; gweight = sum(gm * xhat), gbias =
// sum(gm); and the coefficients of pass 2, gx = (gm - k1 - (x - m) * k2) * invstd * w (k1 = k2 = 0
// in evaluation).
template <int P>
__global__ void grad_finalize_kernel(Geo g, const double* part, Channel save_invstd, Channel gweight, Channel gbias,
                                     bool training, double* coef) {
  MINIDL_SHARED_ARRAY(double, scratch, 32);
  MINIDL_CHANNEL_STRIDE(P, c, g.C) {
    double sg, sd;
    channel_totals<P>(g, part, c, sg, sd, scratch);
    if ((threadIdx.x & (P - 1)) != 0) continue;
    const double is = save_invstd.get(c, 1.0);
    const double inv_n = 1.0 / static_cast<double>(g.count());
    gweight.set(c, sd * is);
    gbias.set(c, sg);
    coef[2 * c] = training ? sg * inv_n : 0.0;
    coef[2 * c + 1] = training ? sd * is * is * inv_n : 0.0;
  }
}

// Pass 2: gx from the masked gradient (gres, or gy masked again through x) and x.
template <typename T, int V, bool kRows>
__global__ void __launch_bounds__(kBlock, min_blocks_for<T, V, kRows>())
    grad_input_kernel(const T* __restrict__ gsrc, const T* __restrict__ x, T* __restrict__ gx, Geo g, Affine aff,
                      Mask mask, const double* __restrict__ coef) {
  using A = typename Compute<T>::type;
  constexpr int L = kRows ? V : 1;
  bool active;
  const int64_t c0 = first_channel<kRows, V>(g, active);
  if (!active) return;
  A m[L], a[L], b[L], k1[L], k2[L];
#pragma unroll
  for (int j = 0; j < L; ++j) {
    aff.at(c0 + j, m[j], a[j], b[j]);
    k1[j] = coef != nullptr ? static_cast<A>(coef[2 * (c0 + j)]) : A(0);
    k2[j] = coef != nullptr ? static_cast<A>(coef[2 * (c0 + j) + 1]) : A(0);
  }
  const T zero = cvt<T>(A(0));
  walk_loaded<kRows, V, unroll_for<T, V>()>(
      g, c0, [&](int64_t off) { return load_operands<T, V>(off, gsrc, x); },
      [&](int64_t off, const Operands<T, V>& l) {
        const Vec<T, V>& pg = l.v[0];
        const Vec<T, V>& px = l.v[1];
        Vec<T, V> out;
#pragma unroll
        for (int k = 0; k < V; ++k) {
          const int j = kRows ? k : 0;
          const A xv = cvt<A>(px.v[k]);
          const A gm = keeps<T>(mask, zero, xv, m[j], a[j], b[j]) ? cvt<A>(pg.v[k]) : A(0);
          out.v[k] = cvt<T>(fma_rn(-(xv - m[j]), k2[j], gm - k1[j]) * a[j]);
        }
        store<T, V>(gx, off, out);
      });
}

}  // namespace

BatchNormScratch backward_scratch(const Geo& g, int64_t numel, bool training, bool wants_gweight, bool wants_gbias,
                                  bool with_residual) {
  BatchNormScratch s;
  // Pass 1 serves the batch-statistics terms (training), the per-channel gradients and the
  // residual's gradient; an evaluation-mode backward wanting only gx skips it.
  const bool sums = training || wants_gweight || wants_gbias || with_residual;
  if (g.C == 0 || numel == 0 || !sums) return s;
  s.partials = int64_t{g.G} * g.C * 2;
  s.coefficients = g.C * 2;
  return s;
}

}  // namespace bn

namespace {

// Every backward. mask: None (plain batch norm), FromX (batch_norm_relu) or FromY (with a residual:
// gresidual receives the masked gradient, which pass 2 then reads instead of gy).
void backward(const char* op, const Tensor& gy, const Tensor& x, const Tensor& y, const Tensor& weight,
              const Tensor& bias, const Tensor& save_mean, const Tensor& save_invstd, bool training, bn::Mask mask,
              const Tensor& gx, const Tensor& gresidual, const Tensor& gweight, const Tensor& gbias, Backend& be) {
  using namespace bn;
  const bool with_res = gresidual.defined();
  check_cuda(op, {&gy, &x, &y, &gx, &gresidual});
  const Geo g = geometry(x, {&gy, &y, &gx, &gresidual}, op);
  Affine aff;
  aff.mean = channel(save_mean, g.C, op);
  aff.invstd = channel(save_invstd, g.C, op);
  aff.weight = channel(weight, g.C, op);
  aff.bias = channel(bias, g.C, op);
  const Channel gw = channel(gweight, g.C, op), gb = channel(gbias, g.C, op);
  MINIDL_CHECK(aff.mean.p != nullptr && aff.invstd.p != nullptr, op, " (cuda): save_mean and save_invstd are required");
  MINIDL_CHECK(mask != Mask::FromY || (y.defined() && with_res), op,
               " (cuda): with a residual the ReLU's mask comes from y and the masked gradient goes to gresidual");
  if (g.C == 0) return;
  if (x.numel() == 0) {   // nothing to sum: the per-channel gradients are zero
    if (gweight.defined()) be.fill(gweight, 0.0);
    if (gbias.defined()) be.fill(gbias, 0.0);
    return;
  }
  DeviceContext& ctx = context_of(x);
  // Whether pass 1 runs, and its scratch, as backward_scratch decides (the meta device reads it).
  const BatchNormScratch scratch =
      backward_scratch(g, x.numel(), training, gweight.defined(), gbias.defined(), with_res);
  const bool sums = scratch.partials > 0;
  const TensorOptions f64{DType::f64, x.device(), false};
  const Tensor part = sums ? empty({scratch.partials}, f64) : Tensor();
  const Tensor coef = sums ? empty({scratch.coefficients}, f64) : Tensor();
  double* part_d = sums ? static_cast<double*>(part.data_ptr()) : nullptr;
  double* coef_d = sums ? static_cast<double*>(coef.data_ptr()) : nullptr;
  dispatch(g, x.dtype(), op, [&](auto tag, auto vtag, auto rtag) {
    using T = decltype(tag);
    constexpr int V = decltype(vtag)::value;
    constexpr bool R = decltype(rtag)::value;
    const T* xp = static_cast<const T*>(x.data_ptr());
    const T* gyp = static_cast<const T*>(gy.data_ptr());
    T* grp = with_res ? static_cast<T*>(gresidual.data_ptr()) : nullptr;
    if (sums) {
      MINIDL_LAUNCH(op, (grad_sums_kernel<T, V, R>), grid_of(g), kBlock, 0, ctx.stream(), gyp, xp,
                    mask == Mask::FromY ? static_cast<const T*>(y.data_ptr()) : nullptr, grp, g, aff, mask, part_d);
      with_finalize_lanes(g, [&](auto lanes) {
        constexpr int P = decltype(lanes)::value;
        MINIDL_LAUNCH(op, (grad_finalize_kernel<P>), finalize_grid(g, P), kBlock, 0, ctx.stream(), g, part_d,
                      aff.invstd, gw, gb, training, coef_d);
      });
    }
    if (!gx.defined()) return;
    MINIDL_LAUNCH_NOWAIT(op, (grad_input_kernel<T, V, R>), grid_of(g), kBlock, 0, ctx.stream(), with_res ? grp : gyp,
                         xp, static_cast<T*>(gx.data_ptr()), g, aff, mask == Mask::FromY ? Mask::None : mask, coef_d);
  });
}

}  // namespace

BatchNormScratch batch_norm_backward_scratch(const Tensor& gy, const Tensor& x, const Tensor& y, const Tensor& gx,
                                             const Tensor& gresidual, bool training, bool wants_gweight,
                                             bool wants_gbias) {
  const bn::Geo g = bn::geometry(x, {&gy, &y, &gx, &gresidual}, "batch_norm_backward");
  return bn::backward_scratch(g, x.numel(), training, wants_gweight, wants_gbias, gresidual.defined());
}

void CudaBackend::batch_norm_backward(const Tensor& gy, const Tensor& x, const Tensor& weight, const Tensor& save_mean,
                                      const Tensor& save_invstd, const Tensor& gx, const Tensor& gweight,
                                      const Tensor& gbias) {
  backward("batch_norm_backward", gy, x, Tensor(), weight, Tensor(), save_mean, save_invstd, true, bn::Mask::None, gx,
           Tensor(), gweight, gbias, *this);
}

void CudaBackend::batch_norm_act_backward(const Tensor& gy, const Tensor& x, const Tensor& y, const Tensor& weight,
                                          const Tensor& bias, const Tensor& save_mean, const Tensor& save_invstd,
                                          bool training, const Tensor& gx, const Tensor& gresidual,
                                          const Tensor& gweight, const Tensor& gbias) {
  const bool with_res = gresidual.defined();
  backward(with_res ? "batch_norm_add_relu backward" : "batch_norm_relu backward", gy, x, y, weight, bias, save_mean,
           save_invstd, training, with_res ? bn::Mask::FromY : bn::Mask::FromX, gx, gresidual, gweight, gbias, *this);
}

}  // namespace minidl::cuda
