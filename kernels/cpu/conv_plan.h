// How the CPU convolution (conv.cpp) cuts a batch into GEMMs and which scratch each pass needs:
// the plans and layouts the kernels run, and scratch_of, which lists the same scratch for
// cpu::conv2d_scratch_elements (kernels/cpu/workspace.h), so the meta device's dry run allocates
// exactly what the kernels do. Kept apart from the compute so both read one set of decisions.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

#include "kernels/cpu/conv_im2col.h"
#include "kernels/cpu/workspace.h"

namespace minidl::cpu::conv_detail {

using Pass = ConvPass;

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

// One GEMM's worth of work: samples [n0, n0 + gn) and output rows [r0, r1) of each. Either gn == 1
// (a band of rows of one sample) or the rows are all of them (whole planes of gn samples).
struct Item {
  int64_t n0, gn, r0, r1;
};

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

// One scratch allocation of a kernel: per-thread elements times threads (nothing when per is 0).
struct ScratchSize {
  int64_t per_thread = 0;
  int threads = 1;
  int64_t elements() const { return per_thread > 0 ? per_thread * threads : 0; }
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

// Channels per chunk when threads split the channels: chunks that fit the tile budget, as many as
// a multiple of the thread count so that static scheduling balances them.
template <typename T>
int64_t thread_chunk_channels(const ConvGeom& g, const Plan& pl, int nt) {
  const int64_t cc = chunk_channels<T>(g, pl);
  const int64_t chunks = std::min(g.c, ((g.c + cc - 1) / cc + nt - 1) / nt * nt);
  return (g.c + chunks - 1) / chunks;
}

// The two scratch allocations of the by-channel paths: per-thread columns of a channel chunk, and
// one gathered copy of a group's output gradient.
template <typename T>
std::pair<ScratchSize, ScratchSize> by_channel_scratch(const ConvGeom& g, const Plan& pl) {
  const int nt = std::max(1, omp_get_max_threads());
  const int64_t kk = g.kh * g.kw, max_cols = pl.max_cols(g.ow);
  const int64_t cc = thread_chunk_channels<T>(g, pl, nt);
  return {ScratchSize{cc * kk * max_cols, nt}, ScratchSize{pl.group > 1 ? g.o * max_cols : 0, 1}};
}

// With stride 1 the input gradient is itself a convolution: of gy with the weight transposed
// ([C, O]) and flipped, padded by (kH-1)*dH - pH. Its GEMM is O*kH*kW deep instead of O deep, which
// is what Eigen's kernel wants when O is small (ResNet stage 1: 64), and its im2col of gy replaces
// col2im's scattered adds. Not for wide O (the GEMM is deep enough already) or few input channels
// (the transposed GEMM would have only C rows).
constexpr int64_t kTransposedMaxOut = 128;
constexpr int64_t kTransposedMinIn = 16;

inline bool transposed_ok(const ConvGeom& g) {
  const int64_t ph = (g.kh - 1) * g.dh - g.ph, pw = (g.kw - 1) * g.dw - g.pw;
  return g.sh == 1 && g.sw == 1 && !g.pointwise() && g.o < kTransposedMaxOut && g.c >= kTransposedMinIn &&
         ph >= 0 && pw >= 0 && g.h == g.oh + 2 * ph - (g.kh - 1) * g.dh &&
         g.w == g.ow + 2 * pw - (g.kw - 1) * g.dw;
}

// The forward convolution the transposed input gradient runs (of gy, with the flipped weight).
inline ConvGeom transposed_geom(const ConvGeom& g) {
  return ConvGeom{g.n, g.o, g.oh, g.ow, g.c, g.kh, g.kw, g.h, g.w,
                  1, 1, (g.kh - 1) * g.dh - g.ph, (g.kw - 1) * g.dw - g.pw, g.dh, g.dw};
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

// The scratch element counts of one kernel call in allocation order (kernels/cpu/workspace.h).
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

}  // namespace minidl::cpu::conv_detail
