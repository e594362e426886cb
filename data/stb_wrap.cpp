// The one translation unit that compiles stb_image and stb_image_resize (header-only libraries
// from Debian's libstb-dev). STB_*_STATIC keeps their symbols private to this file.
#include "data/stb_wrap.h"

#define STB_IMAGE_STATIC
#define STB_IMAGE_IMPLEMENTATION
#define STBI_NO_STDIO
// JPEG always goes to libjpeg-turbo (stb's own JPEG decoder has out-of-bounds reads on corrupt
// Huffman tables, found by fuzz/decode_fuzz.cpp); formats no photo folder holds are left out of
// the attack surface.
#define STBI_NO_JPEG
#define STBI_NO_PSD
#define STBI_NO_HDR
#define STBI_NO_PIC
#define STBI_MAX_DIMENSIONS (1 << 16)
#include <stb_image.h>

#define STB_IMAGE_RESIZE_STATIC
#define STB_IMAGE_RESIZE_IMPLEMENTATION
#include <stb_image_resize.h>

#include "core/error.h"

namespace minidl::data::stb {

bool info(const uint8_t* data, int size, int* w, int* h, int* comp) {
  return stbi_info_from_memory(data, size, w, h, comp) != 0;
}

std::optional<Image> load_rgb(const uint8_t* data, int size, std::string* why) {
  int w = 0, h = 0, comp = 0;
  stbi_uc* px = stbi_load_from_memory(data, size, &w, &h, &comp, 3);
  if (px == nullptr) {
    if (why != nullptr) *why = stbi_failure_reason() != nullptr ? stbi_failure_reason() : "unknown stb_image error";
    return std::nullopt;
  }
  Image img;
  img.height = h;
  img.width = w;
  img.pixels.assign(px, px + static_cast<size_t>(w) * static_cast<size_t>(h) * 3);
  stbi_image_free(px);
  return img;
}

void resize_rgb(const uint8_t* src, int w, int h, int stride, uint8_t* dst, int out_w, int out_h) {
  const int ok = stbir_resize_uint8_generic(src, w, h, stride, dst, out_w, out_h, 0, 3, STBIR_ALPHA_CHANNEL_NONE, 0,
                                            STBIR_EDGE_CLAMP, STBIR_FILTER_TRIANGLE, STBIR_COLORSPACE_LINEAR, nullptr);
  MINIDL_CHECK(ok != 0, "resize: stb_image_resize failed for ", w, "x", h, " -> ", out_w, "x", out_h);
}

}  // namespace minidl::data::stb
