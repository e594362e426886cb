// libFuzzer target for the image decode wrapper (data/decode.cpp): JPEG through TurboJPEG, every
// other format through stb_image. Photo folders are untrusted input (the Microsoft download holds
// corrupt files); any bytes must end in an image or an error string, never a crash, a sanitizer
// report or an allocation past the pixel limit. Build: -DMINIDL_BUILD_FUZZ=ON with clang.
#include <cstddef>
#include <cstdint>

#include "data/decode.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // 4 Mpixel keeps each run fast; the limit logic is the same at 64.
  const minidl::data::DecodeResult r = minidl::data::decode_image(data, size, int64_t{4} << 20);
  if (r.ok()) {
    const auto& img = *r.image;
    // The contract the loader relies on: a successful decode is a whole RGB image.
    if (img.height <= 0 || img.width <= 0 || img.pixels.size() != static_cast<size_t>(img.height * img.width * 3)) {
      __builtin_trap();
    }
  } else if (r.error.empty()) {
    __builtin_trap();
  }
  return 0;
}
