// The user-facing face of recomputation: pick a mode by name ("none", "stages",
// "sequential:N", "optimal") and run a ResNet's forward with it. The experiment harness calls only
// this; checkpoint(), run_chain(), the profiler and the planner are the parts underneath.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/tensor.h"
#include "nn/recompute_plan.h"
#include "nn/recompute_profile.h"
#include "nn/resnet.h"

namespace minidl::nn {

struct RecomputeMode {
  // None: plain forward. Stages: stem, layer1..layer4 each one checkpoint (the head is kept).
  // Sequential: the block chain (ResNet::chain()) in `segments` equal checkpointed segments.
  // Optimal: the block chain planned by solve_optimal from a profile of the first batch.
  enum class Kind { None, Stages, Sequential, Optimal } kind = Kind::None;
  int segments = 0;  // for Sequential
  // "none", "stages", "sequential:N" (N >= 1), "optimal"; anything else throws naming the forms.
  static RecomputeMode parse(const std::string& s);
  std::string str() const;  // the same spelling parse() reads
};

// run_chain segment ids from planner modes (keep-all -> -1, a keep-input stage and the
// keep-nothing stages after it -> one id) and back. Throws on a keep-nothing stage with no
// keep-input stage before it.
std::vector<int> segments_from_modes(const std::vector<StageMode>& modes);
std::vector<StageMode> modes_from_segments(const std::vector<int>& segments);

class Recomputer {
 public:
  // memory_limit_bytes: for optimal, the memory the step may use in the planner's model
  // (nn/recompute_plan.h: the input batch, activations, saved tensors, activation gradients,
  // backward temporaries and the parameter gradients the backward makes; not parameters,
  // optimizer state or gradients left from an earlier micro-batch). 0: derived at the first
  // forward from the device's memory budget, 90% of (budget - reserved bytes) plus the input
  // batch (the 10% margin absorbs what the model leaves out); with no budget, everything is kept.
  Recomputer(ResNet& model, RecomputeMode mode, int64_t memory_limit_bytes = 0);

  // The model's forward with the mode applied. With grad mode off it is the plain forward. For
  // optimal, the first call with an input shape and dtype profiles the chain on x and solves the
  // plan; when the limit is below the least peak any plan reaches, the least-memory plan is used
  // (the allocator then decides) and describe() says so. A smaller batch of a shape already
  // planned (an epoch's partial batch) runs that larger batch's plan, without a profile of its
  // own: under a fixed plan every tensor of the smaller batch is smaller, so it fits wherever the
  // larger batch's step fitted, which a plan of its own need not (it would keep more, up to the
  // limit, and the model leaves workspaces and the allocator's blocks out). Under a memory
  // budget a new plan is rehearsed first: a forward and backward of the chain on x that changes
  // nothing in the model. When the rehearsal runs out of memory (the model leaves workspaces and
  // the allocator's blocks out), the plan is solved again under a limit lowered by the shortfall
  // or 5% of its predicted peak, whichever is more, kLowerings times, then as the least-memory
  // plan, whose failure is the step's OutOfMemoryError. The plans of the last
  // kPlannedShapes shapes are kept: an epoch's partial batch and the full batch after it switch
  // plans without a new profile (which runs every link twice).
  Tensor forward(const Tensor& x);
  static constexpr size_t kPlannedShapes = 4;
  static constexpr int kLowerings = 3;

  // Optimal: a new limit (bytes > 0, or 0 to derive it from the budget); after the first
  // forward the plan is solved again from the same profile (no new profile), and a kept plan of
  // another shape is solved again when that shape comes back.
  void set_memory_limit(int64_t bytes);

  // Optimal: drops the kept plans, so that the next forward plans its batch as a run's first
  // would, profile and all (minidl-maxbatch's trials: one stands for a run at its batch, whatever
  // batches the trials before it tried).
  void forget_plans() { planned_.clear(); }

  const RecomputePlan* plan() const;           // optimal only, after the first forward
  const ChainProfile* profile() const;         // optimal only, after the first forward
  int64_t profiles() const { return profiles_; }   // optimal: the chain profiles taken so far
  std::string describe() const;                // the printable plan with predicted peak (or the mode)
  const RecomputeMode& mode() const { return mode_; }
  int64_t memory_limit() const;                // optimal: the limit the plan was solved for
  const std::vector<ChainLink>& links() const { return links_; }
  const std::vector<int>& segments() const;    // run_chain ids over links()

 private:
  // Optimal: one shape's profile and the plan solved from it.
  struct Planned {
    Shape shape;                    // the input it serves: the profile's, or a smaller batch's
    ChainProfile profile;
    RecomputePlan plan, keep_all;   // keep_all: the none plan under the same profile, for comparison
    std::vector<int> segments;
    int64_t limit = 0;              // the limit the plan was solved for
    int64_t limit_arg = 0;          // limit_arg_ when it was solved
    bool below_least_peak = false;
    bool rehearsed = false;         // its forward and backward ran on its batch (rehearse_chain)
    int lowered = 0;                // times its limit was lowered after a rehearsal ran out of memory
    bool borrowed() const { return shape != profile.input_shape; }   // a smaller batch's, the profile's plan
    bool serves(const Tensor& x) const { return shape == x.shape() && profile.input_dtype == x.dtype(); }
  };
  const Planned* current() const { return planned_.empty() ? nullptr : &planned_.back(); }
  void replan(const Tensor& x);
  void keep(Planned p);   // becomes the current plan; the least recently used one leaves past kPlannedShapes
  void solve(Planned& p, const MemoryStats& ms);  // p's plan for limit_arg_ (or the budget)
  void solve_under(Planned& p, int64_t limit);    // p's plan for `limit`, not rehearsed yet
  void rehearse(const Tensor& x);   // the current plan's rehearsal on x, lowering it (forward())
  // Optimal: makes x's shape and dtype the current plan: a kept one (solved again when the limit
  // changed since), or a new profile, the least recently used plan making room for it.
  void switch_plan(const Tensor& x);

  ResNet& model_;
  RecomputeMode mode_;
  Device device_ = Device::cpu();  // where the profiled batch lives (its allocator's budget)
  int64_t limit_arg_ = 0;
  std::vector<ChainLink> links_;
  std::vector<int> segments_;      // stages and sequential
  int64_t profiles_ = 0;
  std::vector<Planned> planned_;   // optimal: the last kPlannedShapes shapes' plans, the current one last
};

}  // namespace minidl::nn
