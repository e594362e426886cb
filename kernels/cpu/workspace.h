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
#include "kernels/cpu/conv_workspace.h"

namespace minidl::cpu {

// The convolution's scratch: conv2d_workspace_bytes (conv_workspace.h, from the planners the
// kernels size their scratch with).

// Whether the GEMM copies a (first) and b (second) to contiguous memory before multiplying: an
// operand whose matrices are neither row- nor column-major with unit stride. a [B,M,K], b [B,K,N].
std::pair<bool, bool> matmul_operand_copies(const Tensor& a, const Tensor& b);

// batch_norm.cpp: the fused batch norm's (batch_norm_relu, batch_norm_add_relu) operands as its
// loops read them, staged in this order: contiguous NCHW in their own dtype (f16 is read and
// written as f16, computed in f32); an output that is not contiguous gets a contiguous temporary,
// copied back (narrow_into) before the temporaries go. Undefined operands stay undefined; one that needs no staging is itself.
struct BatchNormActForwardStage {
  Tensor x, y, residual;
};
BatchNormActForwardStage stage_batch_norm_act_forward(const Tensor& x, const Tensor& residual, const Tensor& y);
struct BatchNormActBackwardStage {
  Tensor gy, x, gx, y, gresidual;
};
BatchNormActBackwardStage stage_batch_norm_act_backward(const Tensor& gy, const Tensor& x, const Tensor& y,
                                                        const Tensor& gx, const Tensor& gresidual);
// The plain batch norm's operands, staged alike (its f16 ones after widening to f32).
struct BatchNormForwardStage {
  Tensor x, y;
};
BatchNormForwardStage stage_batch_norm_forward(const Tensor& x, const Tensor& y);
struct BatchNormBackwardStage {
  Tensor gy, x, gx;
};
BatchNormBackwardStage stage_batch_norm_backward(const Tensor& gy, const Tensor& x, const Tensor& gx);

}  // namespace minidl::cpu
