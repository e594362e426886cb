// Which generators a stretch of code draws from, and their states before its first draw: what
// checkpoint() needs to replay a forward's random draws exactly, and what the recompute profile
// needs to leave every generator where training had it. One recorder serves both.
#pragma once
#include <cstdint>
#include <utility>
#include <vector>

#include "core/generator.h"

namespace minidl::nn::detail {

// One generator's state before the first draw from it.
struct GeneratorState {
  Generator* gen = nullptr;
  uint64_t seed = 0;
  uint64_t offset = 0;
};

// Puts a generator at a recorded state; manual_seed resets the offset, so it runs only when the
// seed differs.
inline void set_generator_state(const GeneratorState& s) {
  if (s.gen->seed() != s.seed) s.gen->manual_seed(s.seed);
  s.gen->set_offset(s.offset);
}

// Records, while alive (or until stop()), the state of every generator drawn from on this thread
// (at its first reserve), on top of the default generator's state at the start. Chains to an
// outer observer (a checkpoint inside a checkpoint's rerun).
class DrawRecorder {
 public:
  DrawRecorder() {
    states_.push_back({&default_generator(), default_generator().seed(), default_generator().offset()});
    prev_ = set_reserve_observer([this](Generator& g, uint64_t start) {
      note(g, start);
      if (prev_) prev_(g, start);
    });
  }
  ~DrawRecorder() { stop(); }
  DrawRecorder(const DrawRecorder&) = delete;
  DrawRecorder& operator=(const DrawRecorder&) = delete;

  // Gives the outer observer back; later draws are not recorded.
  void stop() {
    if (!stopped_) set_reserve_observer(std::move(prev_));
    stopped_ = true;
  }
  const std::vector<GeneratorState>& states() const { return states_; }

 private:
  void note(Generator& g, uint64_t start) {
    for (const GeneratorState& s : states_) {
      if (s.gen == &g) return;
    }
    states_.push_back({&g, g.seed(), start});
  }
  std::vector<GeneratorState> states_;
  ReserveObserver prev_;
  bool stopped_ = false;
};

}  // namespace minidl::nn::detail
