// A file's whole text, for tests that read what a program wrote or what the sources say.
#pragma once
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

namespace minidl::testing {

// The file's whole text ("" when it cannot be read).
inline std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::ostringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

}  // namespace minidl::testing
