// A convolution case as the channels-last suites (tests/kernels/channels_last_test.cpp on the CPU,
// channels_last_cuda_test.cpp against the GPU) write it: input and weight shapes, and one stride
// and padding for both axes, with the options and the name of a case at a dtype in one place.
#pragma once
#include <cstdint>
#include <string>

#include "core/ops.h"
#include "core/tensor.h"

namespace minidl::testing {

struct ConvShapeCase {
  Shape x, w;
  int64_t stride, pad;

  Conv2dOptions opts() const { return {.stride = {stride, stride}, .padding = {pad, pad}}; }
  std::string tag(DType dt) const { return shape_str(x) + " * " + shape_str(w) + " " + dtype_name(dt); }
};

}  // namespace minidl::testing
