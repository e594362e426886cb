// Seeded random numbers that do not depend on thread count or device: a Generator hands out
// (seed, offset) ranges of a counter-based Philox stream; kernels compute element i from
// (seed, offset, i) alone. Saving (seed, offset) replays the same draws (checkpoint recompute).
#pragma once
#include <cstdint>
#include <functional>
#include <mutex>

#include "core/philox.h"

namespace minidl {

class Generator {
 public:
  explicit Generator(uint64_t seed = 0) : seed_(seed) {}
  void manual_seed(uint64_t seed);
  uint64_t seed() const;
  uint64_t offset() const;
  void set_offset(uint64_t offset);
  // Reserves enough Philox counters for n elements; returns the offset to start from.
  uint64_t reserve(uint64_t num_elements);

 private:
  mutable std::mutex mu_;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

Generator& default_generator();
void manual_seed(uint64_t seed);

// Sees every reserve() on this thread while installed: checkpoint learns which generators (the
// default one or private ones) a function draws from, so its rerun can replay all of them.
// Called outside the generator's lock with the offset the reserve started at.
using ReserveObserver = std::function<void(Generator& gen, uint64_t start_offset)>;
ReserveObserver set_reserve_observer(ReserveObserver observer);  // returns the previous one

}  // namespace minidl
