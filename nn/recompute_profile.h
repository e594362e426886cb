// Measures the numbers the `optimal` recomputation planner needs (nn/recompute_plan.h) on a real
// batch: per chain link, the bytes its graph keeps for backward, from the allocator's statistics,
// and its forward and backward times, modelled from those bytes (DESIGN.md "Recomputation"; why
// modelled: profile_chain below).
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
// forward+backward of that link, and measures (bytes from the allocator):
//   forward_time / backward_time: modelled, not timed. The forward's time: 1 s per 10 GB the link
//     writes (its output and what it saves) plus 1 s per 10^12 flops of its convolutions and
//     matrix products (core/flop_count.h), a GPU's balance of arithmetic and memory traffic to an
//     order of magnitude; the backward's twice that. So a link of many channels on small images
//     costs more to recompute per byte it saves than one of few channels on large images, as it
//     does on a GPU. A plan must be a function of the shapes and the limit alone: the same in the
//     dry run (the meta device computes nothing to time), in minidl-maxbatch's trials and in the
//     run, on every machine and in every process. Measured times are noisy from one process to
//     the next, and two plans under the same limit reach different real peaks (workspaces, the
//     allocator's blocks): a batch the trial fitted could then run out of memory in the run.
//   output_bytes: the bytes of the link's output storage.
//   saved_bytes: allocated bytes added by the forward, less the output unless the graph keeps the
//     output's storage (a final ReLU saves it): what the link's graph holds for backward. The
//     input is not counted (it was allocated before); its owner (the previous link's graph, or a
//     checkpoint) counts it.
//   param_grad_bytes: the link's parameter gradients its backward makes (they start absent, as
//     after zero_grad, which drops them).
//   backward_extra_bytes: the backward's peak above the bytes live before it, its input's
//     gradient and param_grad_bytes (intermediate gradients, weight-gradient temporaries).
// The warm-up makes what a link allocates at its first call only (a library's handle or workspace
// cache) before the bytes are counted. The model is left as it was: batch-norm running statistics
// are not updated (RecomputeGuard), parameter gradients are put back as they were, no gradient
// hook runs (GradHooksOffGuard: a data-parallel run averages the step's gradients, not the
// profile's), and every generator drawn from (dropout) is returned to its state. Each link's graph
// is released before the next link runs, so profiling needs about one link's memory, not the
// whole chain's. It resets the allocator's peak statistics (reset_peak_stats) to measure the
// backwards.
ChainProfile profile_chain(const std::vector<ChainLink>& links, const Tensor& x);

// One forward and backward of the chain under a plan's segments (run_chain ids) on x, as the
// training step runs them, leaving the model as profile_chain leaves it. It runs out of memory
// where the step would (Recomputer::forward tries a new plan with it before the step uses it).
void rehearse_chain(const std::vector<ChainLink>& links, const Tensor& x, const std::vector<int>& segments);

}  // namespace minidl::nn
