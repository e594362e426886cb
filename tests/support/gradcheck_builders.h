// The pieces both gradient-check files share (tests/core/gradcheck_test.cpp for the tensor-level
// ops, gradcheck_nn_test.cpp for the network ops): the EXPECT_GRADCHECK macro that prints the
// checker's message on failure, and the plain f64 input builder most checks start from.
#pragma once
#include <cstdint>

#include <gtest/gtest.h>

#include "core/tensor.h"
#include "tests/support/gradcheck.h"

#define EXPECT_GRADCHECK(...)                                          \
  do {                                                                 \
    const auto gc_result_ = ::minidl::testing::gradcheck(__VA_ARGS__); \
    EXPECT_TRUE(gc_result_.ok) << gc_result_.message;                  \
  } while (0)

namespace minidl::testing {

inline Tensor plain(const Shape& s, uint64_t seed) { return rand_f64(s, seed); }

}  // namespace minidl::testing
