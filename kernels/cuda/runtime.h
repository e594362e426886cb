// Host-side queries of the CUDA runtime that the rest of minidl needs even before any kernel runs:
// whether a device is usable (any runtime error, e.g. an old driver, means no device).
#pragma once
#include <string>

namespace minidl::cuda {

int device_count();          // 0 on any error
std::string runtime_status();  // "2 devices" or the runtime's error string

}  // namespace minidl::cuda
