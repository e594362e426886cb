// Activation checkpointing (recomputation; DESIGN.md "Recomputation"): trade compute for
// memory by running a piece of the network without keeping its intermediates and rerunning it in
// backward. The mechanism here is the base the per-stage, sequential:N and optimal modes build on.
#pragma once
#include <cstddef>
#include <functional>
#include <vector>

#include "core/tensor.h"
#include "nn/resnet.h"

namespace minidl::nn {

// Runs fn(input) keeping only `input` (detached) and the (seed, offset) of every generator fn
// draws from: the default one and private ones (a Dropout built with its own Generator), which
// core's reserve observer reports while fn runs.
// With grad mode off it is just fn(input). Otherwise fn runs under NoGradGuard and one
// "checkpoint" node is recorded; its backward (like PyTorch's reentrant checkpoint):
//   - restores those generators' (seed, offset), so dropout draws repeat exactly,
//   - reruns fn with grad on, under RecomputeGuard (batch norm does not update its running
//     statistics or num_batches_tracked again), on a fresh leaf copy of the input,
//   - runs a nested backward from the rerun's output: the parameters used inside fn accumulate
//     their .grad through their own AccumulateGrad as usual, and the input's gradient is read from
//     the fresh leaf and returned to the outer graph,
//   - puts the generators back where they were, so later draws are unaffected.
// The node is recorded even when `input` does not require grad (it hangs off a private anchor
// leaf), since fn's parameters may: a stem whose input is the image still trains its weights.
// A private Generator fn draws from must outlive the backward (fn uses it again in the rerun).
// On the CPU the gradients are bit-identical to running fn directly.
Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input);

// Runs a chain of links (ResNet::stages() or chain()) in order. segment_of_link[i] < 0 runs link i
// normally (keeps everything); a maximal run of consecutive links with the same id >= 0 runs
// inside ONE checkpoint call (only the run's input is kept). An empty vector runs everything
// normally; otherwise it must have one entry per link.
Tensor run_chain(const std::vector<ChainLink>& links, const Tensor& x, const std::vector<int>& segment_of_link);
// Per-link flags: every checkpointed link is its own segment (the per-stage mode on stages()).
Tensor run_chain(const std::vector<ChainLink>& links, const Tensor& x, const std::vector<bool>& checkpointed);

// sequential:N: segment ids for n_links split into N contiguous segments of equal length (the
// first n_links % N segments get one extra link); every segment is checkpointed. N is clamped to
// [1, n_links].
std::vector<int> sequential_segments(size_t n_links, int N);

}  // namespace minidl::nn
