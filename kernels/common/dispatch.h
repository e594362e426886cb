// Dtype dispatch shared by the CPU and CUDA backends: which dtypes a kernel family takes, and what a
// refused dtype's message says, are written once. The backends differ only in their 16-bit float
// types (Half and BFloat16 on the CPU, __half on the GPU), template parameters here, so this header
// needs no CUDA.
#pragma once
#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "core/error.h"

namespace minidl::common {

// The dtypes a kernel takes: every one, the floating ones (f32, f64 and the 16-bit floats the
// backend has), or those with arithmetic (floating and i32, i64).
enum class DTypeFamily { All, Floating, Arith };

// dispatch(t, op, f) calls f(T{}) with T the C++ type of dtype t when t is in Family, and throws
// "op (backend): ..." naming the family otherwise. HalfT and BF16T are the backend's f16 and bf16
// types, or void for a backend without kernels for it or kernels that widen 16-bit operands to f32
// before they dispatch (the dtype is then refused).
// A constant object rather than a function, so a backend names its dispatchers in one line each.
template <typename HalfT, DTypeFamily Family, typename BF16T = void>
struct Dispatch {
  const char* backend;   // "cpu" or "cuda"

  template <typename F>
  void operator()(DType t, const char* op, F&& f) const {
    switch (t) {
      case DType::f32: return call<float>(t, op, f);
      case DType::f64: return call<double>(t, op, f);
      case DType::f16: return call<HalfT>(t, op, f);
      case DType::bf16: return call<BF16T>(t, op, f);
      case DType::i32: return call<int32_t>(t, op, f);
      case DType::i64: return call<int64_t>(t, op, f);
      case DType::u8: return call<uint8_t>(t, op, f);
      case DType::boolean: return call<bool>(t, op, f);
    }
    refuse(t, op);
  }

 private:
  // Whether the family takes the C++ type T (void: a backend without code for that 16-bit float).
  template <typename T>
  static constexpr bool takes() {
    if constexpr (std::is_void_v<T>) return false;
    else if constexpr (std::is_floating_point_v<T> || std::is_same_v<T, HalfT> || std::is_same_v<T, BF16T>) return true;
    else if constexpr (std::is_same_v<T, int32_t> || std::is_same_v<T, int64_t>) return Family != DTypeFamily::Floating;
    else return Family == DTypeFamily::All;
  }

  template <typename T, typename F>
  void call(DType t, const char* op, F& f) const {
    if constexpr (takes<T>()) f(T{});
    else refuse(t, op);
  }

  [[noreturn]] void refuse(DType t, const char* op) const {
    constexpr bool half = !std::is_void_v<HalfT>, bf16 = !std::is_void_v<BF16T>;
    const bool lacks = (t == DType::f16 && !half) || (t == DType::bf16 && !bf16);
    const char* wanted = Family == DTypeFamily::All ? (lacks ? "a dtype it has kernels for" : "a tensor of a known dtype")
                         : Family == DTypeFamily::Arith
                             ? (half && bf16 ? "a numeric tensor (f32, f64, f16, bf16, i32 or i64)"
                                : half       ? "a numeric tensor (f32, f64, f16, i32 or i64)"
                                             : "a numeric tensor (f32, f64, i32 or i64)")
                         : half && bf16 ? "a floating tensor (f32, f64, f16 or bf16)"
                         : half         ? "a floating tensor (f32, f64 or f16)"
                                        : "a floating tensor (f32 or f64)";
    MINIDL_FAIL(op, " (", backend, "): needs ", wanted, ", got ", dtype_name(t), "; convert with .to(DType::f32)");
  }
};

}  // namespace minidl::common
