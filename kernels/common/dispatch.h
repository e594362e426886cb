// Dtype dispatch shared by the CPU and CUDA backends: which dtypes a kernel family takes, and what a
// refused dtype's message says, are written once. The backends differ only in their f16 type (Half
// on the CPU, __half on the GPU), a template parameter here, so this header needs no CUDA.
#pragma once
#include <cstdint>
#include <type_traits>

#include "core/dtype.h"
#include "core/error.h"

namespace minidl::common {

// The dtypes a kernel takes: every one, the floating ones (f32, f64 and f16), or those with
// arithmetic (floating and i32, i64).
enum class DTypeFamily { All, Floating, Arith };

// dispatch(t, op, f) calls f(T{}) with T the C++ type of dtype t when t is in Family, and throws
// "op (backend): ..." naming the family otherwise. HalfT is the backend's f16 type, or void for
// kernels that widen f16 operands to f32 before they dispatch (f16 is then refused).
// A constant object rather than a function, so a backend names its dispatchers in one line each.
template <typename HalfT, DTypeFamily Family>
struct Dispatch {
  const char* backend;   // "cpu" or "cuda"

  template <typename F>
  void operator()(DType t, const char* op, F&& f) const {
    constexpr bool ints = Family != DTypeFamily::Floating, others = Family == DTypeFamily::All;
    switch (t) {
      case DType::f32: f(float{}); return;
      case DType::f64: f(double{}); return;
      case DType::f16:
        if constexpr (!std::is_void_v<HalfT>) {
          f(HalfT{});
          return;
        }
        break;
      case DType::i32:
        if constexpr (ints) {
          f(int32_t{});
          return;
        }
        break;
      case DType::i64:
        if constexpr (ints) {
          f(int64_t{});
          return;
        }
        break;
      case DType::u8:
        if constexpr (others) {
          f(uint8_t{});
          return;
        }
        break;
      case DType::boolean:
        if constexpr (others) {
          f(bool{});
          return;
        }
        break;
    }
    refuse(t, op);
  }

 private:
  [[noreturn]] void refuse(DType t, const char* op) const {
    constexpr bool half = !std::is_void_v<HalfT>;
    const char* wanted = Family == DTypeFamily::All        ? "a tensor of a known dtype"
                         : Family == DTypeFamily::Arith   ? (half ? "a numeric tensor (f32, f64, f16, i32 or i64)"
                                                                  : "a numeric tensor (f32, f64, i32 or i64)")
                         : half                            ? "a floating tensor (f32, f64 or f16)"
                                                           : "a floating tensor (f32 or f64)";
    MINIDL_FAIL(op, " (", backend, "): needs ", wanted, ", got ", dtype_name(t), "; convert with .to(DType::f32)");
  }
};

}  // namespace minidl::common
