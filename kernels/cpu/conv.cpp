// CPU convolution (NCHW): im2col + Eigen GEMM, the reference every other backend is checked against
// and the engine of CPU training. The column matrix is built in tiles that stay in L2 right before
// the GEMM reads them, and small output planes (deep ResNet stages) are batched into one GEMM so
// the weights are streamed once per group of samples instead of once per sample.
#include <omp.h>

#include <Eigen/Core>
#include <algorithm>
#include <cstring>

#include "core/tensor.h"
#include "kernels/cpu/cpu_backend.h"

namespace minidl::cpu {

namespace {

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

struct ConvGeom {
  int64_t n, c, h, w;     // input
  int64_t o, kh, kw;      // weight
  int64_t oh, ow;         // output
  int64_t sh, sw, ph, pw, dh, dw;

  int64_t k() const { return c * kh * kw; }  // GEMM inner dimension (rows of the column matrix)
  int64_t p() const { return oh * ow; }      // output pixels per sample
  int64_t in_size() const { return c * h * w; }
  // Input and output pixels coincide: the input plane is the column matrix itself.
  bool pointwise() const { return kh == 1 && kw == 1 && sh == 1 && sw == 1 && ph == 0 && pw == 0; }
};

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

enum class Pass { Forward, BackwardInput, BackwardWeight };

// How the batch is cut into items and spread over threads. Two modes: with enough items, items
// run on OpenMP threads with single-threaded GEMMs (threads > 1); otherwise items run in order,
// Eigen threads each GEMM and the copies around it are split over (sample, channel) (inner).
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

// Valid output columns [lo, hi) for kernel column offset `off` (input column = j * s + off).
inline void valid_range(int64_t off, int64_t s, int64_t in, int64_t out, int64_t& lo, int64_t& hi) {
  lo = off >= 0 ? 0 : (-off + s - 1) / s;
  hi = in - off <= 0 ? 0 : (in - off + s - 1) / s;
  lo = std::min(lo, out);
  hi = std::clamp(hi, lo, out);
}

// Output rows [r0, r1) of channel c of one sample's input [C, H, W] -> the column rows of that
// channel (kH*kW of them, starting at col) x [(r1-r0)*oW], row stride ld.
template <typename T>
void im2col(const T* x, const ConvGeom& g, int64_t c, int64_t r0, int64_t r1, T* col, int64_t ld) {
  const T* xc = x + c * g.h * g.w;
  if (g.pointwise()) {
    std::memcpy(col, xc + r0 * g.ow, sizeof(T) * (r1 - r0) * g.ow);
    return;
  }
  for (int64_t ki = 0; ki < g.kh; ++ki) {
    for (int64_t kj = 0; kj < g.kw; ++kj) {
      T* dst = col + (ki * g.kw + kj) * ld;
      const int64_t off_w = kj * g.dw - g.pw;
      int64_t lo, hi;
      valid_range(off_w, g.sw, g.w, g.ow, lo, hi);
      for (int64_t r = r0; r < r1; ++r) {
        T* d = dst + (r - r0) * g.ow;
        const int64_t ih = r * g.sh - g.ph + ki * g.dh;
        if (ih < 0 || ih >= g.h) {
          std::fill(d, d + g.ow, T(0));
          continue;
        }
        std::fill(d, d + lo, T(0));
        const T* src = xc + ih * g.w;
        if (g.sw == 1) {
          if (hi > lo) std::memcpy(d + lo, src + lo + off_w, sizeof(T) * (hi - lo));
        } else {
          for (int64_t j = lo; j < hi; ++j) d[j] = src[j * g.sw + off_w];
        }
        std::fill(d + hi, d + g.ow, T(0));
      }
    }
  }
}

// The adjoint of im2col: adds the column rows of channel c for output rows [r0, r1) into that
// channel's plane of one sample's gradient [C, H, W].
template <typename T>
void col2im(const T* col, int64_t ld, const ConvGeom& g, int64_t c, int64_t r0, int64_t r1, T* gx) {
  T* gc = gx + c * g.h * g.w;
  if (g.pointwise()) {
    T* d = gc + r0 * g.ow;
    const int64_t n = (r1 - r0) * g.ow;
    for (int64_t j = 0; j < n; ++j) d[j] += col[j];
    return;
  }
  for (int64_t ki = 0; ki < g.kh; ++ki) {
    for (int64_t kj = 0; kj < g.kw; ++kj) {
      const T* src = col + (ki * g.kw + kj) * ld;
      const int64_t off_w = kj * g.dw - g.pw;
      int64_t lo, hi;
      valid_range(off_w, g.sw, g.w, g.ow, lo, hi);
      for (int64_t r = r0; r < r1; ++r) {
        const int64_t ih = r * g.sh - g.ph + ki * g.dh;
        if (ih < 0 || ih >= g.h) continue;
        const T* s = src + (r - r0) * g.ow;
        T* d = gc + ih * g.w;
        if (g.sw == 1) {
          for (int64_t j = lo; j < hi; ++j) d[j + off_w] += s[j];
        } else {
          for (int64_t j = lo; j < hi; ++j) d[j * g.sw + off_w] += s[j];
        }
      }
    }
  }
}

// The column matrix of an item: a strided view of the input when it is one (1x1 stride-1 conv of
// one sample), otherwise built by im2col into buf as [K, gn * rows * oW].
template <typename T>
CMapR<T> item_columns(const T* x, const ConvGeom& g, const Plan& pl, const Item& it, T* buf) {
  const int64_t rows_cols = (it.r1 - it.r0) * g.ow, cols = it.gn * rows_cols;
  if (g.pointwise() && it.gn == 1) {
    return CMapR<T>(x + it.n0 * g.in_size() + it.r0 * g.ow, g.k(), cols, Eigen::OuterStride<>(g.p()));
  }
  const int64_t kk = g.kh * g.kw;
  for_each_plane(pl, it.gn, g.c, [&](int64_t j, int64_t c) {
    im2col(x + (it.n0 + j) * g.in_size(), g, c, it.r0, it.r1, buf + c * kk * cols + j * rows_cols, cols);
  });
  return CMapR<T>(buf, g.k(), cols, Eigen::OuterStride<>(cols));
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

template <typename T>
void conv_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const ConvGeom& g, const Tensor& y) {
  const T* xp = x.data<T>();
  const T* bp = bias.defined() ? bias.data<T>() : nullptr;
  T* yp = y.data<T>();
  const int64_t k = g.k(), p = g.p(), o = g.o;
  const CMapR<T> wm(w.data<T>(), o, k, Eigen::OuterStride<>(k));
  const Plan pl = plan_batch<T>(g, Pass::Forward);
  const int64_t max_cols = pl.max_cols(g.ow);
  const int64_t col_sz = (g.pointwise() && pl.group == 1) ? 0 : k * max_cols;
  const int64_t out_sz = pl.group > 1 ? o * max_cols : 0;
  const Scratch<T> scratch(col_sz + out_sz, pl.threads, x);

  for_each_item(pl, g, [&](const Item& it, int tid) {
    T* buf = scratch.at(tid);
    const CMapR<T> cm = item_columns(xp, g, pl, it, buf);
    const int64_t cols = cm.cols();
    // A single sample writes its output tile in place; a group goes through a buffer.
    T* dst = it.gn == 1 ? yp + it.n0 * o * p + it.r0 * g.ow : buf + col_sz;
    const int64_t ld = it.gn == 1 ? p : cols;
    MapR<T> om(dst, o, cols, Eigen::OuterStride<>(ld));
    if (bp) {
      for (int64_t r = 0; r < o; ++r) std::fill(dst + r * ld, dst + r * ld + cols, bp[r]);
      om.noalias() += wm * cm;
    } else {
      om.noalias() = wm * cm;
    }
    if (it.gn > 1) {
      for_each_plane(pl, it.gn, o, [&](int64_t j, int64_t r) {
        std::memcpy(yp + ((it.n0 + j) * o + r) * p, dst + r * cols + j * p, sizeof(T) * p);
      });
    }
  });
}

template <typename T>
void conv_backward_input(const Tensor& gy, const Tensor& w, const ConvGeom& g, const Tensor& gx) {
  const T* gyp = gy.data<T>();
  T* gxp = gx.data<T>();
  const int64_t k = g.k(), o = g.o, kk = g.kh * g.kw;
  const CMapR<T> wm(w.data<T>(), o, k, Eigen::OuterStride<>(k));
  const Plan pl = plan_batch<T>(g, Pass::BackwardInput);
  const int64_t max_cols = pl.max_cols(g.ow);
  const bool direct = g.pointwise() && pl.group == 1;  // GEMM straight into gx
  const int64_t gcol_sz = direct ? 0 : k * max_cols;
  const int64_t gy_sz = pl.group > 1 ? o * max_cols : 0;
  const Scratch<T> scratch(gcol_sz + gy_sz, pl.threads, gy);

  for_each_item(pl, g, [&](const Item& it, int tid) {
    T* buf = scratch.at(tid);
    const CMapR<T> gym = item_rows(gyp, g, pl, it, buf ? buf + gcol_sz : nullptr);
    const int64_t cols = gym.cols();
    if (direct) {
      MapR<T>(gxp + it.n0 * g.in_size() + it.r0 * g.ow, k, cols, Eigen::OuterStride<>(g.p())).noalias() =
          wm.transpose() * gym;
      return;
    }
    MapR<T>(buf, k, cols, Eigen::OuterStride<>(cols)).noalias() = wm.transpose() * gym;
    const int64_t rows_cols = (it.r1 - it.r0) * g.ow;
    for_each_plane(pl, it.gn, g.c, [&](int64_t j, int64_t c) {
      T* gxn = gxp + (it.n0 + j) * g.in_size();
      if (it.r0 == 0) std::fill(gxn + c * g.h * g.w, gxn + (c + 1) * g.h * g.w, T(0));  // first tile
      col2im(buf + c * kk * cols + j * rows_cols, cols, g, c, it.r0, it.r1, gxn);
    });
  });
}

template <typename T>
void conv_backward_weight(const Tensor& gy, const Tensor& x, const ConvGeom& g, const Tensor& gw) {
  const T* gyp = gy.data<T>();
  const T* xp = x.data<T>();
  const int64_t k = g.k(), o = g.o;
  const Plan pl = plan_batch<T>(g, Pass::BackwardWeight);
  const int64_t max_cols = pl.max_cols(g.ow);
  const int64_t col_sz = (g.pointwise() && pl.group == 1) ? 0 : k * max_cols;
  const int64_t gy_sz = pl.group > 1 ? o * max_cols : 0;
  // Thread 0 accumulates straight into gw, the others into private partial sums that are added in
  // thread order afterwards: with static scheduling the result does not depend on timing.
  const int64_t part_sz = pl.threads > 1 ? o * k : 0;
  const Scratch<T> scratch(col_sz + gy_sz + part_sz, pl.threads, x);
  auto partial = [&](int tid) { return tid == 0 ? gw.data<T>() : scratch.at(tid) + col_sz + gy_sz; };
  for (int t = 0; t < pl.threads; ++t) std::fill(partial(t), partial(t) + o * k, T(0));

  for_each_item(pl, g, [&](const Item& it, int tid) {
    T* buf = scratch.at(tid);
    const CMapR<T> cm = item_columns(xp, g, pl, it, buf);
    const CMapR<T> gym = item_rows(gyp, g, pl, it, buf ? buf + col_sz : nullptr);
    MapR<T>(partial(tid), o, k, Eigen::OuterStride<>(k)).noalias() += gym * cm.transpose();
  });

  if (pl.threads > 1) {
    MapR<T> acc(gw.data<T>(), o, k, Eigen::OuterStride<>(k));
    for (int t = 1; t < pl.threads; ++t) acc += CMapR<T>(partial(t), o, k, Eigen::OuterStride<>(k));
  }
}

[[noreturn]] void unsupported_dtype(const char* op, const Tensor& t) {
  MINIDL_FAIL(op, " (cpu): dtype ", dtype_name(t.dtype()),
              " is not supported (f32 and f64 only); convert with .to(DType::f32)");
}

}  // namespace

void CpuBackend::conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dOptions& o,
                                const Tensor& y) {
  check_contiguous("conv2d_forward", {&x, &w, &bias, &y});
  const ConvGeom g = make_geom(x.shape(), w.shape(), y.shape(), o, "conv2d_forward");
  if (g.n == 0) return;
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
  switch (gy.dtype()) {
    case DType::f32: return conv_backward_input<float>(gy, w, g, gx);
    case DType::f64: return conv_backward_input<double>(gy, w, g, gx);
    default: unsupported_dtype("conv2d_backward_input", gy);
  }
}

void CpuBackend::conv2d_backward_weight(const Tensor& gy, const Tensor& x, const Conv2dOptions& o, const Tensor& gw) {
  check_contiguous("conv2d_backward_weight", {&gy, &x, &gw});
  const ConvGeom g = make_geom(x.shape(), gw.shape(), gy.shape(), o, "conv2d_backward_weight");
  switch (gy.dtype()) {
    case DType::f32: return conv_backward_weight<float>(gy, x, g, gw);
    case DType::f64: return conv_backward_weight<double>(gy, x, g, gw);
    default: unsupported_dtype("conv2d_backward_weight", gy);
  }
}

}  // namespace minidl::cpu
