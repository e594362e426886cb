// Image fixtures generated inside the tests (no binary files in the repository): synthetic RGB
// patterns, JPEG encoding through TurboJPEG (RGB, grayscale, CMYK), temporary folders, and the
// shared real photos when present.
#pragma once
#include <turbojpeg.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "data/dataset.h"

namespace minidl::data::fixtures {

namespace fs = std::filesystem;

// A smooth colourful pattern (JPEG-friendly), different for each seed.
inline Image pattern(int64_t h, int64_t w, int seed) {
  Image img{h, w, std::vector<uint8_t>(static_cast<size_t>(h * w * 3))};
  for (int64_t y = 0; y < h; ++y) {
    for (int64_t x = 0; x < w; ++x) {
      for (int64_t c = 0; c < 3; ++c) {
        const double v = 127.5 + 100.0 * std::sin(0.05 * static_cast<double>(x * (c + 1) + seed * 7) +
                                                   0.03 * static_cast<double>(y * (3 - c) + seed));
        img.pixels[static_cast<size_t>((y * w + x) * 3 + c)] = static_cast<uint8_t>(v);
      }
    }
  }
  return img;
}

enum class JpegKind { Rgb, Gray, Cmyk };

// Encodes img as a JPEG. Gray keeps the luminance; Cmyk writes Adobe (inverted) CMYK the way
// Photoshop does: stored c = 255 * r / max(r, g, b), k = max(r, g, b).
inline std::vector<uint8_t> encode_jpeg(const Image& img, JpegKind kind = JpegKind::Rgb, int quality = 95) {
  tjhandle tj = tjInitCompress();
  std::vector<uint8_t> src;
  int pf = TJPF_RGB, subsamp = TJSAMP_444;
  const size_t n = static_cast<size_t>(img.height * img.width);
  if (kind == JpegKind::Gray) {
    pf = TJPF_GRAY;
    subsamp = TJSAMP_GRAY;
    src.resize(n);
    for (size_t i = 0; i < n; ++i) {
      src[i] = static_cast<uint8_t>((299 * img.pixels[3 * i] + 587 * img.pixels[3 * i + 1] + 114 * img.pixels[3 * i + 2]) / 1000);
    }
  } else if (kind == JpegKind::Cmyk) {
    pf = TJPF_CMYK;
    src.resize(n * 4);
    for (size_t i = 0; i < n; ++i) {
      const unsigned m = std::max({img.pixels[3 * i], img.pixels[3 * i + 1], img.pixels[3 * i + 2], uint8_t{1}});
      for (size_t c = 0; c < 3; ++c) src[4 * i + c] = static_cast<uint8_t>((img.pixels[3 * i + c] * 255u + m / 2) / m);
      src[4 * i + 3] = static_cast<uint8_t>(m);
    }
  } else {
    src = img.pixels;
  }
  unsigned char* out = nullptr;
  unsigned long size = 0;
  const int rc = tjCompress2(tj, src.data(), static_cast<int>(img.width), 0, static_cast<int>(img.height), pf, &out, &size,
                             subsamp, quality, 0);
  EXPECT_EQ(rc, 0) << tjGetErrorStr2(tj);
  std::vector<uint8_t> bytes(out, out + size);
  tjFree(out);
  tjDestroy(tj);
  return bytes;
}

inline void write_bytes(const fs::path& p, const std::vector<uint8_t>& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream out(p, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

inline std::vector<uint8_t> read_bytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// A fresh temporary folder, removed when the test ends.
class TempDir {
 public:
  TempDir() {
    std::random_device rd;
    path_ = fs::temp_directory_path() / ("minidl_data_test_" + std::to_string(rd()) + "_" + std::to_string(rd()));
    fs::create_directories(path_);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const fs::path& path() const { return path_; }

 private:
  fs::path path_;
};

// ../shared/data/catsdogs, or an empty path (the test then skips with a message).
inline fs::path shared_photos() {
  const fs::path p = fs::path(MINIDL_SHARED_DATA_DIR) / "catsdogs";
  return fs::is_directory(p / "cat") && fs::is_directory(p / "dog") ? p : fs::path();
}

#define MINIDL_REQUIRE_SHARED_PHOTOS(var)                                                               \
  const auto var = ::minidl::data::fixtures::shared_photos();                                            \
  if ((var).empty()) {                                                                                  \
    GTEST_SKIP() << "no shared photos at " MINIDL_SHARED_DATA_DIR "/catsdogs (see "                     \
                    "../shared/data/README.md); this test needs the real cats-vs-dogs photos";          \
  }                                                                                                     \
  static_assert(true)

}  // namespace minidl::data::fixtures
