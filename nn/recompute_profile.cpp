// profile_chain of nn/recompute_profile.h. The profile must not disturb training (it runs on the
// first real batch of an `optimal` run), so everything it touches is put back: parameter
// gradients, generator offsets; batch-norm statistics are never updated (RecomputeGuard).
#include "nn/recompute_profile.h"

#include <algorithm>
#include <memory>
#include <utility>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/flop_count.h"
#include "core/generator.h"
#include "core/ops.h"
#include "nn/checkpoint.h"
#include "nn/generator_draws.h"

namespace minidl::nn {
namespace {

// Returns every generator drawn from on this thread during its lifetime (and the default one)
// to its state at the first draw.
class GeneratorRestorer {
 public:
  GeneratorRestorer() = default;
  ~GeneratorRestorer() {
    recorder_.stop();
    for (const detail::GeneratorState& s : recorder_.states()) detail::set_generator_state(s);
  }
  GeneratorRestorer(const GeneratorRestorer&) = delete;
  GeneratorRestorer& operator=(const GeneratorRestorer&) = delete;

 private:
  detail::DrawRecorder recorder_;
};

// Takes the parameters' .grad away for its lifetime (so the profile's backwards do not add to
// them) and gives them back at the end.
class GradStash {
 public:
  explicit GradStash(const std::vector<ChainLink>& links) {
    for (const ChainLink& l : links) {
      for (const auto& m : l.modules) {
        for (const Tensor& p : m->parameters()) {
          const bool seen = std::any_of(params_.begin(), params_.end(), [&](const Tensor& q) { return q.same(p); });
          if (seen) continue;
          params_.push_back(p);
          grads_.push_back(p.impl().grad);
          p.impl().grad.reset();
        }
      }
    }
  }
  // Bytes of the gradients the stashed parameters hold now (made since the last clear()).
  int64_t grad_bytes() const {
    int64_t n = 0;
    for (const Tensor& p : params_) {
      if (p.grad().defined()) n += static_cast<int64_t>(p.grad().storage()->nbytes());
    }
    return n;
  }
  void clear() {
    for (Tensor& p : params_) p.impl().grad.reset();
  }
  ~GradStash() {
    for (size_t i = 0; i < params_.size(); ++i) params_[i].impl().grad = grads_[i];
  }
  GradStash(const GradStash&) = delete;
  GradStash& operator=(const GradStash&) = delete;

 private:
  std::vector<Tensor> params_;
  std::vector<std::shared_ptr<TensorImpl>> grads_;
};

// What a measuring pass (the profile, a rehearsal) holds for its scope so that it leaves the model
// as it found it: generators, parameter gradients, running statistics (RecomputeGuard), gradient
// hooks; with grad mode on for its forwards.
struct LeaveModelAlone {
  explicit LeaveModelAlone(const std::vector<ChainLink>& links) : grads(links) {}
  GeneratorRestorer generators;
  GradStash grads;
  RecomputeGuard no_running_stats;
  GradHooksOffGuard no_hooks;   // DataParallel's buckets wait for the step's real backward
  EnableGradGuard grad_on;
};

// A link's modelled forward time: 1 s per 10 GB written plus 1 s per 10^12 flops of its
// convolutions and matrix products (recompute_profile.h).
double modelled_seconds(const ChainStage& st, double flops) {
  return static_cast<double>(st.output_bytes + st.saved_bytes) * 1e-10 + flops * 1e-12;
}

}  // namespace

ChainProfile profile_chain(const std::vector<ChainLink>& links, const Tensor& x) {
  MINIDL_CHECK(!links.empty(), "profile_chain: no links to profile");
  MINIDL_CHECK(x.defined(), "profile_chain: the input batch is undefined");
  ChainProfile prof;
  prof.input_shape = x.shape();
  prof.input_dtype = x.dtype();
  prof.input_bytes = static_cast<int64_t>(x.nbytes());
  const Device dev = x.device();

  LeaveModelAlone alone(links);
  GradStash& grads = alone.grads;

  Tensor h = x.detach();
  for (size_t i = 0; i < links.size(); ++i) {
    const ChainLink& link = links[i];
    // A private leaf copy of the input, so the warm-up's input gradient can be dropped.
    Tensor x_in = h.clone();
    h = Tensor();
    const bool input_grad = i > 0 || x.requires_grad();
    if (input_grad) x_in.set_requires_grad(true);
    {  // warm-up
      Tensor out = link.run(x_in);
      if (out.requires_grad()) run_backward({out}, {ones_like(out)}, false);
      x_in.zero_grad();
      grads.clear();
    }
    const int64_t before = memory_stats(dev).allocated_bytes;
    double flops = 0.0;
    Tensor out;
    {
      const FlopCount count;
      out = link.run(x_in);
      flops = count.flops();
    }
    const int64_t after = memory_stats(dev).allocated_bytes;
    // Only `out` and, if the graph saved it (a final ReLU does), the graph own its storage.
    const bool output_kept = out.storage().use_count() > 1;
    const int64_t out_bytes = static_cast<int64_t>(out.storage()->nbytes());

    ChainStage st;
    st.output_bytes = out_bytes;
    st.saved_bytes = std::max<int64_t>(0, after - before - (output_kept ? 0 : out_bytes));
    h = out.detach();
    if (out.requires_grad()) {
      const Tensor g = ones_like(out);
      const int64_t before_backward = memory_stats(dev).allocated_bytes;
      reset_peak_stats(dev);
      run_backward({out}, {g}, false);
      const int64_t peak = memory_stats(dev).peak_allocated_bytes;
      st.param_grad_bytes = grads.grad_bytes();
      const int64_t in_grad = x_in.grad().defined() ? static_cast<int64_t>(x_in.grad().storage()->nbytes()) : 0;
      st.backward_extra_bytes = std::max<int64_t>(0, peak - before_backward - in_grad - st.param_grad_bytes);
    }
    st.forward_time = modelled_seconds(st, flops);
    st.backward_time = 2.0 * st.forward_time;
    grads.clear();
    prof.names.push_back(link.name);
    prof.stages.push_back(st);
  }
  return prof;
}

void rehearse_chain(const std::vector<ChainLink>& links, const Tensor& x, const std::vector<int>& segments) {
  MINIDL_CHECK(x.defined(), "rehearse_chain: the input batch is undefined");
  const LeaveModelAlone alone(links);
  Tensor out = run_chain(links, x.detach(), segments);
  if (out.requires_grad()) run_backward({out}, {ones_like(out)}, false);
}

}  // namespace minidl::nn
