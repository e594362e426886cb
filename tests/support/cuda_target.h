// The device the *_cuda_test suites compare against the CPU, in one place. With
// MINIDL_PARITY_SELF_TEST=1 it is the CPU itself: the suites then run CPU against CPU, which checks
// the tests (front-end calls, shapes, tolerances) without a GPU, so GPU time goes to the kernels.
#pragma once
#include <cstdlib>
#include <string>

#include "core/device.h"

namespace minidl::testing {

inline bool parity_self_test() {
  const char* e = std::getenv("MINIDL_PARITY_SELF_TEST");
  return e != nullptr && std::string(e) == "1";
}

// cuda:0, or the CPU in self-test mode.
inline Device parity_target() { return parity_self_test() ? Device::cpu() : Device::cuda(0); }

}  // namespace minidl::testing
