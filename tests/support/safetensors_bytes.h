// Hand-made safetensors bytes for the tests of the two readers that must refuse malformed files:
// nn's loader (tests/nn/safetensors_test.cpp) and the golden files' own reader
// (tests/kernels/golden_test.cpp): the 8-byte length, a header padded as the writer pads it, raw
// f32 data, and the check that an error names the file and says what is wrong.
#pragma once
#include <gtest/gtest.h>

#include <cstdint>
#include <cstring>
#include <functional>
#include <initializer_list>
#include <string>

#include "core/error.h"

namespace minidl::testing {

inline std::string le64(uint64_t n) {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[i] = static_cast<char>((n >> (8 * i)) & 0xffu);
  return out;
}

// A file from a header and a data section, the header padded as the writer pads it.
inline std::string with_header(std::string header, const std::string& data) {
  header.append((8 - header.size() % 8) % 8, ' ');
  return le64(header.size()) + header + data;
}

inline std::string floats(std::initializer_list<float> v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), std::data(v), s.size());
  return s;
}

// A malformed file of one header and a data section, and a piece of the error it must raise.
struct BadFile {
  std::string name, header, data, fragment;
};

// Expects read(path) to throw an Error whose message names path and holds fragment.
inline void expect_read_error(const std::function<void(const std::string&)>& read, const std::string& path,
                              const std::string& fragment) {
  try {
    read(path);
    ADD_FAILURE() << "reading " << path << " did not throw (expected: " << fragment << ")";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find(path), std::string::npos) << "message does not name the file: " << msg;
    EXPECT_NE(msg.find(fragment), std::string::npos) << "message lacks '" << fragment << "': " << msg;
  }
}

}  // namespace minidl::testing
