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

#include <cctype>
#include <cstdint>
#include <cstring>
#include <string>

#include "core/error.h"

namespace minidl::data::stb {

// stb_image's PGM / PPM reader has two faults (found by fuzz/decode_fuzz.cpp, inputs kept in
// fuzz/corpus/decode/): it reads header numbers into an int without an overflow check ("P6
// 4777777777777 3 255": undefined behaviour, pnm_huge_width), and it reads 16-bit samples in the
// wrong byte order, then converts them to 3 channels with its 8-bit routine, writing past its
// buffer (pgm16_channel_overflow). The header is read here first, the way stb tokenises it
// (whitespace and '#' comments before each number), and such files are refused before stb sees them.
//
// Its PNG reader grows the compressed-data buffer to whatever an IDAT chunk's length field claims
// before it reads the chunk (no check of the length against the file in Debian's stb): a 155-byte
// file claiming a 1 GB chunk made it ask for 2 GB (fuzz/corpus/decode/png_idat_length_past_end).
// A chunk cannot be longer than what is left of the file, so such files are refused here, which
// bounds stb's buffer by twice the file's size.
std::string png_refused(const uint8_t* d, int size) {
  static const uint8_t kSignature[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
  if (size < 8 || std::memcmp(d, kSignature, 8) != 0) return "";   // not a PNG
  int64_t at = 8;
  while (at + 8 <= size) {
    const uint32_t length = (uint32_t{d[at]} << 24) | (uint32_t{d[at + 1]} << 16) | (uint32_t{d[at + 2]} << 8) |
                            uint32_t{d[at + 3]};
    const std::string type(reinterpret_cast<const char*>(d + at + 4), 4);
    const int64_t left = size - (at + 8);
    if (int64_t{length} > left) {
      std::string shown;
      for (char c : type) shown += std::isalnum(static_cast<unsigned char>(c)) != 0 ? c : '?';
      return detail::concat("PNG chunk '", shown, "' claims ", length, " bytes but only ", left,
                            " are left in the file (truncated or corrupt)");
    }
    if (type == "IEND") return "";
    at += 12 + int64_t{length};   // length, type, data, CRC
  }
  return "";   // truncated after a whole chunk: stb reports it
}

std::string refused(const uint8_t* d, int size) {
  if (std::string png = png_refused(d, size); !png.empty()) return png;
  if (size < 2 || d[0] != 'P' || (d[1] != '5' && d[1] != '6')) return "";   // not a PNM stb reads
  int i = 2;
  int64_t v = 0;
  for (int number = 0; number < 3; ++number) {   // width, height, maxval
    while (i < size && (std::isspace(d[i]) != 0 || d[i] == '#')) {
      if (d[i] == '#') {
        while (i < size && d[i] != '\n' && d[i] != '\r') ++i;
      } else {
        ++i;
      }
    }
    v = 0;
    for (; i < size && d[i] >= '0' && d[i] <= '9'; ++i) {
      v = v * 10 + (d[i] - '0');
      if (v > (int64_t{1} << 24)) return "PGM / PPM header with a number too large";
    }
  }
  if (v > 255) return detail::concat("16-bit PGM / PPM (maxval ", v, ") is not supported; convert it to 8 bits");
  return "";
}

bool info(const uint8_t* data, int size, int* w, int* h, int* comp) {
  return refused(data, size).empty() && stbi_info_from_memory(data, size, w, h, comp) != 0;
}

std::optional<Image> load_rgb(const uint8_t* data, int size, std::string* why) {
  int w = 0, h = 0, comp = 0;
  if (std::string r = refused(data, size); !r.empty()) {
    if (why != nullptr) *why = r;
    return std::nullopt;
  }
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
