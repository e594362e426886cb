// The device the *_cuda_test suites compare against the CPU, in one place. With
// MINIDL_PARITY_SELF_TEST=1 it is the CPU itself: the suites then run CPU against CPU, which checks
// the tests (front-end calls, shapes, tolerances) without a GPU, so GPU time goes to the kernels.
#pragma once
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/backend.h"
#include "core/device.h"

namespace minidl::testing {

inline bool parity_self_test() {
  const char* e = std::getenv("MINIDL_PARITY_SELF_TEST");
  return e != nullptr && std::string(e) == "1";
}

// cuda:0, or the CPU in self-test mode.
inline Device parity_target() { return parity_self_test() ? Device::cpu() : Device::cuda(0); }

// The fixture of a suite that compares parity_target() against the CPU and needs nothing set on
// the device first (parity_helpers.h's Parity also pins the CUDA math modes): it skips without a
// GPU, except in self-test mode, where the target is the CPU. A suite names it with `using`.
class CudaTargetTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!parity_self_test() && !cuda_available()) GTEST_SKIP() << "no CUDA device";
  }
};

}  // namespace minidl::testing
