// Parsing and printing of devices ("cpu", "cuda", "cuda:1", "meta:cpu"), used by every --device flag.
#include "core/device.h"

#include "core/error.h"

namespace minidl {

Device Device::parse(const std::string& s) {
  if (s == "cpu") return cpu();
  if (s == "cuda") return cuda(0);
  if (s == "meta" || s == "meta:cpu") return meta(DeviceType::CPU);
  if (s == "meta:cuda") return meta(DeviceType::CUDA);
  if (s.rfind("cuda:", 0) == 0 && s.size() > 5) {
    int idx = 0;
    for (size_t i = 5; i < s.size(); ++i) {
      MINIDL_CHECK(s[i] >= '0' && s[i] <= '9', "invalid device '", s, "': expected cpu, cuda, cuda:N or meta:cpu|cuda");
      idx = idx * 10 + (s[i] - '0');
    }
    return cuda(idx);
  }
  MINIDL_FAIL("invalid device '", s, "': expected cpu, cuda, cuda:N or meta:cpu|cuda");
}

std::string Device::str() const {
  if (is_cpu()) return "cpu";
  if (is_meta()) return target() == DeviceType::CUDA ? "meta:cuda" : "meta:cpu";
  return "cuda:" + std::to_string(index);
}

}  // namespace minidl
