// The check that a text (an error message, a program's output) says each of several things, in one
// assertion whose failure lists every part missing and shows the text once.
#pragma once
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace minidl::testing {

// Whether `text` (an error message, a program's output) holds every one of `parts`; a failure names
// each part missing and shows the whole text.
inline ::testing::AssertionResult holds_all(const std::string& text, const std::vector<std::string>& parts) {
  std::string missing;
  for (const std::string& p : parts) {
    if (text.find(p) == std::string::npos) missing += "\n  missing '" + p + "'";
  }
  if (missing.empty()) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << missing << "\nin: " << text;
}

}  // namespace minidl::testing
