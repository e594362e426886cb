// What CPU kernels allocate besides their outputs, from the same decisions the kernels take (they
// size their scratch with these functions): the meta device (kernels/meta) allocates exactly this,
// so a dry run's peak is the CPU's to the byte whatever the kernels' tiling becomes. A kernel that
// gains a temporary gets its function here.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "core/ops.h"
#include "core/tensor.h"

namespace minidl::cpu {

enum class ConvPass { Forward, BackwardInput, BackwardWeight };

// The element counts (of the compute dtype: f64 for f64, f32 otherwise) of the scratch tensors one
// call of the f32/f64 kernel allocates, in allocation order; all are alive until it returns.
// Shapes are the forward's x, w and y, as the backend receives them. The answer depends on the
// OpenMP thread count at the call, as the kernel's does. f16 operands are widened by the caller
// first (kernels/cpu/half.h), which is not counted here.
std::vector<int64_t> conv2d_scratch_elements(ConvPass pass, const Shape& x, const Shape& w, const Shape& y,
                                             const Conv2dOptions& o, DType dtype);

// Whether the GEMM copies a (first) and b (second) to contiguous memory before multiplying: an
// operand whose matrices are neither row- nor column-major with unit stride. a [B,M,K], b [B,K,N].
std::pair<bool, bool> matmul_operand_copies(const Tensor& a, const Tensor& b);

}  // namespace minidl::cpu
