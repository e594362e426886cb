// CPU convolution (NCHW): im2col + GEMM, the reference every other backend is checked against
// and the engine of CPU training. Column matrices are built in tiles (row bands, channel chunks) that
// stay in L2 until the GEMM reads them; small planes (deep ResNet stages) are batched across samples
// so weights are streamed once per group, and threads split channels when groups are too few.
// f32 3x3 stride-1 layers that winograd_ok() accepts take Winograd F(2x2, 3x3) in all three passes
// instead (winograd.h); MINIDL_CPU_WINOGRAD=0 keeps them on im2col.
#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <cstring>

#include "core/tensor.h"
#include "kernels/cpu/conv_gemm.h"
#include "kernels/cpu/conv_im2col.h"
#include "kernels/cpu/conv_plan.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/half.h"
#include "kernels/common/checks.h"

namespace minidl::cpu {

namespace {

using namespace conv_detail;  // the planning, im2col and GEMM helpers (conv_plan.h, conv_im2col.h, conv_gemm.h)

template <typename T>
using MatR = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
// Row-major maps with an explicit row stride: column tiles of a [rows, P] plane are strided.
template <typename T>
using MapR = Eigen::Map<MatR<T>, 0, Eigen::OuterStride<>>;
template <typename T>
using CMapR = Eigen::Map<const MatR<T>, 0, Eigen::OuterStride<>>;

// Runs body(item, thread_id) for every item.
template <typename F>
void for_each_item(const Plan& pl, const ConvGeom& g, F&& body) {
  if (pl.threads == 1) {
    for (int64_t i = 0; i < pl.num_items(); ++i) body(pl.item(i, g.n, g.oh), 0);
  } else if (pl.tiles_independent) {
#pragma omp parallel for schedule(static) num_threads(pl.threads)
    for (int64_t i = 0; i < pl.num_items(); ++i) body(pl.item(i, g.n, g.oh), omp_get_thread_num());
  } else {
#pragma omp parallel for schedule(static) num_threads(pl.threads)
    for (int64_t gi = 0; gi < pl.num_groups; ++gi) {
      for (int64_t t = 0; t < pl.tiles; ++t) body(pl.item(gi * pl.tiles + t, g.n, g.oh), omp_get_thread_num());
    }
  }
}

// Runs f(j, r) for samples j < gn and rows (channels) r < rows, over threads in the inner mode.
template <typename F>
void for_each_plane(const Plan& pl, int64_t gn, int64_t rows, F&& f) {
  if (pl.inner && gn * rows > 1) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < gn * rows; ++i) f(i / rows, i % rows);
  } else {
    for (int64_t i = 0; i < gn * rows; ++i) f(i / rows, i % rows);
  }
}

// The column matrix of an item: a strided view of the input when it is one (1x1 stride-1 conv of
// one sample), otherwise built by im2col into buf as [K, gn * rows * oW].
template <typename T>
CMapR<T> item_columns(const T* x, const ConvGeom& g, const Plan& pl, const Item& it, int64_t c0, int64_t c1,
                      T* buf) {
  const int64_t rows_cols = (it.r1 - it.r0) * g.ow, cols = it.gn * rows_cols;
  const int64_t kk = g.kh * g.kw;
  if (g.pointwise() && it.gn == 1) {
    return CMapR<T>(x + it.n0 * g.in_size() + c0 * g.h * g.w + it.r0 * g.ow, (c1 - c0) * kk, cols,
                    Eigen::OuterStride<>(g.p()));
  }
  const bool padded = pad_band_ok(g, it.r1 - it.r0);
  for_each_plane(pl, it.gn, c1 - c0, [&](int64_t j, int64_t cr) {
    const int64_t c = c0 + cr;
    T* col = buf + cr * kk * cols + j * rows_cols;
    if (padded) {
      im2col_band(x + (it.n0 + j) * g.in_size(), g, c, it.r0, it.r1, col, cols);
    } else {
      im2col(x + (it.n0 + j) * g.in_size(), g, c, it.r0, it.r1, col, cols);
    }
  });
  return CMapR<T>(buf, (c1 - c0) * kk, cols, Eigen::OuterStride<>(cols));
}

// An item's slice of a [N, O, P] tensor (output gradient) as [O, cols]: a strided view for one
// sample, a gathered copy in buf for a group.
template <typename T>
CMapR<T> item_rows(const T* y, const ConvGeom& g, const Plan& pl, const Item& it, T* buf) {
  const int64_t p = g.p(), rows_cols = (it.r1 - it.r0) * g.ow, cols = it.gn * rows_cols;
  if (it.gn == 1) return CMapR<T>(y + it.n0 * g.o * p + it.r0 * g.ow, g.o, cols, Eigen::OuterStride<>(p));
  for_each_plane(pl, it.gn, g.o, [&](int64_t j, int64_t r) {
    std::memcpy(buf + r * cols + j * p, y + ((it.n0 + j) * g.o + r) * p, sizeof(T) * p);
  });
  return CMapR<T>(buf, g.o, cols, Eigen::OuterStride<>(cols));
}

// Per-thread scratch, allocated once through the minidl allocator so memory statistics see it.
template <typename T>
struct Scratch {
  Tensor t;
  int64_t per_thread = 0;
  Scratch(int64_t per, int threads, const Tensor& like) : per_thread(per) {
    if (per > 0) t = empty({per * threads}, like.options());
  }
  T* at(int tid) const { return per_thread > 0 ? t.data<T>() + tid * per_thread : nullptr; }
};

// A convolution through Winograd F(2x2, 3x3) (winograd.h): the transformed weight, then each
// thread's block of transformed tiles, allocated in the order winograd_workspace() reports. g is
// the convolution run: the layer's, or for its input gradient (flipped) transposed_geom() of it.
void conv_winograd(const Tensor& x, const Tensor& w, bool flipped, const Tensor& bias, const ConvGeom& g,
                   const Tensor& y) {
  const WinogradPlan pl = winograd_plan(g);
  const Workspace ws = winograd_workspace(g);
  const Scratch<float> u(ws.weight_copy, 1, x);
  const Scratch<float> scratch(ws.per_thread, ws.threads, x);
  winograd_forward(x.data<float>(), w.data<float>(), flipped, bias.defined() ? bias.data<float>() : nullptr, g, pl,
                   u.at(0), scratch.at(0), y.data<float>());
}

template <typename T>
void conv_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvGeom& g, const Tensor& y) {
  if constexpr (std::is_same_v<T, float>) {
    if (winograd_ok(g)) return conv_winograd(x, w, false, bias, g, y);
  }
  const T* xp = x.data<T>();
  const T* bp = bias.defined() ? bias.data<T>() : nullptr;
  T* yp = y.data<T>();
  const int64_t k = g.k(), p = g.p(), o = g.o;
  const CMapR<T> wm(w.data<T>(), o, k, Eigen::OuterStride<>(k));
  const Plan pl = plan_batch<T>(g, Pass::Forward);
  const int64_t max_cols = pl.max_cols(g.ow), cc = chunk_channels<T>(g, pl), kk = g.kh * g.kw;
  const int64_t col_sz = (g.pointwise() && pl.group == 1) ? 0 : cc * kk * max_cols;
  const Workspace ws = forward_workspace<T>(g);  // col_sz + the output block of a group, per thread
  const Scratch<T> scratch(ws.per_thread, ws.threads, x);

  for_each_item(pl, g, [&](const Item& it, int tid) {
    T* buf = scratch.at(tid);
    const int64_t cols = it.gn * (it.r1 - it.r0) * g.ow;
    // A single sample writes its output tile in place; a group goes through a buffer.
    T* dst = it.gn == 1 ? yp + it.n0 * o * p + it.r0 * g.ow : buf + col_sz;
    const int64_t ld = it.gn == 1 ? p : cols;
    MapR<T> om(dst, o, cols, Eigen::OuterStride<>(ld));
    if (bp) {
      for (int64_t r = 0; r < o; ++r) std::fill(dst + r * ld, dst + r * ld + cols, bp[r]);
    }
    for (int64_t c0 = 0; c0 < g.c; c0 += cc) {
      const int64_t c1 = std::min(g.c, c0 + cc);
      const CMapR<T> cm = item_columns(xp, g, pl, it, c0, c1, buf);
      const auto wc = wm.middleCols(c0 * kk, (c1 - c0) * kk);
      gemm(om, wc, cm, bp || c0 > 0);
    }
    if (it.gn > 1) {
      for_each_plane(pl, it.gn, o, [&](int64_t j, int64_t r) {
        std::memcpy(yp + ((it.n0 + j) * o + r) * p, dst + r * cols + j * p, sizeof(T) * p);
      });
    }
  });
}

// One channel chunk [c0, c1) of an item's input gradient: the column gradient W[:, chunk]^T x gy
// into buf, scattered back into gx (whole padded planes when the item covers every output row,
// else row bands, zeroing each plane at its first band).
template <typename T>
void input_grad_chunk(const CMapR<T>& wm, const CMapR<T>& gym, const ConvGeom& g, const Plan& pl, const Item& it,
                      int64_t c0, int64_t c1, T* buf, T* gxp) {
  const int64_t kk = g.kh * g.kw, cols = gym.cols(), rows_cols = (it.r1 - it.r0) * g.ow;
  const bool whole = it.r0 == 0 && it.r1 == g.oh && pad_band_ok(g, g.oh);
  gemm(MapR<T>(buf, (c1 - c0) * kk, cols, Eigen::OuterStride<>(cols)),
       wm.middleCols(c0 * kk, (c1 - c0) * kk).transpose(), gym, false);
  for_each_plane(pl, it.gn, c1 - c0, [&](int64_t j, int64_t cr) {
    const int64_t c = c0 + cr;
    const T* gcol = buf + cr * kk * cols + j * rows_cols;
    T* gxn = gxp + (it.n0 + j) * g.in_size();
    if (whole) return col2im_plane(gcol, cols, g, c, gxn);
    if (it.r0 == 0) std::fill(gxn + c * g.h * g.w, gxn + (c + 1) * g.h * g.w, T(0));  // first tile
    col2im(gcol, cols, g, c, it.r0, it.r1, gxn);
  });
}

// One chunk [c0, c1) of input channels of one item (the plan's i-th) in the by-channel passes below:
// the item's output-gradient rows gym, the calling thread's scratch for its columns, and the plan
// to run its copies with (on that thread).
template <typename T>
struct ChannelChunk {
  const Plan& seq;
  int64_t i;
  const Item& it;
  const CMapR<T>& gym;
  int64_t c0, c1;
  T* cols;
};

// Runs body(chunk) for every item of the plan and every chunk of input channels, the chunks of one
// item in parallel. ws (input_workspace or weight_workspace) sizes the gathered output gradient
// and each thread's columns.
template <typename T, typename Body>
void for_each_channel_chunk(const T* gyp, const ConvGeom& g, const Plan& pl, const Workspace& ws, const Tensor& like,
                            const Body& body) {
  const int nt = std::max(1, omp_get_max_threads());
  const int64_t cc = thread_chunk_channels<T>(g, pl, nt), chunks = (g.c + cc - 1) / cc;
  const Scratch<T> gy_scratch(ws.shared, 1, like);
  const Scratch<T> cols_scratch(ws.per_thread, ws.threads, like);
  Plan seq = pl;  // copies inside a thread's chunk run on that thread
  seq.inner = false;
  for (int64_t i = 0; i < pl.num_items(); ++i) {
    const Item it = pl.item(i, g.n, g.oh);
    const CMapR<T> gym = item_rows(gyp, g, pl, it, gy_scratch.at(0));
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t ci = 0; ci < chunks; ++ci) {
      const int64_t c0 = ci * cc, c1 = std::min(g.c, c0 + cc);
      body(ChannelChunk<T>{seq, i, it, gym, c0, c1, cols_scratch.at(omp_get_thread_num())});
    }
  }
}

// The input gradient of small planes with a big weight (deep stages): per-thread groups of samples
// would each stream the whole weight for few columns, so all samples form one GEMM and threads
// split the input channels, each multiplying its rows of the weight and scattering into its own
// channels of the gradient.
template <typename T>
void conv_backward_input_by_channel(const T* gyp, const CMapR<T>& wm, const ConvGeom& g, const Plan& pl, T* gxp,
                                    const Tensor& like) {
  for_each_channel_chunk<T>(gyp, g, pl, input_workspace<T>(g), like, [&](const ChannelChunk<T>& ch) {
    input_grad_chunk<T>(wm, ch.gym, g, ch.seq, ch.it, ch.c0, ch.c1, ch.cols, gxp);
  });
}

// The weight gradient when there are too few items to give each thread its own (big [O, K] results
// want many columns per GEMM, so few groups): threads split the input channels instead, each
// building the columns of its channels and writing its own columns of the gradient. Unlike
// threading each GEMM, no thread waits for another between im2col and GEMM, and each streams only
// its share of the result.
template <typename T>
void conv_backward_weight_by_channel(const T* gyp, const T* xp, const ConvGeom& g, const Plan& pl, T* gwp,
                                     const Tensor& like) {
  const int64_t k = g.k(), kk = g.kh * g.kw;
  MapR<T> acc(gwp, g.o, k, Eigen::OuterStride<>(k));
  for_each_channel_chunk<T>(gyp, g, pl, weight_workspace<T>(g), like, [&](const ChannelChunk<T>& ch) {
    const CMapR<T> cm = item_columns(xp, g, ch.seq, ch.it, ch.c0, ch.c1, ch.cols);
    product(acc.middleCols(ch.c0 * kk, (ch.c1 - ch.c0) * kk), ch.gym, cm.transpose(), ch.i > 0);
  });
}

template <typename T>
void conv_backward_input_transposed(const Tensor& gy, const Tensor& w, const ConvGeom& g, const Tensor& gx) {
  const ConvGeom t = transposed_geom(g);
  const Tensor wt = empty({g.c, g.o, g.kh, g.kw}, w.options());  // the workspace's weight_copy
  const T* src = w.data<T>();
  T* dst = wt.data<T>();
  const int64_t kk = g.kh * g.kw;
  for (int64_t c = 0; c < g.c; ++c) {
    for (int64_t o = 0; o < g.o; ++o) {
      const T* s = src + (o * g.c + c) * kk;
      T* d = dst + (c * g.o + o) * kk;
      for (int64_t i = 0; i < kk; ++i) d[i] = s[kk - 1 - i];  // (ki, kj) -> (kH-1-ki, kW-1-kj)
    }
  }
  conv_forward<T>(gy, wt, Tensor(), t, gx);
}

template <typename T>
void conv_backward_input(const Tensor& gy, const Tensor& w, const ConvGeom& g, const Tensor& gx) {
  const T* gyp = gy.data<T>();
  T* gxp = gx.data<T>();
  const int64_t k = g.k(), o = g.o, kk = g.kh * g.kw;
  const CMapR<T> wm(w.data<T>(), o, k, Eigen::OuterStride<>(k));
  if constexpr (std::is_same_v<T, float>) {
    if (winograd_input_ok<T>(g)) return conv_winograd(gy, w, true, Tensor(), transposed_geom(g), gx);
  }
  if (transposed_ok(g)) return conv_backward_input_transposed<T>(gy, w, g, gx);
  const Plan pl = plan_batch<T>(g, Pass::BackwardInput);
  // Small planes and a big weight: the weight-gradient plan (one group of all samples) with threads
  // splitting channels.
  const bool big_weight = o * k * static_cast<int64_t>(sizeof(T)) > 2 * kTileBytes;
  if (pl.group > 1 && big_weight && g.c >= 2 * omp_get_max_threads()) {
    const Plan wpl = plan_batch<T>(g, Pass::BackwardWeight);
    if (wpl.inner && wpl.group > pl.group) return conv_backward_input_by_channel<T>(gyp, wm, g, wpl, gxp, gy);
  }
  const int64_t max_cols = pl.max_cols(g.ow), cc = chunk_channels<T>(g, pl);
  const bool direct = g.pointwise() && pl.group == 1;  // GEMM straight into gx
  const int64_t gcol_sz = direct ? 0 : cc * kk * max_cols;
  const Workspace ws = input_workspace<T>(g);  // gcol_sz + the gathered output gradient, per thread
  const Scratch<T> scratch(ws.per_thread, ws.threads, gy);

  for_each_item(pl, g, [&](const Item& it, int tid) {
    T* buf = scratch.at(tid);
    const CMapR<T> gym = item_rows(gyp, g, pl, it, buf ? buf + gcol_sz : nullptr);
    const int64_t cols = gym.cols();
    if (direct) {
      gemm(MapR<T>(gxp + it.n0 * g.in_size() + it.r0 * g.ow, k, cols, Eigen::OuterStride<>(g.p())),
           wm.transpose(), gym, false);
      return;
    }
    for (int64_t c0 = 0; c0 < g.c; c0 += cc) input_grad_chunk<T>(wm, gym, g, pl, it, c0, std::min(g.c, c0 + cc), buf, gxp);
  });
}

template <typename T>
void conv_backward_weight(const Tensor& gy, const Tensor& x, const ConvGeom& g, const Tensor& gw) {
  if constexpr (std::is_same_v<T, float>) {
    if (winograd_ok(g)) {
      const WinogradPlan pl = winograd_plan(g);
      const Workspace ws = weight_workspace<float>(g);  // each thread's V, W and dU
      const Scratch<float> scratch(ws.per_thread, ws.threads, x);
      return winograd_backward_weight(gy.data<float>(), x.data<float>(), g, pl, scratch.at(0), gw.data<float>());
    }
  }
  const T* gyp = gy.data<T>();
  const T* xp = x.data<T>();
  const int64_t k = g.k(), o = g.o;
  const Plan pl = plan_batch<T>(g, Pass::BackwardWeight);
  if (pl.inner && g.c >= 2 * omp_get_max_threads()) {
    return conv_backward_weight_by_channel<T>(gyp, xp, g, pl, gw.data<T>(), x);
  }
  const int64_t max_cols = pl.max_cols(g.ow), cc = chunk_channels<T>(g, pl), kk = g.kh * g.kw;
  const int64_t col_sz = (g.pointwise() && pl.group == 1) ? 0 : cc * kk * max_cols;
  const int64_t gy_sz = pl.group > 1 ? o * max_cols : 0;
  // Thread 0 accumulates straight into gw, the others into private partial sums that are added in
  // thread order afterwards: with static scheduling the result does not depend on timing.
  const Workspace ws = weight_workspace<T>(g);  // col_sz + gy_sz + a partial gradient (o x k), per thread
  const Scratch<T> scratch(ws.per_thread, ws.threads, x);
  auto partial = [&](int tid) { return tid == 0 ? gw.data<T>() : scratch.at(tid) + col_sz + gy_sz; };
  for (int t = 0; t < pl.threads; ++t) std::fill(partial(t), partial(t) + o * k, T(0));

  for_each_item(pl, g, [&](const Item& it, int tid) {
    T* buf = scratch.at(tid);
    const CMapR<T> gym = item_rows(gyp, g, pl, it, buf ? buf + col_sz : nullptr);
    MapR<T> acc(partial(tid), o, k, Eigen::OuterStride<>(k));
    for (int64_t c0 = 0; c0 < g.c; c0 += cc) {
      const int64_t c1 = std::min(g.c, c0 + cc);
      const CMapR<T> cm = item_columns(xp, g, pl, it, c0, c1, buf);
      gemm(acc.middleCols(c0 * kk, (c1 - c0) * kk), gym, cm.transpose(), true);
    }
  });

  if (pl.threads > 1) {
    MapR<T> acc(gw.data<T>(), o, k, Eigen::OuterStride<>(k));
    for (int t = 1; t < pl.threads; ++t) acc += CMapR<T>(partial(t), o, k, Eigen::OuterStride<>(k));
  }
}

}  // namespace

void CpuBackend::conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dOptions& o,
                                const Tensor& y) {
  if (any_channels_last({&x, &w, &y})) {
    return in_nchw(y, [&](const Tensor& yc) { conv2d_forward(x.contiguous(), w.contiguous(), bias, o, yc); });
  }
  common::check_contiguous("cpu", "conv2d_forward", {&x, &w, &bias, &y});
  const ConvGeom g = make_geom(x.shape(), w.shape(), y.shape(), o, "conv2d_forward");
  if (g.n == 0) return;
  if (is_half(x) || is_half(w) || is_half(y)) {  // f16, bf16: the f32 kernel on widened copies, one rounding
    return in_f32(y, [&](const Tensor& yf) { conv2d_forward(widen_half(x), widen_half(w), widen_half(bias), o, yf); });
  }
  dispatch_wide(x.dtype(), "conv2d_forward", [&](auto t) { conv_forward<decltype(t)>(x, w, bias, g, y); });
}

void CpuBackend::conv2d_backward_input(const Tensor& gy, const Tensor& w, const Conv2dOptions& o, const Tensor& gx) {
  if (any_channels_last({&gy, &w, &gx})) {
    return in_nchw(gx, [&](const Tensor& gxc) { conv2d_backward_input(gy.contiguous(), w.contiguous(), o, gxc); });
  }
  common::check_contiguous("cpu", "conv2d_backward_input", {&gy, &w, &gx});
  const ConvGeom g = make_geom(gx.shape(), w.shape(), gy.shape(), o, "conv2d_backward_input");
  if (g.n == 0) return;
  if (is_half(gy) || is_half(w) || is_half(gx)) {
    return in_f32(gx, [&](const Tensor& gxf) { conv2d_backward_input(widen_half(gy), widen_half(w), o, gxf); });
  }
  dispatch_wide(gy.dtype(), "conv2d_backward_input", [&](auto t) { conv_backward_input<decltype(t)>(gy, w, g, gx); });
}

void CpuBackend::conv2d_backward_weight(const Tensor& gy, const Tensor& x, const Conv2dOptions& o, const Tensor& gw) {
  if (any_channels_last({&gy, &x, &gw})) {
    return in_nchw(gw, [&](const Tensor& gwc) { conv2d_backward_weight(gy.contiguous(), x.contiguous(), o, gwc); });
  }
  common::check_contiguous("cpu", "conv2d_backward_weight", {&gy, &x, &gw});
  const ConvGeom g = make_geom(x.shape(), gw.shape(), gy.shape(), o, "conv2d_backward_weight");
  if (is_half(gy) || is_half(x) || is_half(gw)) {
    return in_f32(gw, [&](const Tensor& gwf) { conv2d_backward_weight(widen_half(gy), widen_half(x), o, gwf); });
  }
  dispatch_wide(gy.dtype(), "conv2d_backward_weight", [&](auto t) { conv_backward_weight<decltype(t)>(gy, x, g, gw); });
}

}  // namespace minidl::cpu
