// The one way tests capture a minidl::Error's message: the text, or "" when nothing was thrown
// (an empty string matches no expected substring, so a missing error can never pass a find()).
#pragma once
#include <functional>
#include <string>

#include "core/error.h"

namespace minidl::testing {

inline std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace minidl::testing
