// The fake algorithm table of the emulated cuDNN (documented in docs/cuda_emu_libs.md). The
// support rules follow the limits cuDNN documents for the legacy algorithms (FFT needs unit stride
// and dilation and NCHW, Winograd 3x3 or 5x5 filters, neither runs in f64, no DIRECT algorithm
// exists); the workspace sizes and speeds are invented but fixed formulas.
#include "kernels/cuda/emu/cudnn_algos.h"

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
