// How the CPU convolution (conv.cpp) cuts a batch into GEMMs and which temporaries that needs:
// the planning half of the kernels, shared with conv_workspace.cpp so the workspace a dry run is
// told about is computed by the very functions the kernels size their allocations with.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>
#include <vector>

#include "core/error.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "kernels/cpu/conv_im2col.h"
#include "kernels/cpu/winograd.h"

namespace minidl::cpu::conv_detail {

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

inline ConvGeom make_geom(const Shape& x, const Shape& wt, const Shape& y, const Conv2dOptions& o, const char* op) {
  MINIDL_CHECK(x.size() == 4 && wt.size() == 4 && y.size() == 4, op, " (cpu): expected 4-D tensors, got input ",
               shape_str(x), ", weight ", shape_str(wt), ", output ", shape_str(y));
  MINIDL_CHECK(o.groups == 1, op, " (cpu): groups=", o.groups, " is not supported yet");
  ConvGeom g{x[0], x[1], x[2], x[3], wt[0], wt[2], wt[3], y[2], y[3],
             o.stride[0], o.stride[1], o.padding[0], o.padding[1], o.dilation[0], o.dilation[1]};
  MINIDL_CHECK(wt[1] == g.c && y[0] == g.n && y[1] == g.o, op, " (cpu): inconsistent shapes: input ", shape_str(x),
               ", weight ", shape_str(wt), ", output ", shape_str(y));
  return g;
}

// One GEMM's worth of work: samples [n0, n0 + gn) and output rows [r0, r1) of each. Either gn == 1
// (a band of rows of one sample) or the rows are all of them (whole planes of gn samples).
struct Item {
  int64_t n0, gn, r0, r1;
};

enum class Pass { Forward, BackwardInput, BackwardWeight };

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

// Channels per chunk when threads split the channels: chunks that fit the tile budget, as many as
// a multiple of the thread count so that static scheduling balances them.
template <typename T>
int64_t thread_chunk_channels(const ConvGeom& g, const Plan& pl, int nt) {
  const int64_t cc = chunk_channels<T>(g, pl);
  const int64_t chunks = std::min(g.c, ((g.c + cc - 1) / cc + nt - 1) / nt * nt);
  return (g.c + chunks - 1) / chunks;
}

// With stride 1 the input gradient is itself a convolution: of gy with the weight transposed
// ([C, O]) and flipped, padded by (kH-1)*dH - pH. Its GEMM is O*kH*kW deep instead of O deep, which
// is what the GEMM wants when O is small (ResNet stage 1: 64), and its im2col of gy replaces
// col2im's scattered adds. Not for wide O (the GEMM is deep enough already) or few input channels
// (the transposed GEMM would have only C rows). 3x3 layers that Winograd takes (winograd.h) run
// this convolution through it whatever their widths, reading the weight flipped in place.
constexpr int64_t kTransposedMaxOut = 128;
constexpr int64_t kTransposedMinIn = 16;

inline bool transposable(const ConvGeom& g) {
  const int64_t ph = (g.kh - 1) * g.dh - g.ph, pw = (g.kw - 1) * g.dw - g.pw;
  return g.sh == 1 && g.sw == 1 && !g.pointwise() && ph >= 0 && pw >= 0 &&
         g.h == g.oh + 2 * ph - (g.kh - 1) * g.dh && g.w == g.ow + 2 * pw - (g.kw - 1) * g.dw;
}

inline ConvGeom transposed_geom(const ConvGeom& g) {
  return ConvGeom{g.n, g.o, g.oh, g.ow, g.c, g.kh, g.kw, g.h, g.w,
                  1, 1, (g.kh - 1) * g.dh - g.ph, (g.kw - 1) * g.dw - g.pw, g.dh, g.dw};
}

inline bool transposed_ok(const ConvGeom& g) {
  return transposable(g) && g.o < kTransposedMaxOut && g.c >= kTransposedMinIn;
}

template <typename T>
bool winograd_input_ok(const ConvGeom& g) {
  return std::is_same_v<T, float> && transposable(g) && winograd_ok(transposed_geom(g));
}

// The temporaries of one pass, in elements of T and in allocation order: the flipped weight of the
// transposed input gradient or Winograd's transformed weight, one shared block (a gathered output
// gradient), then per-thread scratch.
// The kernels size their allocations from this, and conv2d_workspace_bytes() reports the same
// numbers, so a dry run that asks for them reproduces the peak exactly.
struct Workspace {
  enum class Path { Forward, Winograd, Transposed, ByChannel, Items } path = Path::Items;
  int64_t weight_copy = 0;
  int64_t shared = 0;
  int64_t per_thread = 0;
  int threads = 1;
  ConvGeom inner{};  // Transposed: the forward convolution it runs (whose workspace follows)
};

// Winograd's: the transformed weight, then each thread's block (g: the convolution it runs).
inline Workspace winograd_workspace(const ConvGeom& g) {
  const WinogradPlan wp = winograd_plan(g);
  Workspace ws;
  ws.path = Workspace::Path::Winograd;
  ws.weight_copy = wp.weight_elems;
  ws.per_thread = wp.per_thread;
  ws.threads = wp.threads;
  return ws;
}

template <typename T>
Workspace forward_workspace(const ConvGeom& g) {
  if (std::is_same_v<T, float> && winograd_ok(g)) return winograd_workspace(g);
  const Plan pl = plan_batch<T>(g, Pass::Forward);
  const int64_t max_cols = pl.max_cols(g.ow), cc = chunk_channels<T>(g, pl);
  const int64_t col_sz = (g.pointwise() && pl.group == 1) ? 0 : cc * g.kh * g.kw * max_cols;
  Workspace ws;
  ws.path = Workspace::Path::Forward;
  ws.per_thread = col_sz + (pl.group > 1 ? g.o * max_cols : 0);
  ws.threads = pl.threads;
  return ws;
}

template <typename T>
Workspace input_workspace(const ConvGeom& g) {
  Workspace ws;
  const int64_t kk = g.kh * g.kw;
  if (winograd_input_ok<T>(g)) return winograd_workspace(transposed_geom(g));
  if (transposed_ok(g)) {
    ws.path = Workspace::Path::Transposed;
    ws.weight_copy = g.c * g.o * kk;
    ws.inner = transposed_geom(g);
    return ws;
  }
  const Plan pl = plan_batch<T>(g, Pass::BackwardInput);
  // Small planes and a big weight: the weight-gradient plan (one group of all samples) with
  // threads splitting channels.
  const bool big_weight = g.o * g.k() * static_cast<int64_t>(sizeof(T)) > 2 * kTileBytes;
  const int nt = std::max(1, omp_get_max_threads());
  if (pl.group > 1 && big_weight && g.c >= 2 * nt) {
    const Plan wpl = plan_batch<T>(g, Pass::BackwardWeight);
    if (wpl.inner && wpl.group > pl.group) {
      const int64_t max_cols = wpl.max_cols(g.ow);
      ws.path = Workspace::Path::ByChannel;
      ws.shared = wpl.group > 1 ? g.o * max_cols : 0;
      ws.per_thread = thread_chunk_channels<T>(g, wpl, nt) * kk * max_cols;
      ws.threads = nt;
      return ws;
    }
  }
  const int64_t max_cols = pl.max_cols(g.ow);
  const bool direct = g.pointwise() && pl.group == 1;
  ws.per_thread = (direct ? 0 : chunk_channels<T>(g, pl) * kk * max_cols) + (pl.group > 1 ? g.o * max_cols : 0);
  ws.threads = pl.threads;
  return ws;
}

template <typename T>
Workspace weight_workspace(const ConvGeom& g) {
  Workspace ws;
  if (std::is_same_v<T, float> && winograd_ok(g)) {  // each thread's V, W and dU
    const WinogradPlan wp = winograd_plan(g);
    ws.path = Workspace::Path::Winograd;
    ws.per_thread = wp.per_thread + wp.weight_elems;
    ws.threads = wp.threads;
    return ws;
  }
  const Plan pl = plan_batch<T>(g, Pass::BackwardWeight);
  const int nt = std::max(1, omp_get_max_threads());
  const int64_t max_cols = pl.max_cols(g.ow), kk = g.kh * g.kw;
  const int64_t gy_sz = pl.group > 1 ? g.o * max_cols : 0;
  if (pl.inner && g.c >= 2 * nt) {
    ws.path = Workspace::Path::ByChannel;
    ws.shared = gy_sz;
    ws.per_thread = thread_chunk_channels<T>(g, pl, nt) * kk * max_cols;
    ws.threads = nt;
    return ws;
  }
  const int64_t col_sz = (g.pointwise() && pl.group == 1) ? 0 : chunk_channels<T>(g, pl) * kk * max_cols;
  ws.per_thread = col_sz + gy_sz + (pl.threads > 1 ? g.o * g.k() : 0);
  ws.threads = pl.threads;
  return ws;
}

// Bytes of each block the workspace allocates, in order (blocks of 0 elements allocate nothing).
template <typename T>
void workspace_blocks(const Workspace& ws, std::vector<int64_t>& out) {
  const auto add = [&out](int64_t elems) {
    if (elems > 0) out.push_back(elems * static_cast<int64_t>(sizeof(T)));
  };
  add(ws.weight_copy);
  if (ws.path == Workspace::Path::Transposed) return workspace_blocks<T>(forward_workspace<T>(ws.inner), out);
  add(ws.shared);
  add(ws.per_thread * ws.threads);
}

}  // namespace minidl::cpu::conv_detail
