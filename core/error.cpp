// Out-of-line pieces of the error family: message formatting with file:line.
#include "core/error.h"

#include <cstdio>

namespace minidl {

std::string format_bytes(size_t bytes) {
  char buf[96];
  const double b = static_cast<double>(bytes);
  if (bytes >= (1ull << 30)) {
    std::snprintf(buf, sizeof buf, "%.1f GiB", b / (1ull << 30));
  } else if (bytes >= (1ull << 20)) {
    std::snprintf(buf, sizeof buf, "%.1f MiB", b / (1ull << 20));
  } else if (bytes >= (1ull << 10)) {
    std::snprintf(buf, sizeof buf, "%.1f KiB", b / (1ull << 10));
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
