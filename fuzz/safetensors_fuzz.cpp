// libFuzzer target for the safetensors header parser: the one place minidl interprets bytes from
// untrusted files. Any input must end in success or minidl::Error; a crash, a sanitizer report or
// an unbounded allocation is a bug. Build: -DMINIDL_BUILD_FUZZ=ON with clang (see fuzz/CMakeLists.txt).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/error.h"
#include "nn/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The input is a whole file: the 8-byte length, the header, the data section. The length is
  // validated as load_safetensors does; a fuzzer spending its time on absurd lengths learns nothing.
  if (size < 8) return 0;
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | data[i];
  if (header_len > size - 8) return 0;
  const std::string_view header(reinterpret_cast<const char*>(data + 8), header_len);
  try {
    minidl::nn::detail::parse_safetensors_header(header, size - 8 - header_len, "<fuzz input>");
  } catch (const minidl::Error&) {
  }
  return 0;
}
