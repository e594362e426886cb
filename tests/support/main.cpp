// Test entry point shared by every suite: prints once whether CUDA cases will run, so a CI log
// says why they were skipped.
#include <gtest/gtest.h>

#include <cstdio>

#include "core/backend.h"
#ifdef MINIDL_CUDA_EMU
#include "cuda_emu/runtime_state.h"

namespace {
// A kernel fault on the emulated device is sticky, as on a GPU: every later runtime call of the
// process fails. One test process runs many tests, so each starts on a fresh device, as a new
// process would, and one test's fault is reported by that test alone.
class FreshEmulatedDevice : public ::testing::EmptyTestEventListener {
  void OnTestEnd(const ::testing::TestInfo&) override { minidl::cuda::emu::clear_device_fault(); }
};
}  // namespace
#endif

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
#ifdef MINIDL_CUDA_EMU
  ::testing::UnitTest::GetInstance()->listeners().Append(new FreshEmulatedDevice);
#endif
  if (!minidl::cuda_available()) {
    std::printf("[minidl] no usable CUDA device (%s): CUDA cases skip\n",
                minidl::cuda_built() ? "built with CUDA" : "built without CUDA");
  }
  return RUN_ALL_TESTS();
}
