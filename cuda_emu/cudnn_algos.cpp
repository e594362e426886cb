// The fake algorithm table of the emulated cuDNN (documented in docs/cuda/emulated_libraries.md). The
// support rules follow the limits cuDNN documents for the legacy algorithms (FFT needs unit stride
// and dilation and NCHW, Winograd 3x3 or 5x5 filters, neither runs in f64, no DIRECT algorithm
// exists); the workspace sizes and speeds are invented but fixed formulas. Below the table, the
// checks every convolution call shares and the query entry points (_v7, workspace, Find*Ex).
#include "cuda_emu/cudnn_algos.h"

#include <algorithm>

namespace minidl::cuda::emu::detail {
namespace {

bool packed_nchw(const cudnnTensorStruct& t) {
  return t.ws == 1 && t.hs == t.w && t.cs == int64_t{t.h} * t.w && t.ns == int64_t{t.c} * t.h * t.w;
}

int64_t next_pow2(int64_t v) {
  int64_t p = 1;
  while (p < v) p *= 2;
  return p;
}

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The shared restrictions, each returning false (with status and rule) when broken.
struct Rules {
  const Problem& p;
  AlgoInfo& a;
  bool fail(cudnnStatus_t st, const char* why) {
    a.status = st;
    a.why = why;
    return false;
  }
  bool no_f64() { return p.dtype != CUDNN_DATA_DOUBLE || fail(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, "no f64 version"); }
  bool unit() {
    const ConvGeometry& g = p.g;
    return (g.stride_h == 1 && g.stride_w == 1 && g.dil_h == 1 && g.dil_w == 1) ||
           fail(CUDNN_STATUS_NOT_SUPPORTED_SHAPE, "needs stride 1 and dilation 1");
  }
  bool one_group() { return p.g.groups == 1 || fail(CUDNN_STATUS_NOT_SUPPORTED_SHAPE, "needs groupCount 1"); }
  bool nchw_io() {
    return (packed_nchw(*p.x) && packed_nchw(*p.y)) ||
           fail(CUDNN_STATUS_NOT_SUPPORTED_LAYOUT, "needs packed NCHW tensors");
  }
  bool nchw_all() {
    return (nchw_io() && p.w->format == CUDNN_TENSOR_NCHW) ||
           fail(CUDNN_STATUS_NOT_SUPPORTED_LAYOUT, "needs packed NCHW tensors and an NCHW filter");
  }
  bool filter_in(std::initializer_list<int64_t> sizes) {
    const bool ok = p.g.r == p.g.s && std::find(sizes.begin(), sizes.end(), p.g.r) != sizes.end();
    return ok || fail(CUDNN_STATUS_NOT_SUPPORTED_SHAPE,
                      sizes.size() == 1 ? "needs a 3x3 filter" : "needs a 3x3 or 5x5 filter");
  }
  bool fft_fits() {
    const ConvGeometry& g = p.g;
    return (g.h + 2 * g.pad_h <= 256 && g.w + 2 * g.pad_w <= 256 && g.pad_h < g.r && g.pad_w < g.s) ||
           fail(CUDNN_STATUS_NOT_SUPPORTED_SHAPE, "needs a padded input of at most 256x256 and padding below the filter size");
  }
  bool small_filter() {
    return (p.g.r <= 32 && p.g.s <= 32) || fail(CUDNN_STATUS_NOT_SUPPORTED_SHAPE, "needs a filter of at most 32x32");
  }
  bool never(const char* why) { return fail(CUDNN_STATUS_NOT_SUPPORTED, why); }
};

// Fake workspace formulas (bytes).
size_t fft_bytes(const ConvGeometry& g) {
  const int64_t hp = next_pow2(g.h + 2 * g.pad_h), wp = next_pow2(g.w + 2 * g.pad_w);
  return static_cast<size_t>(8 * hp * (wp / 2 + 1) * (g.n * g.c + g.k * g.c + g.n * g.k));
}
size_t fft_tiling_bytes(const ConvGeometry& g) {
  const int64_t tiles = ceil_div(g.oh, 16) * ceil_div(g.ow, 16);
  return static_cast<size_t>(8 * 32 * 17 * (tiles * g.n * (g.c + g.k) + g.k * g.c));
}
size_t winograd_nonfused_bytes(const ConvGeometry& g) {
  const int64_t tile = (4 + g.r - 1) * (4 + g.s - 1), tiles = ceil_div(g.oh, 4) * ceil_div(g.ow, 4);
  return static_cast<size_t>(4 * tile * (tiles * g.n * (g.c + g.k) + g.k * g.c));
}

constexpr const char* kFwdNames[] = {"IMPLICIT_GEMM", "IMPLICIT_PRECOMP_GEMM", "GEMM", "DIRECT",
                                     "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
constexpr const char* kBwdDataNames[] = {"ALGO_0", "ALGO_1", "FFT", "FFT_TILING", "WINOGRAD", "WINOGRAD_NONFUSED"};
constexpr const char* kBwdFilterNames[] = {"ALGO_0", "ALGO_1",           "FFT",       "ALGO_3",
                                           "WINOGRAD", "WINOGRAD_NONFUSED", "FFT_TILING"};

}  // namespace

int algo_count(Dir d) {
  switch (d) {
    case Dir::Fwd: return CUDNN_CONVOLUTION_FWD_ALGO_COUNT;
    case Dir::BwdData: return CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT;
    case Dir::BwdFilter: return CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT;
  }
  return 0;
}

const char* dir_name(Dir d) {
  switch (d) {
    case Dir::Fwd: return "Forward";
    case Dir::BwdData: return "BackwardData";
    case Dir::BwdFilter: return "BackwardFilter";
  }
  return "";
}

cudnnMathType_t reported_math(const Problem& p, cudnnMathType_t math) {
  if (p.dtype == CUDNN_DATA_DOUBLE || math != CUDNN_DEFAULT_MATH) return math;
  return CUDNN_TENSOR_OP_MATH;
}

bool uses_tf32(const Problem& p) { return p.dtype == CUDNN_DATA_FLOAT && p.math != CUDNN_FMA_MATH; }

AlgoInfo algo_info(Dir d, int algo, const Problem& p, cudnnMathType_t math) {
  AlgoInfo a;
  Rules is{p, a};
  const ConvGeometry& g = p.g;
  const int64_t cg = g.c / g.groups, e = static_cast<int64_t>(elem_size(p.elem));
  const bool tensor_ops = p.dtype != CUDNN_DATA_DOUBLE && math != CUDNN_FMA_MATH;
  const auto filter_elems = static_cast<size_t>(g.k * cg * g.r * g.s);
  // FFT, FFT tiling and non-fused Winograd have the same rules and formulas in every direction.
  auto fft = [&] {
    a.tflops = 3.5;
    if (is.no_f64() && is.unit() && is.one_group() && is.nchw_all() && is.fft_fits()) a.workspace = fft_bytes(g);
  };
  auto fft_tiling = [&] {
    a.tflops = 3.0;
    if (is.no_f64() && is.unit() && is.one_group() && is.nchw_all() && is.small_filter())
      a.workspace = fft_tiling_bytes(g);
  };
  auto winograd_nonfused = [&] {
    a.tflops = 4.0;
    if (is.no_f64() && is.unit() && is.one_group() && is.filter_in({3, 5})) a.workspace = winograd_nonfused_bytes(g);
  };
  auto winograd = [&] {
    a.tflops = 1.5;
    (void)(is.no_f64() && is.unit() && is.one_group() && is.filter_in({3}));
  };
  switch (d) {
    case Dir::Fwd:
      a.name = kFwdNames[algo];
      switch (algo) {
        case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM: break;
        case CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_PRECOMP_GEMM:
          a.tflops = 2.0;   // an index table, wider (channels padded) for tensor cores
          a.workspace = static_cast<size_t>(tensor_ops ? 8 * g.r * g.s * cg + 256 : 4 * g.r * g.s * cg);
          break;
        case CUDNN_CONVOLUTION_FWD_ALGO_GEMM:
          a.tflops = 2.5;   // im2col of the whole batch
          if (is.nchw_io()) a.workspace = static_cast<size_t>(e * g.n * g.c * g.r * g.s * g.oh * g.ow);
          break;
        case CUDNN_CONVOLUTION_FWD_ALGO_DIRECT: is.never("cuDNN implements no DIRECT convolution"); break;
        case CUDNN_CONVOLUTION_FWD_ALGO_FFT: fft(); break;
        case CUDNN_CONVOLUTION_FWD_ALGO_FFT_TILING: fft_tiling(); break;
        case CUDNN_CONVOLUTION_FWD_ALGO_WINOGRAD: winograd(); break;
        default: winograd_nonfused(); break;
      }
      break;
    case Dir::BwdData:
      a.name = kBwdDataNames[algo];
      switch (algo) {
        case CUDNN_CONVOLUTION_BWD_DATA_ALGO_0: a.determinism = CUDNN_NON_DETERMINISTIC; break;
        case CUDNN_CONVOLUTION_BWD_DATA_ALGO_1:
          a.tflops = 2.0;   // a transposed copy of the filter for tensor cores
          a.workspace = tensor_ops ? static_cast<size_t>(e) * filter_elems : 0;
          break;
        case CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT: fft(); break;
        case CUDNN_CONVOLUTION_BWD_DATA_ALGO_FFT_TILING: fft_tiling(); break;
        case CUDNN_CONVOLUTION_BWD_DATA_ALGO_WINOGRAD: winograd(); break;
        default: winograd_nonfused(); break;
      }
      break;
    case Dir::BwdFilter:
      a.name = kBwdFilterNames[algo];
      switch (algo) {
        case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_0: a.determinism = CUDNN_NON_DETERMINISTIC; break;
        case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1:
          a.tflops = 2.0;   // f32 partial sums for tensor cores
          a.workspace = tensor_ops ? 4 * filter_elems : 0;
          break;
        case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_FFT: fft(); break;
        case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_3:
          a.tflops = 2.5;   // f32 partial sums of up to four slices of the batch
          a.determinism = CUDNN_NON_DETERMINISTIC;
          a.workspace = 4 * filter_elems * static_cast<size_t>(std::min<int64_t>(g.n, 4));
          break;
        case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD:
          is.never("CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD is not implemented by cuDNN");
          break;
        case CUDNN_CONVOLUTION_BWD_FILTER_ALGO_WINOGRAD_NONFUSED: winograd_nonfused(); break;
        default: fft_tiling(); break;
      }
      break;
  }
  if (a.status != CUDNN_STATUS_SUCCESS) a.workspace = 0;
  return a;
}

std::vector<int> ranked_algos(Dir d, const Problem& p, cudnnMathType_t math) {
  std::vector<int> ok, unsupported;
  std::vector<double> speed(static_cast<size_t>(algo_count(d)));
  for (int i = 0; i < algo_count(d); ++i) {
    const AlgoInfo a = algo_info(d, i, p, math);
    speed[static_cast<size_t>(i)] = a.tflops;
    (a.status == CUDNN_STATUS_SUCCESS ? ok : unsupported).push_back(i);
  }
  std::stable_sort(ok.begin(), ok.end(), [&](int l, int r) {
    return speed[static_cast<size_t>(l)] > speed[static_cast<size_t>(r)];
  });
  ok.insert(ok.end(), unsupported.begin(), unsupported.end());
  return ok;
}

float fake_time_ms(const Problem& p, const AlgoInfo& a) {
  const ConvGeometry& g = p.g;
  const double flops = 2.0 * static_cast<double>(g.n * g.k * g.oh * g.ow * (g.c / g.groups) * g.r * g.s);
  return static_cast<float>(flops / (a.tflops * 1e12) * 1e3);
}

}  // namespace minidl::cuda::emu::detail

// ---- the problem of one call, and the query entry points ----

namespace minidl::cuda::emu::detail {

cudnnStatus_t make_problem(const char* fn, cudnnHandle_t h, cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w,
                           cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t y, Problem& p) {
  if (cudnnStatus_t st = check_handle(fn, h); st != CUDNN_STATUS_SUCCESS) return st;
  if (cudnnStatus_t st = check_tensor(fn, "the x-shaped tensor descriptor", x); st != CUDNN_STATUS_SUCCESS) return st;
  if (cudnnStatus_t st = check_filter(fn, "the filter descriptor", w); st != CUDNN_STATUS_SUCCESS) return st;
  if (cudnnStatus_t st = check_conv(fn, "convDesc", conv); st != CUDNN_STATUS_SUCCESS) return st;
  if (cudnnStatus_t st = check_tensor(fn, "the y-shaped tensor descriptor", y); st != CUDNN_STATUS_SUCCESS) return st;
  if (x->dtype != w->dtype || x->dtype != y->dtype)
    return fail(CUDNN_STATUS_BAD_PARAM, cat(fn, ": the data types differ: x-shaped ", dtype_name(x->dtype),
                                            ", filter ", dtype_name(w->dtype), ", y-shaped ", dtype_name(y->dtype)));
  Elem e{};
  if (!elem_of(x->dtype, e) || e == Elem::I8 || e == Elem::I32)
    return fail(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE,
                cat(fn, ": data type ", dtype_name(x->dtype), " is not emulated for convolutions (FLOAT, DOUBLE, HALF, "
                        "BFLOAT16)"));
  // cuDNN's legal configurations: f64 data computes in f64; f32 in f32; f16 / bf16 in f32 (or
  // f16 for "true half").
  const cudnnDataType_t ct = conv->compute;
  const bool ok = x->dtype == CUDNN_DATA_DOUBLE ? ct == CUDNN_DATA_DOUBLE
                  : x->dtype == CUDNN_DATA_FLOAT ? ct == CUDNN_DATA_FLOAT
                  : x->dtype == CUDNN_DATA_HALF  ? (ct == CUDNN_DATA_FLOAT || ct == CUDNN_DATA_HALF)
                                                 : ct == CUDNN_DATA_FLOAT;
  if (!ok)
    return fail(CUDNN_STATUS_NOT_SUPPORTED_DATA_TYPE, cat(fn, ": compute type ", dtype_name(ct), " with data type ",
                                                          dtype_name(x->dtype), " is not a supported configuration"));
  int on = 0, oc = 0, oh = 0, ow = 0;
  if (cudnnStatus_t st = conv_output_dims(fn, *conv, *x, *w, on, oc, oh, ow); st != CUDNN_STATUS_SUCCESS) return st;
  if (y->n != on || y->c != oc || y->h != oh || y->w != ow)
    return fail(CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH,
                cat(fn, ": the y-shaped tensor is ", y->n, "x", y->c, "x", y->h, "x", y->w, " but the convolution of ",
                    x->n, "x", x->c, "x", x->h, "x", x->w, " by ", w->k, "x", w->c, "x", w->h, "x", w->w, " gives ", on,
                    "x", oc, "x", oh, "x", ow));
  ConvGeometry& g = p.g;
  g = {x->n, x->c, x->h, x->w, w->k, w->h, w->w, oh, ow, conv->groups, conv->pad_h, conv->pad_w,
       conv->u, conv->v, conv->dil_h, conv->dil_w, conv->mode == CUDNN_CONVOLUTION};
  p.dtype = x->dtype;
  p.elem = e;
  p.math = conv->math;
  p.x = x;
  p.w = w;
  p.y = y;
  return CUDNN_STATUS_SUCCESS;
}

namespace {

// The three perf structs have the same fields; one filler for all.
template <class Perf, class Algo>
void fill_perf(Perf& out, Dir d, int algo, const Problem& p, float time_ms) {
  const AlgoInfo a = algo_info(d, algo, p, p.math);
  out = Perf{};
  out.algo = static_cast<Algo>(algo);
  out.status = a.status;
  out.time = a.status == CUDNN_STATUS_SUCCESS ? time_ms : -1.0f;
  out.memory = a.workspace;
  out.determinism = a.determinism;
  out.mathType = reported_math(p, p.math);
}

cudnnStatus_t check_counts(const char* fn, int requested, const int* returned, const void* perf) {
  if (returned == nullptr || perf == nullptr)
    return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, cat(fn, ": returnedAlgoCount or perfResults is NULL"));
  if (requested < 1) return fail(CUDNN_STATUS_BAD_PARAM, cat(fn, ": requestedAlgoCount = ", requested, " < 1"));
  return CUDNN_STATUS_SUCCESS;
}

// cudnnGet*Algorithm_v7: the heuristic ranking, supported algorithms first, no timing.
template <class Perf, class Algo>
cudnnStatus_t heuristic_query(const char* fn, Dir d, cudnnHandle_t h, cudnnTensorDescriptor_t x,
                              cudnnFilterDescriptor_t w, cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t y,
                              int requested, int* returned, Perf* perf) {
  ++cudnn_query_count();
  Problem p;
  if (cudnnStatus_t st = make_problem(fn, h, x, w, conv, y, p); st != CUDNN_STATUS_SUCCESS) return st;
  if (cudnnStatus_t st = check_counts(fn, requested, returned, perf); st != CUDNN_STATUS_SUCCESS) return st;
  const std::vector<int> order = ranked_algos(d, p, p.math);
  const int n = std::min(requested, static_cast<int>(order.size()));
  for (int i = 0; i < n; ++i) fill_perf<Perf, Algo>(perf[i], d, order[static_cast<size_t>(i)], p, -1.0f);
  *returned = n;
  return CUDNN_STATUS_SUCCESS;
}

// cudnnGet*WorkspaceSize: the algorithm's workspace under the descriptor's current math type;
// an algorithm that does not support the configuration reports its status.
cudnnStatus_t workspace_query(const char* fn, Dir d, cudnnHandle_t h, cudnnTensorDescriptor_t x,
                              cudnnFilterDescriptor_t w, cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t y,
                              int algo, size_t* size) {
  ++cudnn_query_count();
  Problem p;
  if (cudnnStatus_t st = make_problem(fn, h, x, w, conv, y, p); st != CUDNN_STATUS_SUCCESS) return st;
  if (size == nullptr) return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, cat(fn, ": sizeInBytes is NULL"));
  if (algo < 0 || algo >= algo_count(d))
    return fail(CUDNN_STATUS_BAD_PARAM, cat(fn, ": algo = ", algo, " is not a ", dir_name(d), " algorithm"));
  const AlgoInfo a = algo_info(d, algo, p, p.math);
  if (a.status != CUDNN_STATUS_SUCCESS)
    return fail(a.status, cat(fn, ": algorithm ", a.name, " does not support this configuration: ", a.why));
  *size = a.workspace;
  return CUDNN_STATUS_SUCCESS;
}

// cudnnFind*AlgorithmEx: "times" every supported algorithm whose workspace fits the one given
// (fake times, fastest first), runs the convolution once into the output (alpha 1, beta 0: the
// output's contents are not preserved, as documented), then lists the rest with their status.
template <class Perf, class Algo>
cudnnStatus_t find_ex(const char* fn, Dir d, cudnnHandle_t h, cudnnTensorDescriptor_t x, cudnnFilterDescriptor_t w,
                      cudnnConvolutionDescriptor_t conv, cudnnTensorDescriptor_t y, const void* in_a,
                      const void* in_b, void* out, int requested, int* returned, Perf* perf, void* ws,
                      size_t ws_bytes) {
  ++cudnn_query_count();
  Problem p;
  if (cudnnStatus_t st = make_problem(fn, h, x, w, conv, y, p); st != CUDNN_STATUS_SUCCESS) return st;
  if (cudnnStatus_t st = check_counts(fn, requested, returned, perf); st != CUDNN_STATUS_SUCCESS) return st;
  if (ws_bytes > 0 && ws == nullptr)
    return fail(CUDNN_STATUS_BAD_PARAM_NULL_POINTER, cat(fn, ": workSpace is NULL with workSpaceSizeInBytes ", ws_bytes));
  if (!range_ok(ws, ws_bytes)) {
    report_fault(cat(fn, ": workSpace [", ws, ", +", ws_bytes, " bytes) is not inside one live device allocation"));
    return CUDNN_STATUS_EXECUTION_FAILED;
  }
  std::vector<std::pair<float, int>> timed;
  std::vector<int> rest;
  const long long call = next_cudnn_find_call();
  for (const int algo : ranked_algos(d, p, p.math)) {
    const AlgoInfo a = algo_info(d, algo, p, p.math);
    if (a.status == CUDNN_STATUS_SUCCESS && a.workspace <= ws_bytes)
      timed.emplace_back(fake_time_ms(p, a) + cudnn_find_delay(call, algo), algo);
    else rest.push_back(algo);
  }
  std::stable_sort(timed.begin(), timed.end(), [](const auto& l, const auto& r) { return l.first < r.first; });
  if (!timed.empty()) {
    const double one = 1.0, zero = 0.0;
    const float one32 = 1.0f, zero32 = 0.0f;
    const bool f64 = p.dtype == CUDNN_DATA_DOUBLE;
    if (cudnnStatus_t st = run_conv(fn, h, d, p, f64 ? static_cast<const void*>(&one) : &one32, in_a, in_b,
                                    f64 ? static_cast<const void*>(&zero) : &zero32, out);
        st != CUDNN_STATUS_SUCCESS)
      return st;
    if (ws_bytes > 0) std::fill_n(static_cast<unsigned char*>(ws), ws_bytes, static_cast<unsigned char>(0xA5));
  }
  int n = 0;
  for (const auto& [t, algo] : timed)
    if (n < requested) fill_perf<Perf, Algo>(perf[n++], d, algo, p, t);
  for (const int algo : rest) {
    if (n >= requested) break;
    fill_perf<Perf, Algo>(perf[n], d, algo, p, -1.0f);
    if (perf[n].status == CUDNN_STATUS_SUCCESS) perf[n].status = CUDNN_STATUS_BAD_PARAM_SIZE_INSUFFICIENT;
    ++n;
  }
  *returned = n;
  return CUDNN_STATUS_SUCCESS;
}

}  // namespace
}  // namespace minidl::cuda::emu::detail

using namespace minidl::cuda::emu::detail;   // NOLINT: the C entry points below are outside our namespace

extern "C" {

cudnnStatus_t cudnnGetConvolutionForwardAlgorithm_v7(cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc,
                                                     const cudnnFilterDescriptor_t filterDesc,
                                                     const cudnnConvolutionDescriptor_t convDesc,
                                                     const cudnnTensorDescriptor_t destDesc,
                                                     const int requestedAlgoCount, int* returnedAlgoCount,
                                                     cudnnConvolutionFwdAlgoPerf_t* perfResults) {
  return heuristic_query<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(
      "cudnnGetConvolutionForwardAlgorithm_v7", Dir::Fwd, handle, srcDesc, filterDesc, convDesc, destDesc,
      requestedAlgoCount, returnedAlgoCount, perfResults);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataAlgorithm_v7(cudnnHandle_t handle, const cudnnFilterDescriptor_t filterDesc,
                                                          const cudnnTensorDescriptor_t diffDesc,
                                                          const cudnnConvolutionDescriptor_t convDesc,
                                                          const cudnnTensorDescriptor_t gradDesc,
                                                          const int requestedAlgoCount, int* returnedAlgoCount,
                                                          cudnnConvolutionBwdDataAlgoPerf_t* perfResults) {
  return heuristic_query<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(
      "cudnnGetConvolutionBackwardDataAlgorithm_v7", Dir::BwdData, handle, gradDesc, filterDesc, convDesc, diffDesc,
      requestedAlgoCount, returnedAlgoCount, perfResults);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterAlgorithm_v7(cudnnHandle_t handle, const cudnnTensorDescriptor_t srcDesc,
                                                            const cudnnTensorDescriptor_t diffDesc,
                                                            const cudnnConvolutionDescriptor_t convDesc,
                                                            const cudnnFilterDescriptor_t gradDesc,
                                                            const int requestedAlgoCount, int* returnedAlgoCount,
                                                            cudnnConvolutionBwdFilterAlgoPerf_t* perfResults) {
  return heuristic_query<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(
      "cudnnGetConvolutionBackwardFilterAlgorithm_v7", Dir::BwdFilter, handle, srcDesc, gradDesc, convDesc, diffDesc,
      requestedAlgoCount, returnedAlgoCount, perfResults);
}

cudnnStatus_t cudnnGetConvolutionForwardWorkspaceSize(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                      const cudnnFilterDescriptor_t wDesc,
                                                      const cudnnConvolutionDescriptor_t convDesc,
                                                      const cudnnTensorDescriptor_t yDesc,
                                                      cudnnConvolutionFwdAlgo_t algo, size_t* sizeInBytes) {
  return workspace_query("cudnnGetConvolutionForwardWorkspaceSize", Dir::Fwd, handle, xDesc, wDesc, convDesc, yDesc,
                         static_cast<int>(algo), sizeInBytes);
}

cudnnStatus_t cudnnGetConvolutionBackwardDataWorkspaceSize(cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc,
                                                           const cudnnTensorDescriptor_t dyDesc,
                                                           const cudnnConvolutionDescriptor_t convDesc,
                                                           const cudnnTensorDescriptor_t dxDesc,
                                                           cudnnConvolutionBwdDataAlgo_t algo, size_t* sizeInBytes) {
  return workspace_query("cudnnGetConvolutionBackwardDataWorkspaceSize", Dir::BwdData, handle, dxDesc, wDesc, convDesc,
                         dyDesc, static_cast<int>(algo), sizeInBytes);
}

cudnnStatus_t cudnnGetConvolutionBackwardFilterWorkspaceSize(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                             const cudnnTensorDescriptor_t dyDesc,
                                                             const cudnnConvolutionDescriptor_t convDesc,
                                                             const cudnnFilterDescriptor_t gradDesc,
                                                             cudnnConvolutionBwdFilterAlgo_t algo,
                                                             size_t* sizeInBytes) {
  return workspace_query("cudnnGetConvolutionBackwardFilterWorkspaceSize", Dir::BwdFilter, handle, xDesc, gradDesc,
                         convDesc, dyDesc, static_cast<int>(algo), sizeInBytes);
}

cudnnStatus_t cudnnFindConvolutionForwardAlgorithmEx(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                     const void* x, const cudnnFilterDescriptor_t wDesc, const void* w,
                                                     const cudnnConvolutionDescriptor_t convDesc,
                                                     const cudnnTensorDescriptor_t yDesc, void* y,
                                                     const int requestedAlgoCount, int* returnedAlgoCount,
                                                     cudnnConvolutionFwdAlgoPerf_t* perfResults, void* workSpace,
                                                     size_t workSpaceSizeInBytes) {
  return find_ex<cudnnConvolutionFwdAlgoPerf_t, cudnnConvolutionFwdAlgo_t>(
      "cudnnFindConvolutionForwardAlgorithmEx", Dir::Fwd, handle, xDesc, wDesc, convDesc, yDesc, x, w, y,
      requestedAlgoCount, returnedAlgoCount, perfResults, workSpace, workSpaceSizeInBytes);
}

cudnnStatus_t cudnnFindConvolutionBackwardDataAlgorithmEx(cudnnHandle_t handle, const cudnnFilterDescriptor_t wDesc,
                                                          const void* w, const cudnnTensorDescriptor_t dyDesc,
                                                          const void* dy, const cudnnConvolutionDescriptor_t convDesc,
                                                          const cudnnTensorDescriptor_t dxDesc, void* dx,
                                                          const int requestedAlgoCount, int* returnedAlgoCount,
                                                          cudnnConvolutionBwdDataAlgoPerf_t* perfResults,
                                                          void* workSpace, size_t workSpaceSizeInBytes) {
  return find_ex<cudnnConvolutionBwdDataAlgoPerf_t, cudnnConvolutionBwdDataAlgo_t>(
      "cudnnFindConvolutionBackwardDataAlgorithmEx", Dir::BwdData, handle, dxDesc, wDesc, convDesc, dyDesc, dy, w, dx,
      requestedAlgoCount, returnedAlgoCount, perfResults, workSpace, workSpaceSizeInBytes);
}

cudnnStatus_t cudnnFindConvolutionBackwardFilterAlgorithmEx(cudnnHandle_t handle, const cudnnTensorDescriptor_t xDesc,
                                                            const void* x, const cudnnTensorDescriptor_t dyDesc,
                                                            const void* y, const cudnnConvolutionDescriptor_t convDesc,
                                                            const cudnnFilterDescriptor_t dwDesc, void* dw,
                                                            const int requestedAlgoCount, int* returnedAlgoCount,
                                                            cudnnConvolutionBwdFilterAlgoPerf_t* perfResults,
                                                            void* workSpace, size_t workSpaceSizeInBytes) {
  return find_ex<cudnnConvolutionBwdFilterAlgoPerf_t, cudnnConvolutionBwdFilterAlgo_t>(
      "cudnnFindConvolutionBackwardFilterAlgorithmEx", Dir::BwdFilter, handle, xDesc, dwDesc, convDesc, dyDesc, x, y,
      dw, requestedAlgoCount, returnedAlgoCount, perfResults, workSpace, workSpaceSizeInBytes);
}

}  // extern "C"
