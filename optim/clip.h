// Gradient clipping by the global norm of all gradients, exactly as torch.nn.utils.clip_grad_norm_:
// large-batch and warmup runs rely on it to survive early loss spikes. Call it once per optimizer
// step, after the gradient scaler has unscaled the gradients (clipping scaled gradients is wrong).
#pragma once
#include <functional>
#include <vector>

#include "core/tensor.h"

namespace minidl::optim {

// Computes the norm of all gradients together (as if concatenated into one vector): the p-norm
// for finite norm_type > 0, the largest |g| for norm_type = +infinity. When the total norm exceeds
// max_norm, every gradient is multiplied in place by max_norm / (total_norm + 1e-6); otherwise they
// are left untouched. Parameters without a gradient are skipped (0 is returned when none has one).
// Returns the total norm before clipping. A non-finite total norm (inf/NaN gradients) throws only
// when error_if_nonfinite is set (PyTorch's default is false: the gradients are then scaled by a
// NaN/0 coefficient just as PyTorch does, and the caller is expected to skip the step).
// Runs without recording autograd, with minidl ops on the gradients' device (one host sync).
// `reduce_total`, when given, maps this process's total norm to the one to clip with (data-parallel
// training makes it the same on every rank); it is called exactly once, also when no parameter has
// a gradient (with 0), so every rank joins the collective inside it.
double clip_grad_norm(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0,
                      bool error_if_nonfinite = false, const std::function<double(double)>& reduce_total = {});

// clip_grad_norm with no host read, for a step captured in a CUDA graph: the total norm and the
// clip factor stay on the gradients' device, and every gradient is multiplied by
// min(1, max_norm / (total + 1e-6)) (NaN when that is NaN), which leaves the gradients bit for bit
// as clip_grad_norm does (a gradient times 1 is itself). Returns the total norm, a 0-dim f64 on the
// first gradient's device (undefined when no parameter has a gradient). Without clip_grad_norm's
// error_if_nonfinite and reduce_total, which need the norm on the host.
Tensor clip_grad_norm_device(const std::vector<Tensor>& params, double max_norm, double norm_type = 2.0);

}  // namespace minidl::optim
