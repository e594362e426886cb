// Shared by the experiments suite: a tiny configuration that trains in well under a second, a
// private temporary folder per test, and the path of the built programs (beside the test exe).
#pragma once
#include <unistd.h>

#include <filesystem>
#include <string>

#include <gtest/gtest.h>

#include "experiments/harness/config.h"

namespace minidl::harness::testing {

// The small CNN on 8x8 synthetic images, 16/8/8 per class, one epoch, batch 8.
inline TrainConfig tiny_config() {
  TrainConfig c;
  c.model = "smallcnn";
  c.image_size = 8;
  c.split = "16,8,8";
  c.epochs = 1;
  c.batch_size = 8;
  c.quiet = true;
  c.synthetic_difficulty = 0.2;
  return c;
}

inline std::filesystem::path temp_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  auto dir = std::filesystem::temp_directory_path() /
             ("minidl-exp-" + std::string(info->test_suite_name()) + "-" + info->name() + "-" +
              std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

// A program built into the same bin folder as this test executable.
inline std::filesystem::path program(const std::string& name) {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path() / name;
}

// Runs a shell command; returns its exit status (or -1).
inline int run_status(const std::string& cmd) {
  const int s = std::system((cmd + " > /dev/null 2>&1").c_str());
  return WIFEXITED(s) ? WEXITSTATUS(s) : -1;
}

}  // namespace minidl::harness::testing
