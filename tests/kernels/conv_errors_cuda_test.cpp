// conv2d's device check needs a tensor on each device, so it lives with the CUDA tests: kernels_cuda
// on a GPU, kernels_cuda_emu on the emulated device (docs/cuda/emulator.md).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "core/backend.h"
#include "core/ops.h"
#include "tests/support/error_of.h"

namespace minidl {
namespace {

using ::minidl::testing::error_of;
using ::testing::HasSubstr;

TEST(ConvErrors, DeviceMismatch) {
  if (!cuda_available()) GTEST_SKIP() << "needs a CUDA device to build a cross-device pair";
  Tensor x = zeros({1, 2, 5, 5});
  Tensor w = zeros({3, 2, 3, 3}).to(Device::cuda());
  EXPECT_THAT(error_of([&] { conv2d(x, w); }), HasSubstr("conv2d: weight is on cuda"));
  EXPECT_THAT(error_of([&] { conv2d(x, w); }), HasSubstr("but input is on cpu"));
}

}  // namespace
}  // namespace minidl
