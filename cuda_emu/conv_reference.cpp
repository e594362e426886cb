// The three convolution directions as direct loops over every (output pixel, filter tap) pair
// that lands inside the input: forward gathers x*w into y, backward-data scatters dy*w into dx,
// backward-filter accumulates x*dy into dw. Each element of a result sums its terms from 0 in the
// order conv_reference.h states, each term added by one fused multiply-add. The loops run over
// pixels and taps with the channels innermost (the operands laid out channels-last here), so the
// innermost loop is a run of independent elements the compiler vectorises, and no element's
// order changes. The tests check the three against written-out sums and the adjoint identities,
// and against a per-term walk bit for bit. Below them, the cudnnConvolution* entry points that
// load the descriptors' layouts into them. The working arrays (operands, transposes, results) stay
// with the thread from call to call: fresh ones, megabytes each, took a page fault per page, and
// in an emulated ResNet step that was a quarter of the time.
#include "cuda_emu/conv_reference.h"

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>

#include "cuda_emu/call_log.h"
#include "cuda_emu/cudnn_algos.h"

namespace minidl::cuda::emu::detail {
namespace {

// A call's transposed operands (slots 0 and 1) and sums (slot 2), kept by each thread between calls:
// they are megabytes, and fresh ones every call cost a page fault per page (large blocks are
// mapped anew each time).
std::vector<double>& scratch(int i) {
  thread_local std::array<std::vector<double>, 3> kept;
  return kept[static_cast<size_t>(i)];
}

// v as [outer][inner][pixels] -> [outer][pixels][inner] in t, and back. Every element of t is written.
void reorder(const std::vector<double>& v, int64_t outer, int64_t inner, int64_t pixels, bool to_last,
             std::vector<double>& t) {
  t.resize(v.size());
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t i = 0; i < inner; ++i)
      for (int64_t p = 0; p < pixels; ++p) {
        const auto first = static_cast<size_t>((o * inner + i) * pixels + p);
        const auto last = static_cast<size_t>((o * pixels + p) * inner + i);
        if (to_last) t[last] = v[first];
        else t[first] = v[last];
      }
}
const std::vector<double>& inner_last(const std::vector<double>& v, int64_t outer, int64_t inner, int64_t pixels,
                                      int slot) {
  reorder(v, outer, inner, pixels, true, scratch(slot));
  return scratch(slot);
}
void inner_first(const std::vector<double>& t, int64_t outer, int64_t inner, int64_t pixels, std::vector<double>& v) {
  reorder(t, outer, inner, pixels, false, v);
}
// A zeroed accumulator of n elements in scratch slot `slot` (2: the operands take 0 and 1).
std::vector<double>& zeroed(int slot, int64_t n) {
  std::vector<double>& v = scratch(slot);
  v.assign(static_cast<size_t>(n), 0.0);
  return v;
}

// dst[i] = fma(a, b[i], dst[i]) for i < n.
void axpy(int64_t n, double a, const double* b, double* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = std::fma(a, b[i], dst[i]);
}

// Calls f(ih, iw, tap) for every tap (r, s) that keeps output pixel (oh, ow) inside the input, in
// (r, s) order; tap = r * s-count + s of the filter as stored (flipped under CUDNN_CONVOLUTION).
template <class F>
void for_each_tap(const ConvGeometry& g, int64_t oh, int64_t ow, F&& f) {
  for (int64_t r = 0; r < g.r; ++r) {
    const int64_t ih = oh * g.stride_h - g.pad_h + r * g.dil_h;
    if (ih < 0 || ih >= g.h) continue;
    const int64_t fr = g.flip ? g.r - 1 - r : r;
    for (int64_t s = 0; s < g.s; ++s) {
      const int64_t iw = ow * g.stride_w - g.pad_w + s * g.dil_w;
      if (iw < 0 || iw >= g.w) continue;
      f(ih, iw, fr * g.s + (g.flip ? g.s - 1 - s : s));
    }
  }
}

// Calls f(n, oh, ow, ih, iw, tap) for every output pixel, in [n][oh][ow] order, and its taps.
template <class F>
void for_each_pixel_tap(const ConvGeometry& g, F&& f) {
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t oh = 0; oh < g.oh; ++oh)
      for (int64_t ow = 0; ow < g.ow; ++ow)
        for_each_tap(g, oh, ow, [&](int64_t ih, int64_t iw, int64_t tap) { f(n, oh, ow, ih, iw, tap); });
}

}  // namespace

// y channels-last: each pixel's k outputs gain a channel's term per tap, channels outermost among
// the terms, so every y element adds (c, r, s) in order.
void conv_forward_ref(const ConvGeometry& g, const std::vector<double>& x, const std::vector<double>& w,
                      std::vector<double>& y) {
  const int64_t cg = g.c / g.groups, kg = g.k / g.groups, taps = g.r * g.s;
  const std::vector<double>& xt = inner_last(x, g.n, g.c, g.h * g.w, 0);   // [n][h][w][c]
  const std::vector<double>& wt = inner_last(w, 1, g.k, cg * taps, 1);     // [c][r][s][k]
  std::vector<double>& yt = zeroed(2, g.n * g.oh * g.ow * g.k);
  for (int64_t n = 0; n < g.n; ++n)
    for (int64_t oh = 0; oh < g.oh; ++oh)
      for (int64_t ow = 0; ow < g.ow; ++ow) {
        double* yp = yt.data() + ((n * g.oh + oh) * g.ow + ow) * g.k;
        for (int64_t gi = 0; gi < g.groups; ++gi)
          for (int64_t c = 0; c < cg; ++c)
            for_each_tap(g, oh, ow, [&](int64_t ih, int64_t iw, int64_t tap) {
              const double xv = xt[static_cast<size_t>(((n * g.h + ih) * g.w + iw) * g.c + gi * cg + c)];
              axpy(kg, xv, wt.data() + (c * taps + tap) * g.k + gi * kg, yp + gi * kg);
            });
      }
  inner_first(yt, g.n, g.k, g.oh * g.ow, y);
}

// dx channels-last: output pixels in order within each k, and a pixel reaches a given input
// element through one tap at most, so every dx element adds (k, oh, ow) in order.
void conv_backward_data_ref(const ConvGeometry& g, const std::vector<double>& dy, const std::vector<double>& w,
                            std::vector<double>& dx) {
  const int64_t cg = g.c / g.groups, kg = g.k / g.groups, taps = g.r * g.s;
  const std::vector<double>& wt = inner_last(w, g.k, cg, taps, 1);   // [k][r][s][c]
  std::vector<double>& dxt = zeroed(2, g.n * g.h * g.w * g.c);
  for (int64_t k = 0; k < g.k; ++k) {
    const int64_t c0 = k / kg * cg;
    for_each_pixel_tap(g, [&](int64_t n, int64_t oh, int64_t ow, int64_t ih, int64_t iw, int64_t tap) {
      const double dv = dy[static_cast<size_t>(((n * g.k + k) * g.oh + oh) * g.ow + ow)];
      axpy(cg, dv, wt.data() + (k * taps + tap) * cg, dxt.data() + ((n * g.h + ih) * g.w + iw) * g.c + c0);
    });
  }
  inner_first(dxt, g.n, g.c, g.h * g.w, dx);
}

// dw as [c][r][s][k], over the output channels innermost (the first layer has 3 input channels and
// 64 output ones): one term per output pixel, pixels in (n, oh, ow) order.
void conv_backward_filter_ref(const ConvGeometry& g, const std::vector<double>& x, const std::vector<double>& dy,
                              std::vector<double>& dw) {
  const int64_t cg = g.c / g.groups, kg = g.k / g.groups, taps = g.r * g.s;
  const std::vector<double>& dyt = inner_last(dy, g.n, g.k, g.oh * g.ow, 0);   // [n][oh][ow][k]
  std::vector<double>& dwt = zeroed(2, cg * taps * g.k);
  for_each_pixel_tap(g, [&](int64_t n, int64_t oh, int64_t ow, int64_t ih, int64_t iw, int64_t tap) {
    const double* dyp = dyt.data() + ((n * g.oh + oh) * g.ow + ow) * g.k;
    for (int64_t gi = 0; gi < g.groups; ++gi)
      for (int64_t c = 0; c < cg; ++c) {
        const double xv = x[static_cast<size_t>(((n * g.c + gi * cg + c) * g.h + ih) * g.w + iw)];
        axpy(kg, xv, dyp + gi * kg, dwt.data() + (c * taps + tap) * g.k + gi * kg);
      }
  });
  inner_first(dwt, 1, g.k, cg * taps, dw);
}

std::vector<double> conv_forward_ref(const ConvGeometry& g, const std::vector<double>& x,
                                     const std::vector<double>& w) {
  std::vector<double> y;
  conv_forward_ref(g, x, w, y);
  return y;
}
std::vector<double> conv_backward_data_ref(const ConvGeometry& g, const std::vector<double>& dy,
                                           const std::vector<double>& w) {
  std::vector<double> dx;
  conv_backward_data_ref(g, dy, w, dx);
  return dx;
}
std::vector<double> conv_backward_filter_ref(const ConvGeometry& g, const std::vector<double>& x,
                                             const std::vector<double>& dy) {
  std::vector<double> dw;
  conv_backward_filter_ref(g, x, dy, dw);
  return dw;
}

}  // namespace minidl::cuda::emu::detail

// ---- the references on cuDNN's descriptors, and the three convolution entry points ----

namespace minidl::cuda::emu::detail {
namespace {

// Element offsets of the logical [n][c][h][w] (tensor) or [k][c][r][s] (filter) index.
int64_t tensor_offset(const cudnnTensorStruct& t, int64_t n, int64_t c, int64_t h, int64_t w) {
  return n * t.ns + c * t.cs + h * t.hs + w * t.ws;
}
int64_t filter_offset(const cudnnFilterStruct& f, int64_t k, int64_t c, int64_t r, int64_t s) {
  return f.format == CUDNN_TENSOR_NHWC ? ((k * f.h + r) * f.w + s) * f.c + c : ((k * f.c + c) * f.h + r) * f.w + s;
}
size_t tensor_span_bytes(const cudnnTensorStruct& t, Elem e) {
  return static_cast<size_t>((tensor_offset(t, t.n - 1, t.c - 1, t.h - 1, t.w - 1) + 1)) * elem_size(e);
}
size_t filter_span_bytes(const cudnnFilterStruct& f, Elem e) {
  return static_cast<size_t>(int64_t{f.k} * f.c * f.h * f.w) * elem_size(e);
}

// Calls f(logical index, element offset) for every element of a tensor or filter, in logical order:
// the four logical dims and offset(i0, i1, i2, i3) come from the descriptor.
template <class Offset, class F>
void for_each_4d(const std::array<int64_t, 4>& dims, Offset&& offset, F&& f) {
  int64_t i = 0;
  for (int64_t a = 0; a < dims[0]; ++a)
    for (int64_t b = 0; b < dims[1]; ++b)
      for (int64_t c = 0; c < dims[2]; ++c)
        for (int64_t d = 0; d < dims[3]; ++d) f(i++, offset(a, b, c, d));
}
template <class F>
void for_each_tensor(const cudnnTensorStruct& t, F&& f) {
  for_each_4d({t.n, t.c, t.h, t.w}, [&](int64_t n, int64_t c, int64_t h, int64_t w) {
    return tensor_offset(t, n, c, h, w);
  }, f);
}
template <class F>
void for_each_filter(const cudnnFilterStruct& fd, F&& f) {
  for_each_4d({fd.k, fd.c, fd.h, fd.w}, [&](int64_t k, int64_t c, int64_t r, int64_t s) {
    return filter_offset(fd, k, c, r, s);
  }, f);
}

// One operand of a call: a tensor or a filter at p.
struct Operand {
  const char* name;
  const void* ptr;
  const cudnnTensorStruct* t;   // exactly one of t, f is set
  const cudnnFilterStruct* f;
  size_t span(Elem e) const { return t != nullptr ? tensor_span_bytes(*t, e) : filter_span_bytes(*f, e); }
  template <class F>
  void each(F&& fn) const {
    if (t != nullptr) for_each_tensor(*t, fn);
    else for_each_filter(*f, fn);
  }
  // Its elements in logical order into v, whose storage is reused (a thread's call after call).
  void load(Elem e, InputRounding r, std::vector<double>& v) const {
    v.clear();
    each([&](int64_t, int64_t off) { v.push_back(read_elem(ptr, e, off, r)); });
  }
};

}  // namespace

cudnnStatus_t run_conv(const char* fn, cudnnHandle_t h, Dir d, const Problem& p, const void* alpha, const void* in_a,
                       const void* in_b, const void* beta, void* out, const std::function<void(const Problem&)>& tail) {
  const Operand x0{d == Dir::BwdData ? "dx" : "x", nullptr, p.x, nullptr};
  const Operand w0{d == Dir::BwdFilter ? "dw" : "w", nullptr, nullptr, p.w};
  const Operand y0{d == Dir::Fwd ? "y" : "dy", nullptr, p.y, nullptr};
  const auto operands = [d, in_a, in_b, out](const Operand& x, const Operand& w, const Operand& y) {
    Operand a = d == Dir::BwdData ? y : x, b = d == Dir::BwdFilter ? y : w;
    Operand o = d == Dir::Fwd ? y : d == Dir::BwdData ? x : w;
    a.ptr = in_a;
    b.ptr = in_b;
    o.ptr = out;
    return std::array<Operand, 3>{a, b, o};
  };
  const std::array<Operand, 3> ops = operands(x0, w0, y0);
  if (alpha == nullptr || beta == nullptr)
    return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, cat(fn, ": alpha or beta is NULL"));
  for (const Operand& op : ops) {
    if (op.ptr == nullptr) return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, cat(fn, ": ", op.name, " is NULL"));
    if (reinterpret_cast<uintptr_t>(op.ptr) % elem_size(p.elem) != 0)
      return fail(CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER, cat(fn, ": ", op.name, " = ", op.ptr,
                                                                 " is not aligned to its ", elem_size(p.elem), "-byte ",
                                                                 elem_name(p.elem), " elements"));
  }
  if (!stream_ok(h->stream)) {
    report_fault(cat(fn, ": the handle's stream ", static_cast<const void*>(h->stream),
                     " is not a live stream (destroyed since cudnnSetStream?)"));
    return CUDNN_STATUS_EXECUTION_FAILED;
  }
  const auto ranges_ok = [fn, &p](const std::array<Operand, 3>& v) {
    for (const Operand& op : v) {
      if (!range_ok(op.ptr, op.span(p.elem))) {
        report_fault(cat(fn, ": ", op.name, " = [", op.ptr, ", +", op.span(p.elem), " bytes) (", elem_name(p.elem),
                         ") is not inside one live device allocation (illegal address)"));
        return false;
      }
    }
    return true;
  };
  if (!ranges_ok(ops)) return CUDNN_STATUS_EXECUTION_FAILED;
  // alpha and beta are read at the call, as cuDNN reads host scalars (a captured call keeps them).
  const Elem scale = p.dtype == CUDNN_DATA_DOUBLE ? Elem::F64 : Elem::F32;
  const double al = read_elem(alpha, scale, 0, InputRounding::None), be = read_elem(beta, scale, 0, InputRounding::None);
  // The computation as stream work, with the descriptors copied: a graph keeps the call's
  // parameters, not the caller's descriptors, which may be destroyed or set again before a replay.
  struct Kept {
    cudnnTensorStruct x, y;
    cudnnFilterStruct w;
    Problem p;
  };
  auto kept = std::make_shared<Kept>(Kept{*p.x, *p.y, *p.w, p});
  kept->p.x = &kept->x;
  kept->p.y = &kept->y;
  kept->p.w = &kept->w;
  const auto compute = [kept, d, al, be, out, operands, tail] {
    const Problem& q = kept->p;
    const std::array<Operand, 3> v = operands(Operand{d == Dir::BwdData ? "dx" : "x", nullptr, q.x, nullptr},
                                              Operand{d == Dir::BwdFilter ? "dw" : "w", nullptr, nullptr, q.w},
                                              Operand{d == Dir::Fwd ? "y" : "dy", nullptr, q.y, nullptr});
    const InputRounding r = uses_tf32(q) ? InputRounding::Tf32 : InputRounding::None;
    thread_local std::vector<double> va, vb, res;   // megabytes: kept, as the references keep theirs
    v[0].load(q.elem, r, va);
    v[1].load(q.elem, r, vb);
    if (d == Dir::Fwd) conv_forward_ref(q.g, va, vb, res);
    else if (d == Dir::BwdData) conv_backward_data_ref(q.g, va, vb, res);
    else conv_backward_filter_ref(q.g, va, vb, res);
    v[2].each([&](int64_t i, int64_t off) {
      double val = al * res[static_cast<size_t>(i)];
      if (be != 0.0) val += be * read_elem(out, q.elem, off, InputRounding::None);   // beta == 0: out not read
      write_elem(out, q.elem, off, val);
    });
    if (tail) tail(q);
  };
  const auto replay = [kept, d, operands, compute, ranges_ok_fn = fn] {
    const Problem& q = kept->p;
    const std::array<Operand, 3> v = operands(Operand{d == Dir::BwdData ? "dx" : "x", nullptr, q.x, nullptr},
                                              Operand{d == Dir::BwdFilter ? "dw" : "w", nullptr, nullptr, q.w},
                                              Operand{d == Dir::Fwd ? "y" : "dy", nullptr, q.y, nullptr});
    for (const Operand& op : v) {
      if (!range_ok(op.ptr, op.span(q.elem))) {
        throw std::runtime_error(cat(ranges_ok_fn, " (replayed from a graph): ", op.name, " = [", op.ptr, ", +",
                                     op.span(q.elem), " bytes) is not inside one live device allocation (illegal "
                                     "address; freed since the graph captured the call?)"));
      }
    }
    compute();
  };
  if (record_if_capturing(h->stream, replay, fn)) return CUDNN_STATUS_SUCCESS;
  flush_stream(h->stream);   // the work queued before this call has run (deferred streams)
  compute();
  return CUDNN_STATUS_SUCCESS;
}

// One executed convolution as the call log keeps it (call_log.h): its FLOPs (a multiply-add is 2)
// and the bytes of its three operands, the output counted twice when beta != 0 (read and written).
LibCall conv_call(Dir d, const Problem& p, const char* algo, size_t ws_bytes, bool accumulate, cudaStream_t stream) {
  const ConvGeometry& g = p.g;
  const double e = static_cast<double>(elem_size(p.elem));
  const double xb = e * static_cast<double>(g.n * g.c * g.h * g.w), yb = e * static_cast<double>(g.n * g.k * g.oh * g.ow);
  const double wb = e * static_cast<double>(g.k * (g.c / g.groups) * g.r * g.s);
  LibCall c;
  c.lib = "cuDNN";
  c.op = d == Dir::Fwd ? "conv forward" : d == Dir::BwdData ? "conv backward data" : "conv backward filter";
  const double out = d == Dir::Fwd ? yb : d == Dir::BwdData ? xb : wb;
  c.min_bytes = xb + yb + wb + (accumulate ? out : 0.0);
  c.flops = 2.0 * static_cast<double>(g.n * g.k * g.oh * g.ow * (g.c / g.groups) * g.r * g.s);
  c.dtype = elem_name(p.elem);
  c.algo = algo;
  c.layout = p.x->cs == 1 && g.c > 1 ? "NHWC" : "NCHW";
  c.math = p.dtype == CUDNN_DATA_DOUBLE ? MathClass::Fp64
           : p.dtype == CUDNN_DATA_FLOAT ? (uses_tf32(p) ? MathClass::Tf32Tensor : MathClass::Fp32)
           : p.math == CUDNN_FMA_MATH    ? MathClass::Fp32
                                         : MathClass::F16Tensor;
  c.workspace = ws_bytes;
  c.dims = {static_cast<double>(g.n), static_cast<double>(g.c),  static_cast<double>(g.h),
            static_cast<double>(g.w), static_cast<double>(g.k),  static_cast<double>(g.r),
            static_cast<double>(g.s), static_cast<double>(g.oh), static_cast<double>(g.ow),
            static_cast<double>(g.groups)};
  c.shapes = cat("x ", g.n, "x", g.c, "x", g.h, "x", g.w, " ", c.layout, ", w ", g.k, "x", g.c / g.groups, "x", g.r,
                 "x", g.s, ", y ", g.n, "x", g.k, "x", g.oh, "x", g.ow, ", stride ", g.stride_h, " pad ", g.pad_h);
  c.stream = stream;
  return c;
}

void log_conv(Dir d, const Problem& p, const char* algo, size_t ws_bytes, bool accumulate, cudaStream_t stream) {
  log_call(conv_call(d, p, algo, ws_bytes, accumulate, stream));
}

namespace {

// The execution entry points: the algorithm must support the configuration and get at least the
// workspace cudnnGet*WorkspaceSize gives for it under the descriptor's current math type.
cudnnStatus_t execute(const char* fn, Dir d, cudnnHandle_t h, cudnnTensorDescriptor_t xd, cudnnFilterDescriptor_t wd,
                      cudnnConvolutionDescriptor_t cd, cudnnTensorDescriptor_t yd, int algo, void* ws, size_t ws_bytes,
                      const void* alpha, const void* in_a, const void* in_b, const void* beta, void* out) {
  Problem p;
  if (cudnnStatus_t st = make_problem(fn, h, xd, wd, cd, yd, p); st != CUDNN_STATUS_SUCCESS) return st;
  if (algo < 0 || algo >= algo_count(d))
    return fail(CUDNN_STATUS_BAD_PARAM, cat(fn, ": algo = ", algo, " is not a ", dir_name(d), " algorithm"));
  const AlgoInfo info = algo_info(d, algo, p, p.math);
  if (info.status != CUDNN_STATUS_SUCCESS)
    return fail(info.status, cat(fn, ": algorithm ", info.name, " does not support this configuration: ", info.why));
  if (ws_bytes < info.workspace)
    return fail(CUDNN_STATUS_BAD_PARAM,
                cat(fn, ": workSpaceSizeInBytes = ", ws_bytes, " is less than the ", info.workspace, " bytes algorithm ",
                    info.name, " needs under ", math_name(p.math), " (cudnnGet", dir_name(d), "WorkspaceSize)"));
  if (info.workspace > 0 && ws == nullptr)
    return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, cat(fn, ": workSpace is NULL but algorithm ", info.name,
                                                         " needs ", info.workspace, " bytes"));
  if (!range_ok(ws, info.workspace)) {
    report_fault(cat(fn, ": workSpace [", ws, ", +", info.workspace,
                     " bytes) is not inside one live device allocation (illegal address)"));
    return CUDNN_STATUS_EXECUTION_FAILED;
  }
  // Logged and scribbled as the computation runs (at each replay of a captured call).
  const double beta_value = read_elem(beta, p.dtype == CUDNN_DATA_DOUBLE ? Elem::F64 : Elem::F32, 0, InputRounding::None);
  const size_t scratch = info.workspace;
  const char* algo_name = info.name;
  const cudaStream_t stream = h->stream;
  return run_conv(fn, h, d, p, alpha, in_a, in_b, beta, out, [=](const Problem& q) {
    if (call_logging()) log_conv(d, q, algo_name, ws_bytes, beta_value != 0.0, stream);
    // The algorithm's scratch is garbage afterwards: scribble on it, so a workspace that overlaps
    // live data shows up as corrupted data.
    if (scratch > 0) std::fill_n(static_cast<unsigned char*>(ws), scratch, static_cast<unsigned char>(0xA5));
  });
}

}  // namespace
}  // namespace minidl::cuda::emu::detail

using namespace minidl::cuda::emu::detail;   // NOLINT: the C entry points below are outside our namespace

extern "C" {

cudnnStatus_t cudnnConvolutionForward(cudnnHandle_t handle, const void* alpha, const cudnnTensorDescriptor_t xDesc,
                                      const void* x, const cudnnFilterDescriptor_t wDesc, const void* w,
                                      const cudnnConvolutionDescriptor_t convDesc, cudnnConvolutionFwdAlgo_t algo,
                                      void* workSpace, size_t workSpaceSizeInBytes, const void* beta,
                                      const cudnnTensorDescriptor_t yDesc, void* y) {
  return execute("cudnnConvolutionForward", Dir::Fwd, handle, xDesc, wDesc, convDesc, yDesc, static_cast<int>(algo),
                 workSpace, workSpaceSizeInBytes, alpha, x, w, beta, y);
}

cudnnStatus_t cudnnConvolutionBackwardData(cudnnHandle_t handle, const void* alpha, const cudnnFilterDescriptor_t wDesc,
                                           const void* w, const cudnnTensorDescriptor_t dyDesc, const void* dy,
                                           const cudnnConvolutionDescriptor_t convDesc,
                                           cudnnConvolutionBwdDataAlgo_t algo, void* workSpace,
                                           size_t workSpaceSizeInBytes, const void* beta,
                                           const cudnnTensorDescriptor_t dxDesc, void* dx) {
  return execute("cudnnConvolutionBackwardData", Dir::BwdData, handle, dxDesc, wDesc, convDesc, dyDesc,
                 static_cast<int>(algo), workSpace, workSpaceSizeInBytes, alpha, dy, w, beta, dx);
}

cudnnStatus_t cudnnConvolutionBackwardFilter(cudnnHandle_t handle, const void* alpha,
                                             const cudnnTensorDescriptor_t xDesc, const void* x,
                                             const cudnnTensorDescriptor_t dyDesc, const void* dy,
                                             const cudnnConvolutionDescriptor_t convDesc,
                                             cudnnConvolutionBwdFilterAlgo_t algo, void* workSpace,
                                             size_t workSpaceSizeInBytes, const void* beta,
                                             const cudnnFilterDescriptor_t dwDesc, void* dw) {
  return execute("cudnnConvolutionBackwardFilter", Dir::BwdFilter, handle, xDesc, dwDesc, convDesc, dyDesc,
                 static_cast<int>(algo), workSpace, workSpaceSizeInBytes, alpha, x, dy, beta, dw);
}

}  // extern "C"
