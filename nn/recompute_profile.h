// Measures the numbers the `optimal` recomputation planner needs (nn/recompute_plan.h) on a real
// batch: per chain link, forward and backward time and the bytes its graph keeps for backward,
// from the allocator's statistics and steady_clock timers (DESIGN.md "Recomputation").
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/tensor.h"
#include "nn/recompute_plan.h"
#include "nn/resnet.h"

namespace minidl::nn {

struct ChainProfile {
  std::vector<std::string> names;   // the links' names ("stem", "layer1.0", ..., "head")
  std::vector<ChainStage> stages;   // one per link, in order
  int64_t input_bytes = 0;          // the chain's input (a_0 of the model)
  Shape input_shape;
  DType input_dtype = DType::f32;
};

// Runs each link once on the activation the previous link produced from `x`, after one warm-up
// forward+backward of that link, and measures (times in seconds, bytes from the allocator):
//   forward_time / backward_time: the forward with grad on; the backward of its output with a
//     gradient of ones (run_backward; parameter gradients included).
//   output_bytes: the bytes of the link's output storage.
//   saved_bytes: allocated bytes added by the forward, less the output unless the graph keeps the
//     output's storage (a final ReLU saves it): what the link's graph holds for backward. The
//     input is not counted (it was allocated before); its owner (the previous link's graph, or a
//     checkpoint) counts it.
//   param_grad_bytes: the link's parameter gradients its backward makes (they start absent, as
//     after zero_grad, which drops them).
//   backward_extra_bytes: the backward's peak above the bytes live before it, its input's
//     gradient and param_grad_bytes (intermediate gradients, weight-gradient temporaries).
// The model is left as it was: batch-norm running statistics are not updated (RecomputeGuard),
// parameter gradients are put back as they were, and every generator drawn from (dropout) is
// returned to its state. Each link's graph is released before the next link runs, so profiling
// needs about one link's memory, not the whole chain's. On CUDA each time includes a device sync.
// It resets the allocator's peak statistics (reset_peak_stats) to measure the backwards.
ChainProfile profile_chain(const std::vector<ChainLink>& links, const Tensor& x);

// Modelled instead of measured link times: forward time proportional to the bytes the link
// writes (its output and what it saves), backward twice that. Always so on the meta device, which
// computes nothing; switched on for a real device by a program that compares a dry run with a
// measured step (minidl-memest), so that both plan alike. Process-wide, off by default.
void set_modelled_link_times(bool on);
bool modelled_link_times();

}  // namespace minidl::nn
