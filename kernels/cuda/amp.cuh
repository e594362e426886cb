// Entry points of kernels/cuda/amp.cu used by the other CUDA families: the vectorised casts between
// f32 and the 16-bit floats that the copy kernel takes for contiguous, 16-byte aligned operands.
#pragma once
#include "core/tensor.h"

namespace minidl::cuda {

// dst = src converted, when the pair is f32 -> f16 or bf16 or back, both contiguous and 16-byte
// aligned, on one CUDA device; returns false (nothing done) otherwise.
bool cast_f32_16bit_vectorized(const Tensor& src, const Tensor& dst);

}  // namespace minidl::cuda
