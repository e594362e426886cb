// The one exception family of minidl. MINIDL_CHECK builds messages that name the op, the shapes
// and the fix, with file:line, so a user sees what went wrong without a debugger.
#pragma once
#include <cstdint>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

namespace minidl {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& msg) : std::runtime_error(msg) {}
};

// Thrown when a request would exceed the memory budget or the device is out of memory.
class OutOfMemoryError : public Error {
 public:
  OutOfMemoryError(const std::string& msg, size_t requested, size_t in_use, size_t budget)
      : Error(msg), requested_(requested), in_use_(in_use), budget_(budget) {}
  size_t requested() const { return requested_; }
  size_t in_use() const { return in_use_; }
  size_t budget() const { return budget_; }

 private:
  size_t requested_, in_use_, budget_;
};

// Every size minidl prints, in one style: binary units, one decimal ("1.5 GiB", "12.3 MiB",
// "4.0 KiB", "100 bytes"). Tables give their unit in the column header and the same one decimal.
std::string format_bytes(size_t bytes);

namespace detail {
template <typename T>
void append(std::ostringstream& os, const std::vector<T>& v) {
  os << '[';
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  os << ']';
}
template <typename T>
void append(std::ostringstream& os, const T& v) { os << v; }

template <typename... Args>
std::string concat(const Args&... args) {
  std::ostringstream os;
  (append(os, args), ...);
  return os.str();
}
[[noreturn]] void throw_error(const char* file, int line, const std::string& msg);
}  // namespace detail

}  // namespace minidl

#define MINIDL_CHECK(cond, ...)                                                      \
  do {                                                                               \
    if (!(cond)) {                                                                   \
      ::minidl::detail::throw_error(__FILE__, __LINE__, ::minidl::detail::concat(__VA_ARGS__)); \
    }                                                                                \
  } while (0)

#define MINIDL_FAIL(...) ::minidl::detail::throw_error(__FILE__, __LINE__, ::minidl::detail::concat(__VA_ARGS__))
