// The pure-f16 mode (Apex O3 with batch norm kept in f32): weights, activations, gradients and the
// optimizer's math all in f16, the largest batch a model can reach, with the stability risk the
// mixed-precision study reports; and the same in bf16, which needs no gradient scaler (f32's
// exponent range) but keeps 8 bits of mantissa in the weights. Mixed precision proper (f32
// masters) needs no module change: it is core/autocast.h (plus optim/grad_scaler.h for f16).
#pragma once
#include "nn/module.h"

namespace minidl::nn {

// Converts, in place, every floating parameter and buffer of every module except BatchNorm2d to
// `dtype` (f16 or bf16; handles stay valid and parameters stay leaves requiring grad, as
// Module::to). Batch-norm layers keep f32 weight, bias and running statistics: they take the 16-bit
// activations and return them in that dtype, and their statistics accumulate in f32. Returns the
// number of tensors converted.
int64_t to_pure(Module& model, DType dtype);
inline int64_t to_pure_f16(Module& model) { return to_pure(model, DType::f16); }
inline int64_t to_pure_bf16(Module& model) { return to_pure(model, DType::bf16); }

}  // namespace minidl::nn
