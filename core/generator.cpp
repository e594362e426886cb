// The default generator and offset bookkeeping for the counter-based random streams.
#include "core/generator.h"

#include <utility>

namespace minidl {

void Generator::manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mu_);
  seed_ = seed;
  offset_ = 0;
}
uint64_t Generator::seed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return seed_;
}
uint64_t Generator::offset() const {
  std::lock_guard<std::mutex> lock(mu_);
  return offset_;
}
void Generator::set_offset(uint64_t offset) {
  std::lock_guard<std::mutex> lock(mu_);
  offset_ = offset;
}
namespace {
thread_local ReserveObserver t_observer;
}  // namespace

ReserveObserver set_reserve_observer(ReserveObserver observer) {
  std::swap(t_observer, observer);
  return observer;
}

uint64_t Generator::reserve(uint64_t num_elements) {
  uint64_t start = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    start = offset_;
    offset_ += philox::counters_for(num_elements);
  }
  if (t_observer) t_observer(*this, start);
  return start;
}

Generator& default_generator() {
  static Generator g(0);
  return g;
}
void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace minidl
