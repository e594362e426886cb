// CUDA elementwise kernels: copies (dtype conversion, strided, host<->device through pinned
// staging), fills, unary and binary ops with broadcasting. Contiguous operands take a 16-byte
// vectorised grid-stride path; anything else goes through the strided offset calculator.
#include <cmath>

#include "kernels/common/scalar_ops.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cuda/amp.cuh"
#include "kernels/cuda/context.cuh"
#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/device/common.cuh"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/device/math.cuh"

namespace minidl::cuda {
namespace {

// ---- Operators (the same formulas as kernels/cpu/elementwise.cpp) ----

// libm functions by type: kernels/cuda/device/math.cuh.

template <typename C>
__device__ __forceinline__ C apply_unary(UnaryOp op, C x, C s) {
  switch (op) {
    case UnaryOp::Neg: return -x;
    case UnaryOp::Exp: return d_exp(x);
    case UnaryOp::Log: return d_log(x);
    case UnaryOp::Log1p: return d_log1p(x);
    case UnaryOp::Sqrt: return d_sqrt(x);
    case UnaryOp::Abs: return d_abs(x);
    case UnaryOp::Relu: return x > C(0) ? x : C(0);
    case UnaryOp::Sigmoid: return C(1) / (C(1) + d_exp(-x));
    case UnaryOp::Tanh: return d_tanh(x);
    case UnaryOp::Square: return x * x;
    case UnaryOp::Pow: return d_pow(x, s);
  }
  return x;
}

using common::apply_arith;     // kernels/common/scalar_ops.h, shared with the CPU reference
using common::apply_compare;

// ---- Kernels ----

template <typename D, typename S>
__global__ void copy_strided_kernel(D* dst, const S* src, OffsetCalc<2> oc, int64_t n) {
  MINIDL_GRID_STRIDE(i, n) {
    int64_t off[2];
    oc.get(i, off);
    dst[off[0]] = cvt<D>(src[off[1]]);
  }
}

template <typename D, typename S>
__global__ void copy_contig_kernel(D* __restrict__ dst, const S* __restrict__ src, int64_t n) {
  MINIDL_GRID_STRIDE(i, n) { dst[i] = cvt<D>(src[i]); }
}

template <typename T>
__global__ void fill_strided_kernel(T* dst, T v, OffsetCalc<1> oc, int64_t n) {
  MINIDL_GRID_STRIDE(i, n) {
    int64_t off[1];
    oc.get(i, off);
    dst[off[0]] = v;
  }
}

template <typename T>
__global__ void unary_vec_kernel(UnaryOp op, T* out, const T* x, int64_t n, double s) {
  using C = typename Compute<T>::type;
  constexpr int V = vec_width<T>();
  const C sc = static_cast<C>(s);
  const int64_t nv = n / V;
  MINIDL_GRID_STRIDE(i, nv) {
    Vec<T, V> a = reinterpret_cast<const Vec<T, V>*>(x)[i];
    Vec<T, V> r;
#pragma unroll
    for (int k = 0; k < V; ++k) r.v[k] = cvt<T>(apply_unary<C>(op, cvt<C>(a.v[k]), sc));
    reinterpret_cast<Vec<T, V>*>(out)[i] = r;
  }
  MINIDL_GRID_STRIDE(j, n - nv * V) {
    const int64_t i = nv * V + j;
    out[i] = cvt<T>(apply_unary<C>(op, cvt<C>(x[i]), sc));
  }
}

template <typename T>
__global__ void unary_strided_kernel(UnaryOp op, T* out, const T* x, OffsetCalc<2> oc, int64_t n, double s) {
  using C = typename Compute<T>::type;
  const C sc = static_cast<C>(s);
  MINIDL_GRID_STRIDE(i, n) {
    int64_t off[2];
    oc.get(i, off);
    out[off[0]] = cvt<T>(apply_unary<C>(op, cvt<C>(x[off[1]]), sc));
  }
}

// out, a, b contiguous of n elements (out may alias a: each element is read before it is written
// by the same thread, so no __restrict__ here).
template <typename T>
__global__ void binary_vec_kernel(BinaryOp op, T* out, const T* a, const T* b, int64_t n, double alpha) {
  using C = typename Compute<T>::type;
  constexpr int V = vec_width<T>();
  const C al = static_cast<C>(alpha);
  const int64_t nv = n / V;
  MINIDL_GRID_STRIDE(i, nv) {
    const Vec<T, V> x = reinterpret_cast<const Vec<T, V>*>(a)[i];
    const Vec<T, V> y = reinterpret_cast<const Vec<T, V>*>(b)[i];
    Vec<T, V> r;
#pragma unroll
    for (int k = 0; k < V; ++k) r.v[k] = cvt<T>(apply_arith<C>(op, cvt<C>(x.v[k]), cvt<C>(y.v[k]), al));
    reinterpret_cast<Vec<T, V>*>(out)[i] = r;
  }
  MINIDL_GRID_STRIDE(j, n - nv * V) {
    const int64_t i = nv * V + j;
    out[i] = cvt<T>(apply_arith<C>(op, cvt<C>(a[i]), cvt<C>(b[i]), al));
  }
}

// a and out contiguous, b a single value (tensor op scalar, the optimizers' common case).
template <typename T>
__global__ void binary_scalar_vec_kernel(BinaryOp op, T* out, const T* a, const T* b, int64_t n, double alpha) {
  using C = typename Compute<T>::type;
  constexpr int V = vec_width<T>();
  const C al = static_cast<C>(alpha);
  const C y = cvt<C>(*b);
  const int64_t nv = n / V;
  MINIDL_GRID_STRIDE(i, nv) {
    const Vec<T, V> x = reinterpret_cast<const Vec<T, V>*>(a)[i];
    Vec<T, V> r;
#pragma unroll
    for (int k = 0; k < V; ++k) r.v[k] = cvt<T>(apply_arith<C>(op, cvt<C>(x.v[k]), y, al));
    reinterpret_cast<Vec<T, V>*>(out)[i] = r;
  }
  MINIDL_GRID_STRIDE(j, n - nv * V) {
    const int64_t i = nv * V + j;
    out[i] = cvt<T>(apply_arith<C>(op, cvt<C>(a[i]), y, al));
  }
}

// Operands that are contiguous or broadcast along the innermost dim (in out's memory order), the
// rest strided: a channels-last gradient spread from [N, C, 1, 1] (the global average pool's
// backward, out [N][H][W][C] from g[N][C]) or a per-channel bias. A thread takes V elements of
// that dim: one offset calculation per vector, 16-byte accesses where the stride is 1 and one
// value where it is 0. binary_strided_kernel there did 64-bit divisions per element (210 µs for
// the pool's backward at ResNet-50's batch 256 on an H100). inner_vec_ok() decides.
template <typename T>
__global__ void binary_inner_vec_kernel(BinaryOp op, T* out, const T* a, const T* b, OffsetCalc<3> oc, int64_t nv,
                                        bool a_vec, bool b_vec, double alpha) {
  using C = typename Compute<T>::type;
  constexpr int V = vec_width<T>();
  const C al = static_cast<C>(alpha);
  MINIDL_GRID_STRIDE(i, nv) {
    int64_t off[3];
    oc.get(i * V, off);
    Vec<T, V> x, y, r;
    if (a_vec) {
      x = *reinterpret_cast<const Vec<T, V>*>(a + off[1]);
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) x.v[k] = a[off[1]];
    }
    if (b_vec) {
      y = *reinterpret_cast<const Vec<T, V>*>(b + off[2]);
    } else {
#pragma unroll
      for (int k = 0; k < V; ++k) y.v[k] = b[off[2]];
    }
#pragma unroll
    for (int k = 0; k < V; ++k) r.v[k] = cvt<T>(apply_arith<C>(op, cvt<C>(x.v[k]), cvt<C>(y.v[k]), al));
    *reinterpret_cast<Vec<T, V>*>(out + off[0]) = r;
  }
}

// Whether binary_inner_vec_kernel can take oc (operands out, a, b): out's innermost dim has stride
// 1 and a length that is a multiple of V; each operand's stride there is 1 (then every other stride
// is a multiple of V and the base is 16-byte aligned, so each vector is aligned) or 0.
bool inner_vec_ok(const OffsetCalc<3>& oc, const std::array<const void*, 3>& base, int V, bool& a_vec, bool& b_vec) {
  if (oc.ndim < 2) return false;   // one dim: the flat kernels, or the strided one
  const int in = oc.ndim - 1;
  if (oc.strides[in][0] != 1 || oc.sizes[in] % V != 0) return false;
  for (int k = 0; k < 3; ++k) {
    const int64_t st = oc.strides[in][k];
    if (st != 0 && st != 1) return false;
    if (st == 0) continue;
    if (!aligned16(base[static_cast<size_t>(k)])) return false;
    for (int d = 0; d < in; ++d)
      if (oc.strides[d][k] % V != 0) return false;
  }
  a_vec = oc.strides[in][1] == 1;
  b_vec = oc.strides[in][2] == 1;
  return true;
}

template <typename T>
__global__ void binary_strided_kernel(BinaryOp op, T* out, const T* a, const T* b, OffsetCalc<3> oc, int64_t n,
                                      double alpha) {
  using C = typename Compute<T>::type;
  const C al = static_cast<C>(alpha);
  MINIDL_GRID_STRIDE(i, n) {
    int64_t off[3];
    oc.get(i, off);
    out[off[0]] = cvt<T>(apply_arith<C>(op, cvt<C>(a[off[1]]), cvt<C>(b[off[2]]), al));
  }
}

template <typename T>
__global__ void compare_kernel(BinaryOp op, bool* out, const T* a, const T* b, OffsetCalc<3> oc, int64_t n) {
  using C = typename Compute<T>::type;
  MINIDL_GRID_STRIDE(i, n) {
    int64_t off[3];
    oc.get(i, off);
    out[off[0]] = apply_compare<C>(op, cvt<C>(a[off[1]]), cvt<C>(b[off[2]]));
  }
}

// ---- Host helpers ----

// Device-to-device copy of same-shape tensors on one device, any strides and dtypes.
void device_copy(const Tensor& src, const Tensor& dst) {
  DeviceContext& ctx = context_of(dst);
  const int64_t n = dst.numel();
  if (n == 0) return;
  const OffsetCalc<2> oc = make_elementwise_calc<2>(dst.shape(), {&dst.strides(), &src.strides()}, "copy");
  if (oc.contiguous() && src.dtype() == dst.dtype()) {
    MINIDL_CUDA_CHECK(cudaMemcpyAsync(dst.data_ptr(), src.data_ptr(), static_cast<size_t>(n) * dtype_size(dst.dtype()),
                                      cudaMemcpyDeviceToDevice, ctx.stream()));
    return;
  }
  if (cast_f32_16bit_vectorized(src, dst)) return;   // the autocast weight/activation casts
  dispatch_all(dst.dtype(), "copy", [&](auto dtag) {
    using D = decltype(dtag);
    dispatch_all(src.dtype(), "copy", [&](auto stag) {
      using S = decltype(stag);
      D* d = static_cast<D*>(dst.data_ptr());
      const S* s = static_cast<const S*>(src.data_ptr());
      if (oc.contiguous()) {
        MINIDL_LAUNCH_NOWAIT("copy", (copy_contig_kernel<D, S>), grid_for(n), kThreads, 0, ctx.stream(), d, s, n);
      } else {
        MINIDL_LAUNCH_NOWAIT("copy", (copy_strided_kernel<D, S>), grid_for(n), kThreads, 0, ctx.stream(), d, s, oc, n);
      }
    });
  });
}

}  // namespace

void CudaBackend::copy(const Tensor& src, const Tensor& dst) {
  MINIDL_CHECK(src.shape() == dst.shape(), "copy (cuda): shape mismatch ", shape_str(src.shape()), " vs ",
               shape_str(dst.shape()));
  if (dst.numel() == 0) return;
  const bool s_cuda = src.device().is_cuda(), d_cuda = dst.device().is_cuda();
  if (s_cuda && d_cuda) {
    MINIDL_CHECK(src.device() == dst.device(), "copy (cuda): copies between two GPUs (", src.meta(), " -> ",
                 dst.meta(), ") are not supported; go through the cpu");
    device_copy(src, dst);
    return;
  }
  if (d_cuda) {
    // Host -> device: make the host side contiguous in the target dtype (on the CPU), stage it
    // through pinned memory, and scatter on the device when the target is strided.
    DeviceContext& ctx = context_of(dst);
    Tensor h = src;
    if (!h.is_contiguous() || h.dtype() != dst.dtype()) {
      h = empty(src.shape(), {dst.dtype(), Device::cpu(), false});
      cpu::cpu_backend().copy(src, h);
    }
    const size_t bytes = static_cast<size_t>(dst.numel()) * dtype_size(dst.dtype());
    if (dst.is_contiguous()) {
      ctx.staging().to_device(dst.data_ptr(), h.data_ptr(), bytes, ctx.stream());
    } else {
      Tensor d = empty(dst.shape(), {dst.dtype(), dst.device(), false});
      ctx.staging().to_device(d.data_ptr(), h.data_ptr(), bytes, ctx.stream());
      device_copy(d, dst);
    }
    return;
  }
  MINIDL_CHECK(s_cuda, "copy (cuda): neither ", src.meta(), " nor ", dst.meta(), " is on a CUDA device");
  // Device -> host: gather (and convert) on the device first, then stage through pinned memory.
  DeviceContext& ctx = context_of(src);
  Tensor d = src;
  if (!d.is_contiguous() || d.dtype() != dst.dtype()) {
    d = empty(src.shape(), {dst.dtype(), src.device(), false});
    device_copy(src, d);
  }
  const size_t bytes = static_cast<size_t>(dst.numel()) * dtype_size(dst.dtype());
  if (dst.is_contiguous()) {
    ctx.staging().to_host(dst.data_ptr(), d.data_ptr(), bytes, ctx.stream());
  } else {
    Tensor h = empty(dst.shape(), {dst.dtype(), Device::cpu(), false});
    ctx.staging().to_host(h.data_ptr(), d.data_ptr(), bytes, ctx.stream());
    cpu::cpu_backend().copy(h, dst);
  }
}

void CudaBackend::fill(const Tensor& dst, double value) {
  check_cuda("fill", {&dst});
  const int64_t n = dst.numel();
  if (n == 0) return;
  DeviceContext& ctx = context_of(dst);
  const OffsetCalc<1> oc = make_elementwise_calc<1>(dst.shape(), {&dst.strides()}, "fill");
  dispatch_all(dst.dtype(), "fill", [&](auto tag) {
    using T = decltype(tag);
    T v;
    if constexpr (std::is_same_v<T, __half>) {
      v = __half_raw{Half::from_float(static_cast<float>(value))};   // the CPU's rounding, bit for bit
    } else if constexpr (std::is_same_v<T, __nv_bfloat16>) {
      v = __nv_bfloat16_raw{BFloat16::from_float(static_cast<float>(value))};
    } else if constexpr (std::is_same_v<T, bool>) {
      v = value != 0.0;
    } else {
      v = static_cast<T>(value);
    }
    MINIDL_LAUNCH_NOWAIT("fill", (fill_strided_kernel<T>), grid_for(n), kThreads, 0, ctx.stream(),
                         static_cast<T*>(dst.data_ptr()), v, oc, n);
  });
}

void CudaBackend::unary(UnaryOp op, const Tensor& x, const Tensor& out, double scalar) {
  check_cuda(unary_name(op), {&x, &out});
  MINIDL_CHECK(x.shape() == out.shape() && x.dtype() == out.dtype(), unary_name(op), " (cuda): x ", x.meta(),
               " and out ", out.meta(), " must match");
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceContext& ctx = context_of(out);
  const OffsetCalc<2> oc = make_elementwise_calc<2>(out.shape(), {&out.strides(), &x.strides()}, unary_name(op));
  dispatch_floating(x.dtype(), unary_name(op), [&](auto tag) {
    using T = decltype(tag);
    T* o = static_cast<T*>(out.data_ptr());
    const T* a = static_cast<const T*>(x.data_ptr());
    if (oc.contiguous() && aligned16(o) && aligned16(a)) {
      MINIDL_LAUNCH_NOWAIT(unary_name(op), (unary_vec_kernel<T>), grid_for(n / vec_width<T>() + 1), kThreads, 0,
                           ctx.stream(), op, o, a, n, scalar);
    } else {
      MINIDL_LAUNCH_NOWAIT(unary_name(op), (unary_strided_kernel<T>), grid_for(n), kThreads, 0, ctx.stream(), op, o, a,
                           oc, n, scalar);
    }
  });
}

void CudaBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out, double alpha) {
  check_cuda(binary_name(op), {&a, &b, &out});
  MINIDL_CHECK(a.shape() == out.shape() && b.shape() == out.shape() && a.dtype() == b.dtype(), binary_name(op),
               " (cuda): operands ", a.meta(), " and ", b.meta(), " must be expanded to out ", out.meta(),
               " with one dtype");
  const int64_t n = out.numel();
  if (n == 0) return;
  DeviceContext& ctx = context_of(out);
  const OffsetCalc<3> oc =
      make_elementwise_calc<3>(out.shape(), {&out.strides(), &a.strides(), &b.strides()}, binary_name(op));
  if (op >= BinaryOp::Eq) {
    MINIDL_CHECK(out.dtype() == DType::boolean, binary_name(op), " (cuda): comparisons write bool, got ", out.meta());
    dispatch_all(a.dtype(), binary_name(op), [&](auto tag) {
      using T = decltype(tag);
      MINIDL_LAUNCH_NOWAIT(binary_name(op), (compare_kernel<T>), grid_for(n), kThreads, 0, ctx.stream(), op,
                           static_cast<bool*>(out.data_ptr()), static_cast<const T*>(a.data_ptr()),
                           static_cast<const T*>(b.data_ptr()), oc, n);
    });
    return;
  }
  MINIDL_CHECK(out.dtype() == a.dtype(), binary_name(op), " (cuda): out ", out.meta(), " must have dtype ",
               dtype_name(a.dtype()));
  // b is one value broadcast everywhere when all its strides are 0.
  bool b_scalar = true;
  for (int64_t d = 0; d < b.dim(); ++d) b_scalar = b_scalar && (b.strides()[d] == 0 || b.shape()[d] == 1);
  const OffsetCalc<2> oa = make_elementwise_calc<2>(out.shape(), {&out.strides(), &a.strides()}, binary_name(op));
  dispatch_arith(a.dtype(), binary_name(op), [&](auto tag) {
    using T = decltype(tag);
    T* o = static_cast<T*>(out.data_ptr());
    const T* pa = static_cast<const T*>(a.data_ptr());
    const T* pb = static_cast<const T*>(b.data_ptr());
    const unsigned gv = grid_for(n / vec_width<T>() + 1);
    if (oc.contiguous() && aligned16(o) && aligned16(pa) && aligned16(pb)) {
      MINIDL_LAUNCH_NOWAIT(binary_name(op), (binary_vec_kernel<T>), gv, kThreads, 0, ctx.stream(), op, o, pa, pb, n,
                           alpha);
    } else if (b_scalar && oa.contiguous() && aligned16(o) && aligned16(pa)) {
      MINIDL_LAUNCH_NOWAIT(binary_name(op), (binary_scalar_vec_kernel<T>), gv, kThreads, 0, ctx.stream(), op, o, pa, pb,
                           n, alpha);
    } else if (bool av = false, bv = false; inner_vec_ok(oc, {o, pa, pb}, vec_width<T>(), av, bv)) {
      const int64_t nv = n / vec_width<T>();
      MINIDL_LAUNCH_NOWAIT(binary_name(op), (binary_inner_vec_kernel<T>), grid_for(nv), kThreads, 0, ctx.stream(), op,
                           o, pa, pb, oc, nv, av, bv, alpha);
    } else {
      MINIDL_LAUNCH_NOWAIT(binary_name(op), (binary_strided_kernel<T>), grid_for(n), kThreads, 0, ctx.stream(), op, o,
                           pa, pb, oc, n, alpha);
    }
  });
}

}  // namespace minidl::cuda
