// The temporary memory of the CPU convolution (conv.cpp), as the kernels themselves size it: a
// shape-only dry run of a training step asks this to reproduce the CPU backend's peak memory
// exactly, kernel workspaces included (every block goes through the allocator, rounded by it).
#pragma once
#include <cstdint>
#include <vector>

#include "core/backend.h"
#include "core/dtype.h"
#include "core/tensor.h"

namespace minidl::cpu {

enum class ConvPass { Forward, BackwardInput, BackwardWeight };

// Bytes of each block one CPU convolution pass allocates, in allocation order, for input x,
// weight w and output y (the same shapes as the kernel's arguments) of dtype f32, f64 or f16, with
// the calling thread's OpenMP thread count (omp_get_max_threads(), as the kernel reads it). All
// blocks are live together while the pass runs and are freed when it returns; nothing else is
// allocated. For f16 the f32 copies of the result and the operands come first (the copies of the
// operands in an order C++ leaves unspecified); has_bias: the forward pass has an f16 bias to widen.
std::vector<int64_t> conv2d_workspace_bytes(ConvPass pass, const Shape& x, const Shape& w, const Shape& y,
                                            const Conv2dOptions& o, DType dtype, bool has_bias = false);

}  // namespace minidl::cpu
