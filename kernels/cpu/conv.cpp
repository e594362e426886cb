// CPU convolution (NCHW): im2col + Eigen GEMM, the reference every other backend is checked against
// and the engine of CPU training. Column matrices are built in tiles (row bands, channel chunks) that
// stay in L2 until the GEMM reads them; small planes (deep ResNet stages) are batched across samples
// so weights are streamed once per group, and threads split channels when groups are too few.
#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <cstring>

#include "core/tensor.h"
#include "kernels/cpu/conv_gemm.h"
#include "kernels/cpu/conv_im2col.h"
#include "kernels/cpu/workspace.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/half.h"

namespace minidl::cpu {

namespace {

using namespace conv_detail;  // the im2col and GEMM helpers of this file (conv_im2col.h, conv_gemm.h)

template <typename T>
using MatR = Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>;
// Row-major maps with an explicit row stride: column tiles of a [rows, P] plane are strided.
template <typename T>
using MapR = Eigen::Map<MatR<T>, 0, Eigen::OuterStride<>>;
template <typename T>
using CMapR = Eigen::Map<const MatR<T>, 0, Eigen::OuterStride<>>;

// Column-matrix tile budget: about half of a typical L2, so im2col's writes are still cached when
// the GEMM packs them. A GEMM with fewer columns than kMinCols wastes its pass over the weights, so
// small planes are grouped across samples. The weight gradient sums over those columns into an
// [O, K] result; when that does not fit in L2 either, every GEMM streams it from memory, so it
// wants more columns per GEMM (kMinColsWeight) to amortise that.
constexpr int64_t kTileBytes = 512 * 1024;
constexpr int64_t kMinCols = 256;
constexpr int64_t kMinColsWeight = 1024;
// Below this many multiply-adds a parallel region costs more than it saves.
constexpr int64_t kParallelWork = int64_t{1} << 21;

ConvGeom make_geom(const Shape& x, const Shape& wt, const Shape& y, const Conv2dOptions& o, const char* op) {
  MINIDL_CHECK(x.size() == 4 && wt.size() == 4 && y.size() == 4, op, " (cpu): expected 4-D tensors, got input ",
               shape_str(x), ", weight ", shape_str(wt), ", output ", shape_str(y));
  MINIDL_CHECK(o.groups == 1, op, " (cpu): groups=", o.groups, " is not supported yet");
  ConvGeom g{x[0], x[1], x[2], x[3], wt[0], wt[2], wt[3], y[2], y[3],
             o.stride[0], o.stride[1], o.padding[0], o.padding[1], o.dilation[0], o.dilation[1]};
  MINIDL_CHECK(wt[1] == g.c && y[0] == g.n && y[1] == g.o, op, " (cpu): inconsistent shapes: input ", shape_str(x),
               ", weight ", shape_str(wt), ", output ", shape_str(y));
  return g;
}

void check_contiguous(const char* op, std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts) {
    if (t->defined()) {
      MINIDL_CHECK(t->is_contiguous(), op, " (cpu): kernel expects contiguous tensors, got ", t->meta(),
                   " with strides ", shape_str(t->strides()));
    }
  }
}

// One GEMM's worth of work: samples [n0, n0 + gn) and output rows [r0, r1) of each. Either gn == 1
// (a band of rows of one sample) or the rows are all of them (whole planes of gn samples).
struct Item {
  int64_t n0, gn, r0, r1;
};

using Pass = ConvPass;

// How the batch is cut into items and spread over threads. Two modes: with enough items, items
// run on OpenMP threads with single-threaded GEMMs (threads > 1); otherwise items run in order,
// gemm() splits each GEMM over the threads and the copies around it are split over (sample,
// channel) (inner).
struct Plan {
  int64_t group = 1;         // samples per item
  int64_t rows = 1;          // output rows per item (all of them when group > 1)
  int64_t num_groups = 0;
  int64_t tiles = 1;         // items per group
  int threads = 1;
  bool inner = false;
  bool tiles_independent = true;  // false: a group's tiles must run in order on one thread
  int64_t max_cols(int64_t ow) const { return group * rows * ow; }
  int64_t num_items() const { return num_groups * tiles; }
  Item item(int64_t i, int64_t n, int64_t oh) const {
    const int64_t gi = i / tiles, ti = i % tiles;
    const int64_t n0 = gi * group;
    return {n0, std::min(group, n - n0), ti * rows, std::min(oh, (ti + 1) * rows)};
  }
};

template <typename T>
Plan plan_batch(const ConvGeom& g, Pass pass) {
  Plan pl;
  const int nt = std::max(1, omp_get_max_threads());
  const int64_t p = g.p();
  const bool big_result = g.o * g.k() * static_cast<int64_t>(sizeof(T)) > 2 * kTileBytes;
  const int64_t min_cols = pass == Pass::BackwardWeight && big_result ? kMinColsWeight : kMinCols;
  const int64_t tile_cols = std::max(min_cols, kTileBytes / static_cast<int64_t>(g.k() * sizeof(T)));
  if (p >= min_cols || g.n <= 1) {
    pl.group = 1;
    pl.rows = std::clamp<int64_t>(tile_cols / g.ow, 1, g.oh);
  } else {
    pl.group = std::min(g.n, (min_cols + p - 1) / p);
    // The forward and input-gradient GEMMs stay efficient on fewer columns: keep every thread busy.
    if (pass != Pass::BackwardWeight && nt > 1 && g.n >= nt) {
      pl.group = std::min<int64_t>(pl.group, (g.n + nt - 1) / nt);
    }
    pl.rows = g.oh;
  }
  pl.num_groups = (g.n + pl.group - 1) / pl.group;
  pl.tiles = (g.oh + pl.rows - 1) / pl.rows;
  // Tiles of one sample add into overlapping input rows in the input gradient.
  pl.tiles_independent = pass != Pass::BackwardInput;
  const int64_t units = pl.tiles_independent ? pl.num_items() : pl.num_groups;
  const bool big = g.n * g.o * p * g.k() >= kParallelWork;
  pl.threads = (nt > 1 && big && units >= nt) ? nt : 1;
  pl.inner = nt > 1 && big && pl.threads == 1;
  return pl;
}

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

// Input channels per column chunk. A column matrix bigger than L2 is written to memory by im2col
// and read back by the GEMM, so items are processed in chunks of channels whose columns fit in
// kTileBytes (the GEMM's depth is split; Eigen blocks its depth anyway), but not so thin that a
// GEMM's depth drops below kMinDepth. Chunks are evened out. A column view (no copy) is not split.
constexpr int64_t kMinDepth = 256;
template <typename T>
int64_t chunk_channels(const ConvGeom& g, const Plan& pl) {
  if (g.pointwise() && pl.group == 1) return g.c;
  const int64_t kk = g.kh * g.kw;
  const int64_t by_tile = kTileBytes / (kk * pl.max_cols(g.ow) * static_cast<int64_t>(sizeof(T)));
  const int64_t cc = std::clamp<int64_t>(std::max(by_tile, (kMinDepth + kk - 1) / kk), 1, g.c);
  const int64_t chunks = (g.c + cc - 1) / cc;
  return (g.c + chunks - 1) / chunks;
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

// One scratch allocation of a kernel: per-thread elements times threads (nothing when per is 0).
struct ScratchSize {
  int64_t per_thread = 0;
  int threads = 1;
  int64_t elements() const { return per_thread > 0 ? per_thread * threads : 0; }
};

// Per-thread scratch, allocated once through the minidl allocator so memory statistics see it.
template <typename T>
struct Scratch {
  Tensor t;
  int64_t per_thread = 0;
  Scratch(const ScratchSize& sz, const Tensor& like) : per_thread(sz.per_thread) {
    if (sz.elements() > 0) t = empty({sz.elements()}, like.options());
  }
  T* at(int tid) const { return per_thread > 0 ? t.data<T>() + tid * per_thread : nullptr; }
};

// The forward's plan and its scratch layout per thread: [columns | output of a group].
template <typename T>
struct ForwardLayout {
  Plan pl;
  int64_t max_cols, cc, kk, col_sz, out_sz;
  explicit ForwardLayout(const ConvGeom& g) : pl(plan_batch<T>(g, Pass::Forward)) {
    max_cols = pl.max_cols(g.ow);
    cc = chunk_channels<T>(g, pl);
    kk = g.kh * g.kw;
    col_sz = (g.pointwise() && pl.group == 1) ? 0 : cc * kk * max_cols;
    out_sz = pl.group > 1 ? g.o * max_cols : 0;
  }
  ScratchSize scratch() const { return {col_sz + out_sz, pl.threads}; }
};

template <typename T>
void conv_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvGeom& g, const Tensor& y) {
  const T* xp = x.data<T>();
  const T* bp = bias.defined() ? bias.data<T>() : nullptr;
  T* yp = y.data<T>();
  const int64_t k = g.k(), p = g.p(), o = g.o;
  const CMapR<T> wm(w.data<T>(), o, k, Eigen::OuterStride<>(k));
  const ForwardLayout<T> lay(g);
  const Plan& pl = lay.pl;
  const int64_t cc = lay.cc, kk = lay.kk, col_sz = lay.col_sz;
  const Scratch<T> scratch(lay.scratch(), x);

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

// Channels per chunk when threads split the channels: chunks that fit the tile budget, as many as
// a multiple of the thread count so that static scheduling balances them.
template <typename T>
int64_t thread_chunk_channels(const ConvGeom& g, const Plan& pl, int nt) {
  const int64_t cc = chunk_channels<T>(g, pl);
  const int64_t chunks = std::min(g.c, ((g.c + cc - 1) / cc + nt - 1) / nt * nt);
  return (g.c + chunks - 1) / chunks;
}

// The input gradient of small planes with a big weight (deep stages): per-thread groups of samples
// would each stream the whole weight for few columns, so all samples form one GEMM and threads
// split the input channels, each multiplying its rows of the weight and scattering into its own
// channels of the gradient.
// The two scratch allocations of the by-channel paths: per-thread columns of a channel chunk, and
// one gathered copy of a group's output gradient.
template <typename T>
std::pair<ScratchSize, ScratchSize> by_channel_scratch(const ConvGeom& g, const Plan& pl) {
  const int nt = std::max(1, omp_get_max_threads());
  const int64_t kk = g.kh * g.kw, max_cols = pl.max_cols(g.ow);
  const int64_t cc = thread_chunk_channels<T>(g, pl, nt);
  return {ScratchSize{cc * kk * max_cols, nt}, ScratchSize{pl.group > 1 ? g.o * max_cols : 0, 1}};
}

template <typename T>
void conv_backward_input_by_channel(const T* gyp, const CMapR<T>& wm, const ConvGeom& g, const Plan& pl, T* gxp,
                                    const Tensor& like) {
  const int nt = std::max(1, omp_get_max_threads());
  const int64_t cc = thread_chunk_channels<T>(g, pl, nt), chunks = (g.c + cc - 1) / cc;
  const auto sizes = by_channel_scratch<T>(g, pl);
  const Scratch<T> gcol_scratch(sizes.first, like);
  const Scratch<T> gy_scratch(sizes.second, like);
  Plan seq = pl;
  seq.inner = false;
  for (int64_t i = 0; i < pl.num_items(); ++i) {
    const Item it = pl.item(i, g.n, g.oh);
    const CMapR<T> gym = item_rows(gyp, g, pl, it, gy_scratch.at(0));
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t ci = 0; ci < chunks; ++ci) {
      const int64_t c0 = ci * cc, c1 = std::min(g.c, c0 + cc);
      input_grad_chunk<T>(wm, gym, g, seq, it, c0, c1, gcol_scratch.at(omp_get_thread_num()), gxp);
    }
  }
}

// The weight gradient when there are too few items to give each thread its own (big [O, K] results
// want many columns per GEMM, so few groups): threads split the input channels instead, each
// building the columns of its channels and writing its own columns of the gradient. Unlike
// threading each GEMM, no thread waits for another between im2col and GEMM, and each streams only
// its share of the result.
template <typename T>
void conv_backward_weight_by_channel(const T* gyp, const T* xp, const ConvGeom& g, const Plan& pl, T* gwp,
                                     const Tensor& like) {
  const int nt = std::max(1, omp_get_max_threads());
  const int64_t k = g.k(), o = g.o, kk = g.kh * g.kw;
  const int64_t cc = thread_chunk_channels<T>(g, pl, nt), chunks = (g.c + cc - 1) / cc;
  const auto sizes = by_channel_scratch<T>(g, pl);
  const Scratch<T> cols_scratch(sizes.first, like);
  const Scratch<T> gy_scratch(sizes.second, like);
  Plan seq = pl;  // copies inside a thread's chunk run on that thread
  seq.inner = false;
  MapR<T> acc(gwp, o, k, Eigen::OuterStride<>(k));
  for (int64_t i = 0; i < pl.num_items(); ++i) {
    const Item it = pl.item(i, g.n, g.oh);
    const CMapR<T> gym = item_rows(gyp, g, pl, it, gy_scratch.at(0));
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t ci = 0; ci < chunks; ++ci) {
      const int64_t c0 = ci * cc, c1 = std::min(g.c, c0 + cc);
      const CMapR<T> cm = item_columns(xp, g, seq, it, c0, c1, cols_scratch.at(omp_get_thread_num()));
      auto dst = acc.middleCols(c0 * kk, (c1 - c0) * kk);
      if (i == 0) {
        dst.noalias() = gym * cm.transpose();
      } else {
        dst.noalias() += gym * cm.transpose();
      }
    }
  }
}

// With stride 1 the input gradient is itself a convolution: of gy with the weight transposed
// ([C, O]) and flipped, padded by (kH-1)*dH - pH. Its GEMM is O*kH*kW deep instead of O deep, which
// is what Eigen's kernel wants when O is small (ResNet stage 1: 64), and its im2col of gy replaces
// col2im's scattered adds. Not for wide O (the GEMM is deep enough already) or few input channels
// (the transposed GEMM would have only C rows).
constexpr int64_t kTransposedMaxOut = 128;
constexpr int64_t kTransposedMinIn = 16;

bool transposed_ok(const ConvGeom& g) {
  const int64_t ph = (g.kh - 1) * g.dh - g.ph, pw = (g.kw - 1) * g.dw - g.pw;
  return g.sh == 1 && g.sw == 1 && !g.pointwise() && g.o < kTransposedMaxOut && g.c >= kTransposedMinIn &&
         ph >= 0 && pw >= 0 && g.h == g.oh + 2 * ph - (g.kh - 1) * g.dh &&
         g.w == g.ow + 2 * pw - (g.kw - 1) * g.dw;
}

// The forward convolution the transposed input gradient runs (of gy, with the flipped weight).
ConvGeom transposed_geom(const ConvGeom& g) {
  return ConvGeom{g.n, g.o, g.oh, g.ow, g.c, g.kh, g.kw, g.h, g.w,
                  1, 1, (g.kh - 1) * g.dh - g.ph, (g.kw - 1) * g.dw - g.pw, g.dh, g.dw};
}

template <typename T>
void conv_backward_input_transposed(const Tensor& gy, const Tensor& w, const ConvGeom& g, const Tensor& gx) {
  const ConvGeom t = transposed_geom(g);
  const Tensor wt = empty({g.c, g.o, g.kh, g.kw}, w.options());
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

// Which of the three input-gradient paths a geometry takes, with its plan; the kernel and
// conv2d_scratch_elements both decide here.
template <typename T>
struct BackwardInputLayout {
  enum class Path { Transposed, ByChannel, Items } path = Path::Items;
  Plan pl;   // the items' plan, or the weight-gradient plan of the by-channel path
  int64_t cc = 0, kk = 0, gcol_sz = 0, gy_sz = 0;
  bool direct = false;  // GEMM straight into gx
  explicit BackwardInputLayout(const ConvGeom& g) {
    kk = g.kh * g.kw;
    if (transposed_ok(g)) {
      path = Path::Transposed;
      return;
    }
    pl = plan_batch<T>(g, Pass::BackwardInput);
    // Small planes and a big weight: the weight-gradient plan (one group of all samples) with
    // threads splitting channels.
    const bool big_weight = g.o * g.k() * static_cast<int64_t>(sizeof(T)) > 2 * kTileBytes;
    if (pl.group > 1 && big_weight && g.c >= 2 * omp_get_max_threads()) {
      const Plan wpl = plan_batch<T>(g, Pass::BackwardWeight);
      if (wpl.inner && wpl.group > pl.group) {
        path = Path::ByChannel;
        pl = wpl;
        return;
      }
    }
    const int64_t max_cols = pl.max_cols(g.ow);
    cc = chunk_channels<T>(g, pl);
    direct = g.pointwise() && pl.group == 1;
    gcol_sz = direct ? 0 : cc * kk * max_cols;
    gy_sz = pl.group > 1 ? g.o * max_cols : 0;
  }
  ScratchSize scratch() const { return {gcol_sz + gy_sz, pl.threads}; }
};

template <typename T>
void conv_backward_input(const Tensor& gy, const Tensor& w, const ConvGeom& g, const Tensor& gx) {
  const T* gyp = gy.data<T>();
  T* gxp = gx.data<T>();
  const int64_t k = g.k(), o = g.o;
  const CMapR<T> wm(w.data<T>(), o, k, Eigen::OuterStride<>(k));
  const BackwardInputLayout<T> lay(g);
  using Path = typename BackwardInputLayout<T>::Path;
  if (lay.path == Path::Transposed) return conv_backward_input_transposed<T>(gy, w, g, gx);
  if (lay.path == Path::ByChannel) return conv_backward_input_by_channel<T>(gyp, wm, g, lay.pl, gxp, gy);
  const Plan& pl = lay.pl;
  const int64_t cc = lay.cc, gcol_sz = lay.gcol_sz;
  const bool direct = lay.direct;
  const Scratch<T> scratch(lay.scratch(), gy);

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

// The weight gradient's path and per-thread scratch layout: [columns | gathered gy | partial sum].
template <typename T>
struct BackwardWeightLayout {
  Plan pl;
  bool by_channel = false;
  int64_t cc = 0, kk = 0, col_sz = 0, gy_sz = 0, part_sz = 0;
  explicit BackwardWeightLayout(const ConvGeom& g) : pl(plan_batch<T>(g, Pass::BackwardWeight)) {
    kk = g.kh * g.kw;
    by_channel = pl.inner && g.c >= 2 * omp_get_max_threads();
    if (by_channel) return;
    const int64_t max_cols = pl.max_cols(g.ow);
    cc = chunk_channels<T>(g, pl);
    col_sz = (g.pointwise() && pl.group == 1) ? 0 : cc * kk * max_cols;
    gy_sz = pl.group > 1 ? g.o * max_cols : 0;
    // Thread 0 accumulates straight into gw, the others into private partial sums that are added
    // in thread order afterwards: with static scheduling the result does not depend on timing.
    part_sz = pl.threads > 1 ? g.o * g.k() : 0;
  }
  ScratchSize scratch() const { return {col_sz + gy_sz + part_sz, pl.threads}; }
};

template <typename T>
void conv_backward_weight(const Tensor& gy, const Tensor& x, const ConvGeom& g, const Tensor& gw) {
  const T* gyp = gy.data<T>();
  const T* xp = x.data<T>();
  const int64_t k = g.k(), o = g.o;
  const BackwardWeightLayout<T> lay(g);
  const Plan& pl = lay.pl;
  if (lay.by_channel) return conv_backward_weight_by_channel<T>(gyp, xp, g, pl, gw.data<T>(), x);
  const int64_t cc = lay.cc, kk = lay.kk, col_sz = lay.col_sz, gy_sz = lay.gy_sz;
  const Scratch<T> scratch(lay.scratch(), x);
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

// The scratch element counts of one kernel call in allocation order (see conv_workspace.h).
template <typename T>
void scratch_of(ConvPass pass, const ConvGeom& g, std::vector<int64_t>& out) {
  const auto push = [&](const ScratchSize& s) {
    if (s.elements() > 0) out.push_back(s.elements());
  };
  if (pass == ConvPass::Forward) return push(ForwardLayout<T>(g).scratch());
  if (pass == ConvPass::BackwardInput) {
    const BackwardInputLayout<T> lay(g);
    using Path = typename BackwardInputLayout<T>::Path;
    if (lay.path == Path::Transposed) {
      out.push_back(g.c * g.o * g.kh * g.kw);   // the flipped weight
      return scratch_of<T>(ConvPass::Forward, transposed_geom(g), out);
    }
    if (lay.path == Path::ByChannel) {
      const auto sizes = by_channel_scratch<T>(g, lay.pl);
      push(sizes.first);
      return push(sizes.second);
    }
    return push(lay.scratch());
  }
  const BackwardWeightLayout<T> lay(g);
  if (lay.by_channel) {
    const auto sizes = by_channel_scratch<T>(g, lay.pl);
    push(sizes.first);
    return push(sizes.second);
  }
  push(lay.scratch());
}

[[noreturn]] void unsupported_dtype(const char* op, const Tensor& t) {
  MINIDL_FAIL(op, " (cpu): dtype ", dtype_name(t.dtype()),
              " is not supported (f32 and f64 only); convert with .to(DType::f32)");
}

}  // namespace

std::vector<int64_t> conv2d_scratch_elements(ConvPass pass, const Shape& x, const Shape& w, const Shape& y,
                                             const Conv2dOptions& o, DType dtype) {
  const ConvGeom g = make_geom(x, w, y, o, "conv2d_scratch_elements");
  std::vector<int64_t> out;
  if (g.n == 0 && pass != ConvPass::BackwardWeight) return out;
  if (dtype == DType::f64) scratch_of<double>(pass, g, out);
  else scratch_of<float>(pass, g, out);
  return out;
}

void CpuBackend::conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dOptions& o,
                                const Tensor& y) {
  check_contiguous("conv2d_forward", {&x, &w, &bias, &y});
  const ConvGeom g = make_geom(x.shape(), w.shape(), y.shape(), o, "conv2d_forward");
  if (g.n == 0) return;
  if (is_half(x) || is_half(w) || is_half(y)) {  // f16: the f32 kernel on widened copies, one rounding
    const Tensor yf = f32_output_for(y);
    conv2d_forward(widen_half(x), widen_half(w), widen_half(bias), o, yf);
    return narrow_into(yf, y);
  }
  switch (x.dtype()) {
    case DType::f32: return conv_forward<float>(x, w, bias, g, y);
    case DType::f64: return conv_forward<double>(x, w, bias, g, y);
    default: unsupported_dtype("conv2d_forward", x);
  }
}

void CpuBackend::conv2d_backward_input(const Tensor& gy, const Tensor& w, const Conv2dOptions& o, const Tensor& gx) {
  check_contiguous("conv2d_backward_input", {&gy, &w, &gx});
  const ConvGeom g = make_geom(gx.shape(), w.shape(), gy.shape(), o, "conv2d_backward_input");
  if (g.n == 0) return;
  if (is_half(gy) || is_half(w) || is_half(gx)) {
    const Tensor gxf = f32_output_for(gx);
    conv2d_backward_input(widen_half(gy), widen_half(w), o, gxf);
    return narrow_into(gxf, gx);
  }
  switch (gy.dtype()) {
    case DType::f32: return conv_backward_input<float>(gy, w, g, gx);
    case DType::f64: return conv_backward_input<double>(gy, w, g, gx);
    default: unsupported_dtype("conv2d_backward_input", gy);
  }
}

void CpuBackend::conv2d_backward_weight(const Tensor& gy, const Tensor& x, const Conv2dOptions& o, const Tensor& gw) {
  check_contiguous("conv2d_backward_weight", {&gy, &x, &gw});
  const ConvGeom g = make_geom(x.shape(), gw.shape(), gy.shape(), o, "conv2d_backward_weight");
  if (is_half(gy) || is_half(x) || is_half(gw)) {
    const Tensor gwf = f32_output_for(gw);
    conv2d_backward_weight(widen_half(gy), widen_half(x), o, gwf);
    return narrow_into(gwf, gw);
  }
  switch (gy.dtype()) {
    case DType::f32: return conv_backward_weight<float>(gy, x, g, gw);
    case DType::f64: return conv_backward_weight<double>(gy, x, g, gw);
    default: unsupported_dtype("conv2d_backward_weight", gy);
  }
}

}  // namespace minidl::cpu
