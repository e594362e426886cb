// Out-of-line pieces of the error family: message formatting with file:line.
#include "core/error.h"

#include <cstdio>

namespace minidl {

std::string format_bytes(size_t bytes) {
  char buf[96];
  const double b = static_cast<double>(bytes);
  if (bytes >= (1ull << 30)) {
    std::snprintf(buf, sizeof buf, "%.2f GiB (%zu bytes)", b / (1ull << 30), bytes);
  } else if (bytes >= (1ull << 20)) {
    std::snprintf(buf, sizeof buf, "%.2f MiB (%zu bytes)", b / (1ull << 20), bytes);
  } else if (bytes >= (1ull << 10)) {
    std::snprintf(buf, sizeof buf, "%.2f KiB (%zu bytes)", b / (1ull << 10), bytes);
  } else {
    std::snprintf(buf, sizeof buf, "%zu bytes", bytes);
  }
  return buf;
}

namespace detail {
void throw_error(const char* file, int line, const std::string& msg) {
  std::string f = file;
  // Keep paths short and stable: from the project folder down.
  for (const char* root : {"/core/", "/kernels/", "/nn/", "/optim/", "/data/", "/experiments/", "/tests/"}) {
    const auto pos = f.rfind(root);
    if (pos != std::string::npos) {
      f = f.substr(pos + 1);
      break;
    }
  }
  throw Error(msg + " [" + f + ":" + std::to_string(line) + "]");
}
}  // namespace detail

}  // namespace minidl
