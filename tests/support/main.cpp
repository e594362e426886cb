// Test entry point shared by every suite: prints once whether CUDA cases will run, so a CI log
// says why they were skipped.
#include <gtest/gtest.h>

#include <cstdio>

#include "core/backend.h"

int main(int argc, char** argv) {
  ::testing::InitGoogleTest(&argc, argv);
  if (!minidl::cuda_available()) {
    std::printf("[minidl] no usable CUDA device (%s): CUDA cases skip\n",
                minidl::cuda_built() ? "built with CUDA" : "built without CUDA");
  }
  return RUN_ALL_TESTS();
}
