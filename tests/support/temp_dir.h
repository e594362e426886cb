// The per-test folder of the suites that write files (tests/nn/safetensors_test.cpp,
// device_move_cuda_test.cpp): emptied first, so leftovers (a .tmp file) are attributable to the
// test that made them; the same path on every run, so runs do not pile up folders (tests differ in
// name, so ctest -j is safe).
#pragma once
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace minidl::testing {

// gtest's temporary folder / `suite` / `name`, empty.
inline std::filesystem::path fresh_dir(const std::string& suite, const std::string& name) {
  const std::filesystem::path dir = std::filesystem::path(::testing::TempDir()) / suite / name;
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

}  // namespace minidl::testing
