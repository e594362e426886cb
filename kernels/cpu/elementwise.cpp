// CPU elementwise kernels: copy with dtype conversion, fill, unary and binary ops over strided,
// broadcast operands. The inner loops are plain typed loops the compiler vectorises when strides
// are 1. f16 operands compute in f32 (compute_t) and round once on store.
#include <cmath>

#include "kernels/common/scalar_ops.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/strided.h"

namespace minidl::cpu {
namespace {

template <typename T>
inline T apply_unary(UnaryOp op, T x, double s) {
  switch (op) {
    case UnaryOp::Neg: return -x;
    case UnaryOp::Exp: return std::exp(x);
    case UnaryOp::Log: return std::log(x);
    case UnaryOp::Log1p: return std::log1p(x);
    case UnaryOp::Sqrt: return std::sqrt(x);
    case UnaryOp::Abs: return std::abs(x);
    case UnaryOp::Relu: return x > T(0) ? x : T(0);
    case UnaryOp::Sigmoid: return T(1) / (T(1) + std::exp(-x));
    case UnaryOp::Tanh: return std::tanh(x);
    case UnaryOp::Square: return x * x;
    case UnaryOp::Pow: return std::pow(x, static_cast<T>(s));
  }
  return x;
}

using common::apply_arith;     // kernels/common/scalar_ops.h, shared with the CUDA kernels
using common::apply_compare;

}  // namespace

void CpuBackend::copy(const Tensor& src, const Tensor& dst) {
  MINIDL_CHECK(src.device().is_cpu() && dst.device().is_cpu(), "copy: the CPU backend copies host tensors only (",
               src.meta(), " -> ", dst.meta(), ")");
  MINIDL_CHECK(src.shape() == dst.shape(), "copy: shape mismatch ", shape_str(src.shape()), " vs ",
               shape_str(dst.shape()));
  const auto plan = make_plan<2>(dst.shape(), {&dst.strides(), &src.strides()});
  dispatch_all(dst.dtype(), "copy", [&](auto dtag) {
    using D = decltype(dtag);
    dispatch_all(src.dtype(), "copy", [&](auto stag) {
      using S = decltype(stag);
      for_each_run<2>(plan, {static_cast<char*>(dst.data_ptr()), static_cast<char*>(src.data_ptr())},
                      {sizeof(D), sizeof(S)}, [](const std::array<char*, 2>& p, int64_t n, const std::array<int64_t, 2>& st) {
                        constexpr int64_t ED = sizeof(D), ES = sizeof(S);
                        if constexpr (std::is_same_v<D, float> && is_float16_v<S>) {
                          if (st[0] == ED && st[1] == ES) {
                            const auto* from = reinterpret_cast<const S*>(p[1]);
                            return half_to_float(from, reinterpret_cast<float*>(p[0]), n);
                          }
                        }
                        if constexpr (is_float16_v<D> && std::is_same_v<S, float>) {
                          if (st[0] == ED && st[1] == ES) {
                            const auto* from = reinterpret_cast<const float*>(p[1]);
                            return float_to_half(from, reinterpret_cast<D*>(p[0]), n);
                          }
                        }
                        char* d = p[0];
                        const char* s = p[1];
                        for (int64_t i = 0; i < n; ++i, d += st[0], s += st[1]) {
                          *reinterpret_cast<D*>(d) = convert<D>(*reinterpret_cast<const S*>(s));
                        }
                      });
    });
  });
}

void CpuBackend::fill(const Tensor& dst, double value) {
  const auto plan = make_plan<1>(dst.shape(), {&dst.strides()});
  dispatch_all(dst.dtype(), "fill", [&](auto tag) {
    using T = decltype(tag);
    const T v = convert<T>(value);
    for_each_run<1>(plan, {static_cast<char*>(dst.data_ptr())}, {sizeof(T)},
                    [v](const std::array<char*, 1>& p, int64_t n, const std::array<int64_t, 1>& st) {
                      if (st[0] == static_cast<int64_t>(sizeof(T))) {
                        T* d = reinterpret_cast<T*>(p[0]);
                        for (int64_t i = 0; i < n; ++i) d[i] = v;
                      } else {
                        char* d = p[0];
                        for (int64_t i = 0; i < n; ++i, d += st[0]) *reinterpret_cast<T*>(d) = v;
                      }
                    });
  });
}

void CpuBackend::unary(UnaryOp op, const Tensor& x, const Tensor& out, double scalar) {
  const auto plan = make_plan<2>(out.shape(), {&out.strides(), &x.strides()});
  dispatch_floating(x.dtype(), unary_name(op), [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    for_each_run<2>(plan, {static_cast<char*>(out.data_ptr()), static_cast<char*>(x.data_ptr())}, {sizeof(T), sizeof(T)},
                    [op, scalar](const std::array<char*, 2>& p, int64_t n, const std::array<int64_t, 2>& st) {
                      if (st[0] == static_cast<int64_t>(sizeof(T)) && st[1] == static_cast<int64_t>(sizeof(T))) {
                        T* o = reinterpret_cast<T*>(p[0]);
                        const T* a = reinterpret_cast<const T*>(p[1]);
                        switch (op) {  // hot ops get their own loop so they vectorise
                          case UnaryOp::Relu:
                            if constexpr (is_float16_v<T>) {
                              // On the bits, as the f32 loop decides: only x > 0 (positive, not NaN) passes.
                              for (int64_t i = 0; i < n; ++i) {
                                const uint16_t b = a[i].bits;
                                o[i].bits = (b != 0 && b <= T::kInfBits) ? b : uint16_t{0};
                              }
                            } else {
                              for (int64_t i = 0; i < n; ++i) o[i] = a[i] > T(0) ? a[i] : T(0);
                            }
                            return;
                          default:
                            for (int64_t i = 0; i < n; ++i) o[i] = T(apply_unary<C>(op, C(a[i]), scalar));
                            return;
                        }
                      }
                      char* o = p[0];
                      const char* a = p[1];
                      for (int64_t i = 0; i < n; ++i, o += st[0], a += st[1]) {
                        *reinterpret_cast<T*>(o) = T(apply_unary<C>(op, C(*reinterpret_cast<const T*>(a)), scalar));
                      }
                    });
  });
}

void CpuBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out, double alpha) {
  const auto plan = make_plan<3>(out.shape(), {&out.strides(), &a.strides(), &b.strides()});
  std::array<char*, 3> base{static_cast<char*>(out.data_ptr()), static_cast<char*>(a.data_ptr()),
                            static_cast<char*>(b.data_ptr())};
  if (op >= BinaryOp::Eq) {
    dispatch_all(a.dtype(), binary_name(op), [&](auto tag) {
      using T = decltype(tag);
      for_each_run<3>(plan, base, {sizeof(bool), sizeof(T), sizeof(T)},
                      [op](const std::array<char*, 3>& p, int64_t n, const std::array<int64_t, 3>& st) {
                        char* o = p[0];
                        const char* x = p[1];
                        const char* y = p[2];
                        for (int64_t i = 0; i < n; ++i, o += st[0], x += st[1], y += st[2]) {
                          using C = compute_t<T>;  // compare 16-bit floats as float
                          *reinterpret_cast<bool*>(o) = apply_compare<C>(op, static_cast<C>(*reinterpret_cast<const T*>(x)),
                                                                         static_cast<C>(*reinterpret_cast<const T*>(y)));
                        }
                      });
    });
    return;
  }
  auto arith = [&](auto tag) {
    using T = decltype(tag);
    using C = compute_t<T>;
    const C al = static_cast<C>(alpha);
    for_each_run<3>(plan, base, {sizeof(T), sizeof(T), sizeof(T)},
                    [op, al](const std::array<char*, 3>& p, int64_t n, const std::array<int64_t, 3>& st) {
                      constexpr int64_t E = sizeof(T);
                      T* o = reinterpret_cast<T*>(p[0]);
                      const T* x = reinterpret_cast<const T*>(p[1]);
                      const T* y = reinterpret_cast<const T*>(p[2]);
                      if (st[0] == E && st[1] == E && st[2] == E) {
                        switch (op) {  // the common contiguous cases get vectorisable loops
                          case BinaryOp::Add: for (int64_t i = 0; i < n; ++i) o[i] = T(C(x[i]) + al * C(y[i])); return;
                          case BinaryOp::Mul: for (int64_t i = 0; i < n; ++i) o[i] = T(C(x[i]) * C(y[i])); return;
                          case BinaryOp::ReluGrad:
                            for (int64_t i = 0; i < n; ++i) o[i] = C(y[i]) > C(0) ? x[i] : T(C(0));
                            return;
                          default:
                            for (int64_t i = 0; i < n; ++i) o[i] = T(apply_arith<C>(op, C(x[i]), C(y[i]), al));
                            return;
                        }
                      }
                      if (st[0] == E && st[1] == E && st[2] == 0) {  // tensor op scalar / broadcast row
                        const C yv = C(*y);
                        for (int64_t i = 0; i < n; ++i) o[i] = T(apply_arith<C>(op, C(x[i]), yv, al));
                        return;
                      }
                      char* po = p[0];
                      const char* px = p[1];
                      const char* py = p[2];
                      for (int64_t i = 0; i < n; ++i, po += st[0], px += st[1], py += st[2]) {
                        *reinterpret_cast<T*>(po) = T(apply_arith<C>(op, C(*reinterpret_cast<const T*>(px)),
                                                                     C(*reinterpret_cast<const T*>(py)), al));
                      }
                    });
  };
  dispatch_arith(a.dtype(), binary_name(op), arith);
}

}  // namespace minidl::cpu
