// The CUDA side of dynamic loss scaling: ONE launch over every gradient tensor multiplies by
// 1/scale and raises a found-non-finite flag on the device, so GradScaler never synchronises per
// tensor (PyTorch's _amp_foreach_non_finite_check_and_unscale_). Also the vectorised casts between f32
// and the 16-bit floats (f16, bf16).
#include <vector>

#include "kernels/cuda/amp.cuh"
#include "kernels/cuda/context.cuh"
#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/device/common.cuh"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/workspace.h"

namespace minidl::cuda {
namespace {

// A slice of one gradient tensor (multi-tensor-apply style): each block takes one chunk, so a
// group of many small tensors and one of few big ones both fill the GPU in a single launch.
enum class GradType : int32_t { F32 = 0, F16 = 1, F64 = 2, BF16 = 3 };
struct GradChunk {
  void* ptr;        // first element of the slice
  int64_t numel;    // elements in the slice (<= kChunkElems)
  GradType type;
};
constexpr int64_t kChunkElems = int64_t{1} << 16;

template <typename T, typename C>
__device__ __forceinline__ bool unscale_range(T* p, int64_t n, C inv) {
  bool bad = false;
  for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
    const C c = cvt<C>(p[i]);
    bad = bad || !::isfinite(c);   // checked before scaling, as PyTorch and the CPU backend
    p[i] = cvt<T>(c * inv);
  }
  return bad;
}

// scale != nullptr: the scale is on the device (GradScaler's device state) and 1/scale is computed
// here as the host computes it, 1/scale in double rounded to f32.
__global__ void unscale_kernel(const GradChunk* __restrict__ chunks, int64_t nchunks, float inv_f, double inv_d,
                               const float* __restrict__ scale, float* __restrict__ found_inf) {
  if (scale != nullptr) {
    inv_f = static_cast<float>(1.0 / static_cast<double>(*scale));
    inv_d = static_cast<double>(inv_f);
  }
  for (int64_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const GradChunk ch = chunks[c];
    bool bad = false;
    switch (ch.type) {
      case GradType::F32: bad = unscale_range(static_cast<float*>(ch.ptr), ch.numel, inv_f); break;
      case GradType::F16: bad = unscale_range(static_cast<__half*>(ch.ptr), ch.numel, inv_f); break;
      case GradType::BF16: bad = unscale_range(static_cast<__nv_bfloat16*>(ch.ptr), ch.numel, inv_f); break;
      case GradType::F64: bad = unscale_range(static_cast<double*>(ch.ptr), ch.numel, inv_d); break;
    }
    // Every writer stores the same value, so the race is benign; the flag is never cleared here.
    if (bad) *found_inf = 1.0f;
  }
}

// Two 16-bit floats as one 32-bit value (__half2, __nv_bfloat162), converted from and to two f32
// in one instruction each way on the GPU, rounding to nearest even as the CPU does.
template <typename H>
struct Pair16;
template <>
struct Pair16<__half> {
  using type = __half2;
  static __device__ __forceinline__ type pack(float a, float b) { return __floats2half2_rn(a, b); }
  static __device__ __forceinline__ float2 unpack(type h) { return __half22float2(h); }
};
template <>
struct Pair16<__nv_bfloat16> {
  using type = __nv_bfloat162;
  static __device__ __forceinline__ type pack(float a, float b) { return __floats2bfloat162_rn(a, b); }
  static __device__ __forceinline__ float2 unpack(type h) { return __bfloat1622float2(h); }
};

// Contiguous casts, 8 elements per thread per iteration (one 16-byte load or store of the 16-bit
// type, two 16-byte f32 ones), with a scalar tail.
template <typename H>
__device__ __forceinline__ void f32_to_16(H* __restrict__ dst, const float* __restrict__ src, int64_t n) {
  using P = Pair16<H>;
  const int64_t nv = n / 8;
  MINIDL_GRID_STRIDE(i, nv) {
    const float4 a = reinterpret_cast<const float4*>(src)[2 * i];
    const float4 b = reinterpret_cast<const float4*>(src)[2 * i + 1];
    union {
      uint4 u;
      typename P::type h[4];
    } r;
    r.h[0] = P::pack(a.x, a.y);
    r.h[1] = P::pack(a.z, a.w);
    r.h[2] = P::pack(b.x, b.y);
    r.h[3] = P::pack(b.z, b.w);
    reinterpret_cast<uint4*>(dst)[i] = r.u;
  }
  MINIDL_GRID_STRIDE(j, n - nv * 8) { dst[nv * 8 + j] = cvt<H>(src[nv * 8 + j]); }
}

template <typename H>
__device__ __forceinline__ void to_f32(float* __restrict__ dst, const H* __restrict__ src, int64_t n) {
  using P = Pair16<H>;
  const int64_t nv = n / 8;
  MINIDL_GRID_STRIDE(i, nv) {
    union {
      uint4 u;
      typename P::type h[4];
    } r;
    r.u = reinterpret_cast<const uint4*>(src)[i];
    const float2 a = P::unpack(r.h[0]), b = P::unpack(r.h[1]);
    const float2 c = P::unpack(r.h[2]), d = P::unpack(r.h[3]);
    reinterpret_cast<float4*>(dst)[2 * i] = make_float4(a.x, a.y, b.x, b.y);
    reinterpret_cast<float4*>(dst)[2 * i + 1] = make_float4(c.x, c.y, d.x, d.y);
  }
  MINIDL_GRID_STRIDE(j, n - nv * 8) { dst[nv * 8 + j] = cvt<float>(src[nv * 8 + j]); }
}

// One kernel per type pair, so each keeps its own name in profiles and the step-time model.
__global__ void f32_to_f16_kernel(__half* __restrict__ dst, const float* __restrict__ src, int64_t n) {
  f32_to_16(dst, src, n);
}
__global__ void f32_to_bf16_kernel(__nv_bfloat16* __restrict__ dst, const float* __restrict__ src, int64_t n) {
  f32_to_16(dst, src, n);
}
__global__ void f16_to_f32_kernel(float* __restrict__ dst, const __half* __restrict__ src, int64_t n) {
  to_f32(dst, src, n);
}
__global__ void bf16_to_f32_kernel(float* __restrict__ dst, const __nv_bfloat16* __restrict__ src, int64_t n) {
  to_f32(dst, src, n);
}

// PyTorch's _amp_update_scale_, one thread: the scale and the growth tracker never leave the device.
__global__ void update_scale_kernel(float* __restrict__ scale, int32_t* __restrict__ tracker,
                                    const float* __restrict__ found_inf, double growth, double backoff,
                                    int32_t interval) {
  if (threadIdx.x != 0 || blockIdx.x != 0) return;
  if (*found_inf != 0.0f) {
    *scale = static_cast<float>(static_cast<double>(*scale) * backoff);
    *tracker = 0;
  } else {
    const int32_t successful = *tracker + 1;
    if (successful == interval) {
      const float grown = static_cast<float>(static_cast<double>(*scale) * growth);
      if (::isfinite(grown)) *scale = grown;
      *tracker = 0;
    } else {
      *tracker = successful;
    }
  }
}

void check_one(const Tensor& t, DType dtype, const char* op, const char* what) {
  MINIDL_CHECK(t.defined() && t.numel() == 1 && t.dtype() == dtype && t.is_contiguous(), op, " (cuda): ", what,
               " must be a one-element ", dtype_name(dtype), " tensor, got ",
               t.defined() ? t.meta() : std::string("an undefined tensor"));
}

}  // namespace

size_t unscale_table_bytes(const std::vector<Tensor>& grads) {
  size_t chunks = 0;
  for (const Tensor& g : grads) {
    if (g.defined() && g.numel() > 0) chunks += static_cast<size_t>((g.numel() + kChunkElems - 1) / kChunkElems);
  }
  return chunks * sizeof(GradChunk);
}

bool cast_f32_16bit_vectorized(const Tensor& src, const Tensor& dst) {
  const auto is16 = [](DType t) { return t == DType::f16 || t == DType::bf16; };
  const bool narrow = src.dtype() == DType::f32 && is16(dst.dtype());
  const bool widen = is16(src.dtype()) && dst.dtype() == DType::f32;
  // Both contiguous or both channels-last (the casts of a channels-last AMP step): flat arrays.
  if (!(narrow || widen) || !same_memory_order(src, dst) || !aligned16(src.data_ptr()) ||
      !aligned16(dst.data_ptr())) {
    return false;
  }
  const int64_t n = dst.numel();
  if (n == 0) return true;
  DeviceContext& ctx = context_of(dst);
  const unsigned grid = grid_for(n / 8 + 1);
  cudaStream_t st = ctx.stream();
  void* d = dst.data_ptr();
  const void* x = src.data_ptr();
  if (dst.dtype() == DType::f16) {
    MINIDL_LAUNCH_NOWAIT("copy f32->f16", f32_to_f16_kernel, grid, kThreads, 0, st, static_cast<__half*>(d),
                         static_cast<const float*>(x), n);
  } else if (dst.dtype() == DType::bf16) {
    MINIDL_LAUNCH_NOWAIT("copy f32->bf16", f32_to_bf16_kernel, grid, kThreads, 0, st,
                         static_cast<__nv_bfloat16*>(d), static_cast<const float*>(x), n);
  } else if (src.dtype() == DType::f16) {
    MINIDL_LAUNCH_NOWAIT("copy f16->f32", f16_to_f32_kernel, grid, kThreads, 0, st, static_cast<float*>(d),
                         static_cast<const __half*>(x), n);
  } else {
    MINIDL_LAUNCH_NOWAIT("copy bf16->f32", bf16_to_f32_kernel, grid, kThreads, 0, st, static_cast<float*>(d),
                         static_cast<const __nv_bfloat16*>(x), n);
  }
  return true;
}

void CudaBackend::unscale_grads(const std::vector<Tensor>& grads, double inv_scale, const Tensor& found_inf) {
  unscale(grads, inv_scale, nullptr, found_inf);
}

void CudaBackend::unscale_grads_device(const std::vector<Tensor>& grads, const Tensor& scale, const Tensor& found_inf) {
  check_one(scale, DType::f32, "unscale_grads_device", "scale");
  check_cuda("unscale_grads_device", {&scale, &found_inf});
  unscale(grads, 0.0, static_cast<const float*>(scale.data_ptr()), found_inf);
}

void CudaBackend::update_scale_device(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                                      double growth_factor, double backoff_factor, int64_t growth_interval) {
  check_one(scale, DType::f32, "update_scale_device", "scale");
  check_one(growth_tracker, DType::i32, "update_scale_device", "growth_tracker");
  check_one(found_inf, DType::f32, "update_scale_device", "found_inf");
  check_cuda("update_scale_device", {&scale, &growth_tracker, &found_inf});
  MINIDL_CHECK(growth_interval > 0 && growth_interval < (int64_t{1} << 31), "update_scale_device (cuda): "
               "growth_interval ", growth_interval, " must be in [1, 2^31)");
  DeviceContext& ctx = context_of(scale);
  MINIDL_LAUNCH_NOWAIT("update_scale", update_scale_kernel, 1, 32, 0, ctx.stream(),
                       static_cast<float*>(scale.data_ptr()), static_cast<int32_t*>(growth_tracker.data_ptr()),
                       static_cast<const float*>(found_inf.data_ptr()), growth_factor, backoff_factor,
                       static_cast<int32_t>(growth_interval));
}

void CudaBackend::unscale(const std::vector<Tensor>& grads, double inv_scale, const float* scale,
                          const Tensor& found_inf) {
  check_one(found_inf, DType::f32, "unscale_grads", "found_inf");
  check_cuda("unscale_grads", {&found_inf});
  // Strided gradients (rare: autograd writes contiguous ones) are unscaled in a contiguous copy
  // that is written back after the launch.
  std::vector<std::pair<Tensor, Tensor>> write_back;   // {original, contiguous copy}
  std::vector<GradChunk> chunks;
  for (const Tensor& g0 : grads) {
    if (!g0.defined() || g0.numel() == 0) continue;
    check_cuda("unscale_grads", {&found_inf, &g0});
    GradType type;
    switch (g0.dtype()) {
      case DType::f32: type = GradType::F32; break;
      case DType::f16: type = GradType::F16; break;
      case DType::bf16: type = GradType::BF16; break;
      case DType::f64: type = GradType::F64; break;
      default:
        MINIDL_FAIL("unscale_grads (cuda): gradient ", g0.meta(), " is not floating (f32, f64, f16 or bf16)");
    }
    Tensor g = g0.detach();
    if (!g.is_contiguous() && !is_channels_last(g)) {   // dense gradients are walked flat
      g = g.contiguous();
      write_back.emplace_back(g0.detach(), g);
    }
    char* base = static_cast<char*>(g.data_ptr());
    const size_t esize = dtype_size(g.dtype());
    for (int64_t off = 0; off < g.numel(); off += kChunkElems) {
      chunks.push_back({base + static_cast<size_t>(off) * esize, std::min(kChunkElems, g.numel() - off), type});
    }
  }
  if (chunks.empty()) return;
  DeviceContext& ctx = context_of(found_inf);
  const size_t bytes = unscale_table_bytes(grads);
  MINIDL_CHECK(bytes == chunks.size() * sizeof(GradChunk), "unscale_grads (cuda): chunk table of ", bytes,
               " bytes for ", chunks.size(), " chunks");
  DeviceBuffer meta(ctx, bytes);   // stream-ordered: freed after the launch is queued, reused only after it
  ctx.staging().to_device(meta.get(), chunks.data(), bytes, ctx.stream());
  const auto n = static_cast<int64_t>(chunks.size());
  MINIDL_LAUNCH_NOWAIT("unscale_grads", unscale_kernel, grid_for(n * kThreads), kThreads, 0, ctx.stream(),
                       static_cast<const GradChunk*>(meta.get()), n, static_cast<float>(inv_scale), inv_scale, scale,
                       static_cast<float*>(found_inf.data_ptr()));
  for (auto& [orig, tmp] : write_back) copy(tmp, orig);
}

}  // namespace minidl::cuda
