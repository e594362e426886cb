// The arithmetic of the convolutions and matrix products an op dispatches (2 flops a
// multiply-add), counted on the thread that runs them while a FlopCount lives there. What it is
// for: nn::profile_chain models a chain link's time from its bytes and its flops, the same on
// every device, the meta device included, which computes nothing it could time.
#pragma once
#include "core/non_copyable.h"

namespace minidl {

class FlopCount : NonCopyable {
 public:
  FlopCount();    // counts from zero; an enclosing FlopCount of the thread counts these flops too
  ~FlopCount();
  double flops() const { return flops_; }

 private:
  friend void count_flops(double);
  double flops_ = 0.0;
  FlopCount* outer_ = nullptr;
};

// What conv2d, conv2d_stats and the matrix products call with their flops (no-op without a count).
void count_flops(double flops);

}  // namespace minidl
