// f16 on the CPU: the reference for every f16 path, so mixed precision is testable without a GPU.
// Elementwise ops and reductions read f16, compute in f32 (sums in double) and store f16; the heavy
// families (GEMM, convolution, pooling, batch norm, softmax) widen their f16 operands to f32
// temporaries, run the f32 kernel unchanged and narrow the result: slow but exact to one rounding.
#pragma once
#include <type_traits>

#include "core/dtype.h"
#include "core/tensor.h"

namespace minidl::cpu {

// The arithmetic type of a storage type: f16 computes in f32, everything else in itself (so the
// f32 and f64 loops are the same code as before f16 existed).
template <typename T>
using compute_t = std::conditional_t<std::is_same_v<T, Half>, float, T>;

// Calls f(T{}) for f32, f64 and f16.
template <typename F>
void dispatch_float_half(DType t, const char* op, F&& f) {
  switch (t) {
    case DType::f32: f(float{}); return;
    case DType::f64: f(double{}); return;
    case DType::f16: f(Half{}); return;
    default:
      MINIDL_FAIL(op, ": needs a floating tensor (f32, f64 or f16) on the CPU, got ", dtype_name(t),
                  "; convert with .to(DType::f32)");
  }
}

inline bool is_half(const Tensor& t) { return t.defined() && t.dtype() == DType::f16; }

// A contiguous f32 copy of an f16 tensor (through the allocator, so memory statistics see it);
// any other tensor, or an undefined one, is returned as it is.
Tensor widen_half(const Tensor& t);
// An f32 tensor of t's shape to compute into when t is f16; t itself otherwise.
Tensor f32_output_for(const Tensor& t);
// Writes an f32 result back into its f16 destination (nothing when they are the same tensor).
void narrow_into(const Tensor& result, const Tensor& dst);

}  // namespace minidl::cpu
