// The scalar formulas of the binary elementwise ops, written once for the CPU reference and the
// CUDA kernels (compiled for the device too under nvcc, as core/philox.h is), so the two backends
// cannot drift apart on an edge case such as NaN in maximum. C is the arithmetic type (f16 computes
// in f32). The unary formulas stay per backend: they call each side's own libm.
#pragma once
#include <type_traits>

#include "core/backend.h"

#if defined(__CUDACC__)
#define MINIDL_HOST_DEVICE __host__ __device__ __forceinline__
#else
#define MINIDL_HOST_DEVICE inline
#endif

namespace minidl::common {

// a op b for the arithmetic ops (Add, Sub: b scaled by alpha first).
template <typename C>
MINIDL_HOST_DEVICE C apply_arith(BinaryOp op, C a, C b, C alpha) {
  switch (op) {
    case BinaryOp::Add: return a + alpha * b;
    case BinaryOp::Sub: return a - alpha * b;
    case BinaryOp::Mul: return a * b;
    case BinaryOp::Div: return a / b;
    case BinaryOp::Maximum:
      if constexpr (std::is_floating_point_v<C>) {
        if (a != a || b != b) return a + b;   // NaN (the one value unequal to itself) propagates, as PyTorch
      }
      return a > b ? a : b;
    case BinaryOp::Minimum:
      if constexpr (std::is_floating_point_v<C>) {
        if (a != a || b != b) return a + b;
      }
      return a < b ? a : b;
    case BinaryOp::ReluGrad: return b > C(0) ? a : C(0);
    default: return C(0);
  }
}

// a op b for the comparisons (Eq ... Ge), which write bool.
template <typename C>
MINIDL_HOST_DEVICE bool apply_compare(BinaryOp op, C a, C b) {
  switch (op) {
    case BinaryOp::Eq: return a == b;
    case BinaryOp::Ne: return a != b;
    case BinaryOp::Lt: return a < b;
    case BinaryOp::Le: return a <= b;
    case BinaryOp::Gt: return a > b;
    case BinaryOp::Ge: return a >= b;
    default: return false;
  }
}

}  // namespace minidl::common
