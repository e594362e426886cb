// Decoding image files into 8-bit RGB: JPEG through libjpeg-turbo (fast, SIMD), every other format
// stb_image knows through stb_image. Bad input never throws or crashes: it returns an error string
// naming the problem, so datasets can skip the file and report it once.
#pragma once
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>

#include "data/dataset.h"

namespace minidl::data {

// Images larger than this are refused after reading the header, before any pixel is allocated
// (a corrupt header can claim 65535 x 65535 pixels, 12 GiB of RGB).
inline constexpr int64_t kDefaultMaxPixels = int64_t{64} << 20;   // 64 Mpixel
// Files larger than this are refused before they are read.
inline constexpr int64_t kMaxFileBytes = int64_t{1} << 30;

struct DecodeResult {
  std::optional<Image> image;   // set on success (always 3 channels, RGB)
  std::string error;            // why it failed: "empty file", "truncated JPEG", ...
  std::string note;             // set on a success that needed a conversion ("CMYK JPEG converted to RGB")
  bool ok() const { return image.has_value(); }
};

// Detects the format from the bytes (never from the file name): a PNG named .jpg decodes as PNG.
// Grayscale, grayscale + alpha, RGBA and palette images become RGB (alpha dropped); CMYK and YCCK
// JPEGs are converted assuming Adobe's inverted CMYK, which is what Photoshop writes.
DecodeResult decode_image(const uint8_t* data, size_t size, int64_t max_pixels = kDefaultMaxPixels);
DecodeResult decode_file(const std::filesystem::path& path, int64_t max_pixels = kDefaultMaxPixels);

// The header alone, no pixels decoded: "" when the bytes start like an image of a supported format
// with sane dimensions under max_pixels, else why not (the same words decode_image would use).
// Catches empty, non-image and random-bytes files and absurd sizes at a small fraction of a
// decode's cost; a file that passes can still fail to decode (a truncated or corrupt JPEG body).
std::string probe_image(const uint8_t* data, size_t size, int64_t max_pixels = kDefaultMaxPixels);
std::string probe_file(const std::filesystem::path& path, int64_t max_pixels = kDefaultMaxPixels);

}  // namespace minidl::data
