// Define-by-run reverse-mode autograd. Every differentiable op records a Node whose backward is a
// closure over the tensors it saved; backward() runs the nodes in dependency order, accumulates
// into leaves' .grad, and releases the closures (and so the saved tensors) unless the graph is
// retained. A second backward through a released graph throws instead of reading freed memory.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/scoped_flag.h"
#include "core/tensor.h"

namespace minidl {

struct Edge {
  std::shared_ptr<Node> fn;
  uint32_t input_nr = 0;
};

class Node {
 public:
  // Tears down long chains iteratively (a 100k-op graph must not overflow the stack).
  virtual ~Node();
  virtual std::string name() const = 0;
  // grads: one per forward output (undefined where no gradient reached it).
  // Returns one gradient per next edge (undefined where the input needs none).
  virtual std::vector<Tensor> apply(const std::vector<Tensor>& grads) = 0;
  virtual void release_saved() {}

  std::vector<Edge> next_edges;
  uint32_t num_outputs = 1;
  uint64_t sequence_nr = 0;  // creation order: later nodes run first among the ready ones
};

// Gradient mode: ops record nodes only while it is on (thread-local, on by default).
bool grad_enabled();
class NoGradGuard : ScopedFlag {
 public:
  NoGradGuard();
};

// Re-enables grad mode inside a backward (which runs under NoGradGuard): checkpoint's backward
// reruns its function with recording on, the way PyTorch's reentrant checkpoint does.
class EnableGradGuard : ScopedFlag {
 public:
  EnableGradGuard();
};

// True while checkpoint's backward reruns a forward (thread-local). Ops with side effects that
// must happen once per real forward (batch-norm running statistics, num_batches_tracked) skip
// them while it is set, so recomputation leaves the model's buffers exactly as without it.
bool recomputing();
class RecomputeGuard : ScopedFlag {
 public:
  RecomputeGuard();
};

// Turns the leaves' post-accumulate-grad hooks off on this thread for its scope. A backward that
// only measures (recomputation's chain profile, nn/recompute_profile.h) must not tell the hooks'
// owners that a gradient is ready: DataParallel would start averaging a bucket, and count the
// real backward's gradients as a second one of the same step.
bool grad_hooks_enabled();
class GradHooksOffGuard : ScopedFlag {
 public:
  GradHooksOffGuard();
};

// The backward of one op. Capture saved tensors *detached* (t.detach()) so a node never owns the
// tensor that owns it; the closure is destroyed when the graph is released.
using BackwardFn = std::function<std::vector<Tensor>(const std::vector<Tensor>& grads)>;

// True when grad mode is on and any input requires grad: the op must then call record().
bool needs_grad(std::initializer_list<const Tensor*> inputs);
bool needs_grad(const std::vector<Tensor>& inputs);

// Makes `outputs` results of a differentiable op named `name` over `inputs` (undefined inputs
// allowed: they get no gradient). `fn` returns one gradient per input, in order. Does nothing when
// no input requires grad or grad mode is off.
void record(const char* name, const std::vector<Tensor>& inputs, const std::vector<Tensor>& outputs,
            BackwardFn fn);

// Inside a backward function (run_backward): the gradient already waiting for input `input` of
// the running op, when another use of the same tensor delivered it first and nothing else holds
// it (its storage is its own, dense, not a view). The backward may then add its own gradient into
// it in place and return that same tensor for the input: the engine, seeing its own tensor come
// back, adds nothing (a convolution's data gradient added by cuDNN as it is computed, beta = 1,
// instead of a separate add that reads both and writes a third buffer). Undefined otherwise, and
// outside a backward.
Tensor pending_grad(size_t input);

// Runs backward from `roots` with the given gradients (same shapes).
void run_backward(const std::vector<Tensor>& roots, const std::vector<Tensor>& grads, bool retain_graph);

}  // namespace minidl
