// The pure-f16 mode (Apex O3 with batch norm kept in f32): weights, activations, gradients and the
// optimizer's math all in f16, the largest batch a model can reach, with the stability risk the
// mixed-precision study reports. Mixed precision proper (f32 masters) needs no module change: it
// is core/autocast.h plus optim/grad_scaler.h.
#pragma once
#include "nn/module.h"

namespace minidl::nn {

// Converts, in place, every floating parameter and buffer of every module except BatchNorm2d to
// f16 (handles stay valid and parameters stay leaves requiring grad, as Module::to). Batch-norm
// layers keep f32 weight, bias and running statistics: they take the f16 activations and return
// f16, and their statistics accumulate in f32. Returns the number of tensors converted.
int64_t to_pure_f16(Module& model);

}  // namespace minidl::nn
