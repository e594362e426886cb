// Entry points of kernels/cuda/amp.cu used by the other CUDA families: the vectorised f32<->f16
// casts that the copy kernel takes for contiguous, 16-byte aligned operands.
#pragma once
#include "core/tensor.h"

namespace minidl::cuda {

// dst = src converted, when the pair is f32->f16 or f16->f32, both contiguous and 16-byte
// aligned, on one CUDA device; returns false (nothing done) otherwise.
bool cast_f32_f16_vectorized(const Tensor& src, const Tensor& dst);

}  // namespace minidl::cuda
