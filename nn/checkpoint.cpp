// checkpoint() and the chain runners of nn/checkpoint.h. The rerun happens inside the outer
// backward (a nested, re-entrant run_backward), which is what lets parameters that the recorded
// node does not list still receive their gradients.
#include "nn/checkpoint.h"

#include <algorithm>
#include <memory>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/generator.h"
#include "core/ops.h"
#include "nn/generator_draws.h"

namespace minidl::nn {
namespace {

using detail::DrawRecorder;
using detail::GeneratorState;
using detail::set_generator_state;

// Puts every recorded generator at its recorded state for its lifetime, then back where it was.
class GeneratorReplay {
 public:
  explicit GeneratorReplay(const std::vector<GeneratorState>& states) {
    for (const GeneratorState& s : states) {
      prev_.push_back({s.gen, s.gen->seed(), s.gen->offset()});
      set_generator_state(s);
    }
  }
  ~GeneratorReplay() {
    for (size_t i = prev_.size(); i-- > 0;) set_generator_state(prev_[i]);
  }
  GeneratorReplay(const GeneratorReplay&) = delete;
  GeneratorReplay& operator=(const GeneratorReplay&) = delete;

 private:
  std::vector<GeneratorState> prev_;
};

}  // namespace

Tensor checkpoint(const std::function<Tensor(const Tensor&)>& fn, const Tensor& input) {
  MINIDL_CHECK(fn != nullptr, "checkpoint: the function is empty");
  if (!grad_enabled()) return fn(input);

  const bool amp = autocast_enabled();  // the rerun uses the forward's precision, as PyTorch's
  const DType amp_dtype = autocast_dtype();
  Tensor out;
  std::vector<GeneratorState> draws;
  {
    DrawRecorder recorder;
    NoGradGuard no_grad;
    out = fn(input);
    draws = recorder.states();
  }
  MINIDL_CHECK(out.defined(), "checkpoint: the function returned an undefined tensor");
  // A fresh handle: fn may return its input itself (identity, eval-mode dropout), and record()
  // must not give the caller's input a grad_fn.
  out = out.detach();

  const Tensor saved = input.defined() ? input.detach() : Tensor();
  const bool input_requires_grad = input.defined() && input.requires_grad();
  // The node must exist even when the input needs no gradient (fn's parameters may): a private
  // anchor leaf that requires grad makes record() create it; it never receives a gradient.
  Tensor anchor;
  if (!input_requires_grad) anchor = zeros({0}).set_requires_grad(true);
  std::function<Tensor(const Tensor&)> fn_copy = fn;
  record("checkpoint", {input_requires_grad ? input : anchor}, {out},
         [fn_copy, saved, input_requires_grad, draws, amp, amp_dtype](const std::vector<Tensor>& g) {
           if (!g[0].defined()) return std::vector<Tensor>(1);
           Tensor leaf;
           if (saved.defined()) {
             leaf = saved.detach();
             if (input_requires_grad) leaf.set_requires_grad(true);
           }
           Tensor rerun;
           {
             GeneratorReplay replay(draws);
             AutocastGuard autocast(amp_dtype, amp);
             RecomputeGuard recompute;
             EnableGradGuard grad_on;
             rerun = fn_copy(leaf);
           }
           if (rerun.requires_grad()) run_backward({rerun}, {g[0]}, /*retain_graph=*/false);
           if (!input_requires_grad) return std::vector<Tensor>(1);
           return std::vector<Tensor>{leaf.grad()};
         });
  return out;
}

Tensor run_chain(const std::vector<ChainLink>& links, const Tensor& x, const std::vector<int>& segment_of_link) {
  MINIDL_CHECK(segment_of_link.empty() || segment_of_link.size() == links.size(), "run_chain: ",
               segment_of_link.size(), " segment ids for ", links.size(), " links; give one per link (or none)");
  Tensor h = x;
  size_t i = 0;
  while (i < links.size()) {
    const int seg = segment_of_link.empty() ? -1 : segment_of_link[i];
    if (seg < 0) {
      h = links[i].run(h);
      ++i;
      continue;
    }
    size_t end = i + 1;
    while (end < links.size() && segment_of_link[end] == seg) ++end;
    // By value: the backward node reruns these after the caller's `links` may be gone.
    std::vector<std::function<Tensor(const Tensor&)>> runs;
    for (size_t k = i; k < end; ++k) runs.push_back(links[k].run);
    h = checkpoint(
        [runs](const Tensor& in) {
          Tensor t = in;
          for (const auto& run : runs) t = run(t);
          return t;
        },
        h);
    i = end;
  }
  return h;
}

Tensor run_chain(const std::vector<ChainLink>& links, const Tensor& x, const std::vector<bool>& checkpointed) {
  MINIDL_CHECK(checkpointed.size() == links.size(), "run_chain: ", checkpointed.size(), " flags for ", links.size(),
               " links; give one per link");
  std::vector<int> seg(links.size(), -1);
  for (size_t i = 0; i < links.size(); ++i) {
    if (checkpointed[i]) seg[i] = static_cast<int>(i);
  }
  return run_chain(links, x, seg);
}

std::vector<int> sequential_segments(size_t n_links, int N) {
  std::vector<int> seg(n_links, -1);
  if (n_links == 0) return seg;
  const size_t n = std::clamp<size_t>(N < 1 ? 1 : static_cast<size_t>(N), 1, n_links);
  const size_t base = n_links / n;
  const size_t extra = n_links % n;
  size_t i = 0;
  for (size_t s = 0; s < n; ++s) {
    const size_t len = base + (s < extra ? 1 : 0);
    for (size_t k = 0; k < len; ++k) seg[i++] = static_cast<int>(s);
  }
  return seg;
}

}  // namespace minidl::nn
