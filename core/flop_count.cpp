// FlopCount of core/flop_count.h: a thread's innermost count, linked to the ones around it.
#include "core/flop_count.h"

namespace minidl {
namespace {
thread_local FlopCount* t_count = nullptr;
}  // namespace

FlopCount::FlopCount() : outer_(t_count) { t_count = this; }
FlopCount::~FlopCount() { t_count = outer_; }

void count_flops(double flops) {
  for (FlopCount* c = t_count; c != nullptr; c = c->outer_) c->flops_ += flops;
}

}  // namespace minidl
