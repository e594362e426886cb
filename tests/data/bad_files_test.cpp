// Bad files never stop a run: fixtures made inside the test from a real photo (the shared
// cat.1.jpg when present, else a generated pattern) are skipped (zero-byte, truncated, corrupt,
// text named .jpg, absurd dimensions) or converted (grayscale, CMYK, PNG named .jpg), each
// unreadable one reported once by path, counted by the loader and by validate_dataset.
#define STB_IMAGE_WRITE_STATIC
#define STB_IMAGE_WRITE_IMPLEMENTATION
#include <stb/stb_image_write.h>

#include <gtest/gtest.h>

#include <cstdlib>

#include "data/decode.h"
#include "data/loader.h"
#include "tests/data/fixtures.h"

namespace minidl::data {
namespace {

using fixtures::encode_jpeg;
using fixtures::JpegKind;

// The source photo: a real JPEG, its decoded pixels.
struct Source {
  std::vector<uint8_t> jpeg;
  Image image;
};
Source source() {
  Source s;
  const auto root = fixtures::shared_photos();
  if (!root.empty()) {
    s.jpeg = fixtures::read_bytes(root / "cat" / "cat.1.jpg");
  } else {
    s.jpeg = encode_jpeg(fixtures::pattern(120, 160, 1));
  }
  DecodeResult r = decode_image(s.jpeg.data(), s.jpeg.size());
  EXPECT_TRUE(r.ok()) << r.error;
  s.image = std::move(*r.image);
  return s;
}

std::vector<uint8_t> encode_png(const Image& img) {
  std::vector<uint8_t> out;
  stbi_write_png_to_func(
      [](void* ctx, void* data, int size) {
        auto* v = static_cast<std::vector<uint8_t>*>(ctx);
        v->insert(v->end(), static_cast<uint8_t*>(data), static_cast<uint8_t*>(data) + size);
      },
      &out, static_cast<int>(img.width), static_cast<int>(img.height), 3, img.pixels.data(), static_cast<int>(img.width * 3));
  return out;
}

// The JPEG with its frame header claiming 30000 x 30000 pixels (900 Mpixel, 2.5 GiB of RGB).
std::vector<uint8_t> huge_jpeg(std::vector<uint8_t> j) {
  for (size_t i = 2; i + 8 < j.size(); ++i) {
    if (j[i] == 0xFF && j[i + 1] >= 0xC0 && j[i + 1] <= 0xC2) {
      for (size_t k : {5u, 7u}) {
        j[i + k] = 0x75;
        j[i + k + 1] = 0x30;
      }
      return j;
    }
  }
  ADD_FAILURE() << "no SOF marker in the source JPEG";
  return j;
}

double mean_abs_diff(const Image& a, const Image& b) {
  EXPECT_EQ(a.pixels.size(), b.pixels.size());
  double s = 0;
  for (size_t i = 0; i < std::min(a.pixels.size(), b.pixels.size()); ++i) s += std::abs(a.pixels[i] - b.pixels[i]);
  return s / static_cast<double>(a.pixels.size());
}

TEST(Decode, GrayscaleAndCmykJpegsBecomeRgb) {
  const Source s = source();
  const auto gray = decode_image(encode_jpeg(s.image, JpegKind::Gray).data(), encode_jpeg(s.image, JpegKind::Gray).size());
  ASSERT_TRUE(gray.ok()) << gray.error;
  EXPECT_NE(gray.note.find("grayscale"), std::string::npos);
  for (size_t i = 0; i < gray.image->pixels.size(); i += 3) {
    ASSERT_EQ(gray.image->pixels[i], gray.image->pixels[i + 1]);
    ASSERT_EQ(gray.image->pixels[i], gray.image->pixels[i + 2]);
  }
  const auto cmyk_bytes = encode_jpeg(s.image, JpegKind::Cmyk);
  const auto cmyk = decode_image(cmyk_bytes.data(), cmyk_bytes.size());
  ASSERT_TRUE(cmyk.ok()) << cmyk.error;
  EXPECT_NE(cmyk.note.find("CMYK"), std::string::npos);
  // Back to the photo's colours, up to JPEG loss (an uninverted reading would be ~128 off).
  EXPECT_LT(mean_abs_diff(*cmyk.image, s.image), 6.0);
}

TEST(Decode, RefusesWithoutCrashing) {
  const Source s = source();
  const auto refuse = [](const std::vector<uint8_t>& b, const char* want) {
    const DecodeResult r = decode_image(b.data(), b.size());
    EXPECT_FALSE(r.ok());
    EXPECT_NE(r.error.find(want), std::string::npos) << "got '" << r.error << "', wanted '" << want << "'";
  };
  refuse({}, "empty file");
  refuse(std::vector<uint8_t>(s.jpeg.begin(), s.jpeg.begin() + static_cast<std::ptrdiff_t>(s.jpeg.size() * 6 / 10)), "truncated");
  std::vector<uint8_t> corrupt = s.jpeg;
  for (size_t i = 4; i < 300 && i < corrupt.size(); ++i) corrupt[i] = static_cast<uint8_t>(i * 37);
  refuse(corrupt, "corrupt");
  const std::string text = "hello, this is not a picture\n";
  refuse(std::vector<uint8_t>(text.begin(), text.end()), "not an image");
  refuse(huge_jpeg(s.jpeg), "exceeds the limit");
  std::vector<uint8_t> png = encode_png(s.image);
  ASSERT_GT(png.size(), 33u);
  for (size_t k : {16u, 20u}) {  // IHDR width and height: 9000 x 9000 (81 Mpixel)
    png[k] = 0;
    png[k + 1] = 0;
    png[k + 2] = 0x23;
    png[k + 3] = 0x28;
  }
  refuse(png, "exceeds the limit");
  // Every prefix of a real JPEG: never a crash, either an image or an error.
  for (size_t n = 0; n < s.jpeg.size(); n += 97) {
    const DecodeResult r = decode_image(s.jpeg.data(), n);
    EXPECT_TRUE(r.ok() != !r.error.empty());
  }
}

// What fuzz/decode_fuzz.cpp found in stb_image's PGM / PPM reader (issue 30): 16-bit samples read
// in the wrong byte order and converted past the end of a buffer, and header numbers that
// overflow an int. Such files are refused with a reason; 8-bit ones still decode.
TEST(Decode, SixteenBitAndAbsurdPnmHeadersAreRefused) {
  const auto decode = [](const std::string& b) { return decode_image(reinterpret_cast<const uint8_t*>(b.data()), b.size()); };
  const DecodeResult pgm16 = decode(std::string("P5\n3 1\n65535\n") + std::string("\x00\x00\x80\x00\xff\xff", 6));
  EXPECT_FALSE(pgm16.ok());
  EXPECT_EQ(pgm16.error, "16-bit PGM / PPM (maxval 65535) is not supported; convert it to 8 bits");
  const DecodeResult huge = decode("P6\n4777777777777777 3\n255\n" + std::string(64, 'x'));
  EXPECT_EQ(huge.error, "PGM / PPM header with a number too large");
  const DecodeResult ppm8 = decode(std::string("P6\n# a comment\n1 1\n255\n") + std::string("\xff\x80\x00", 3));
  ASSERT_TRUE(ppm8.ok()) << ppm8.error;
  EXPECT_EQ(ppm8.image->pixels, (std::vector<uint8_t>{255, 128, 0}));
  EXPECT_EQ(probe_image(reinterpret_cast<const uint8_t*>("P5 2 2 1000 "), 12),
            "16-bit PGM / PPM (maxval 1000) is not supported; convert it to 8 bits");
}

// What fuzz/decode_fuzz.cpp found in stb_image's PNG reader: it grows its buffer to an IDAT
// chunk's claimed length before reading it, so a few bytes claiming a 1 GB chunk asked for 2 GB.
// A chunk longer than the rest of the file is refused with a reason; a real PNG still decodes.
TEST(Decode, PngChunkLongerThanTheFileIsRefusedBeforeStbAllocates) {
  const Source s = source();
  std::vector<uint8_t> png = encode_png(s.image);
  const DecodeResult good = decode_image(png.data(), png.size());
  ASSERT_TRUE(good.ok()) << good.error;
  // The first chunk after IHDR (8-byte signature + 25-byte IHDR chunk) claims 0x41000100 bytes.
  ASSERT_GT(png.size(), 45u);
  const std::string type(reinterpret_cast<const char*>(png.data() + 37), 4);
  png[33] = 0x41;
  png[34] = 0x00;
  png[35] = 0x01;
  png[36] = 0x00;
  const DecodeResult r = decode_image(png.data(), png.size());
  EXPECT_FALSE(r.ok());
  EXPECT_EQ(r.error, "PNG chunk '" + type + "' claims 1090519296 bytes but only " +
                         std::to_string(png.size() - 41) + " are left in the file (truncated or corrupt)");
}

TEST(BadFiles, SkippedOrConvertedReportedOnceAndCounted) {
  const Source s = source();
  fixtures::TempDir t;
  const auto cat = t.path() / "cat", dog = t.path() / "dog";
  fixtures::write_bytes(cat / "good.jpg", s.jpeg);
  fixtures::write_bytes(cat / "zero.jpg", {});
  fixtures::write_bytes(cat / "truncated.jpg", std::vector<uint8_t>(s.jpeg.begin(), s.jpeg.begin() + static_cast<std::ptrdiff_t>(s.jpeg.size() / 2)));
  std::vector<uint8_t> corrupt = s.jpeg;
  for (size_t i = 4; i < 300; ++i) corrupt[i] = static_cast<uint8_t>(i * 37);
  fixtures::write_bytes(cat / "corrupt.jpg", corrupt);
  const std::string text = "not a photo";
  fixtures::write_bytes(dog / "text.jpg", std::vector<uint8_t>(text.begin(), text.end()));
  fixtures::write_bytes(dog / "huge.jpg", huge_jpeg(s.jpeg));
  fixtures::write_bytes(dog / "png.jpg", encode_png(s.image));
  fixtures::write_bytes(dog / "gray.jpg", encode_jpeg(s.image, JpegKind::Gray));
  fixtures::write_bytes(dog / "cmyk.JPG", encode_jpeg(s.image, JpegKind::Cmyk));
  const auto ds = open_image_folder(t.path());
  ASSERT_EQ(ds->size(), 9);

  const ValidationReport r = validate_dataset(*ds, 3);
  EXPECT_EQ(r.samples, 9);
  EXPECT_EQ(r.readable, 4);
  EXPECT_EQ(r.unreadable.size(), 5u);
  EXPECT_EQ(r.converted.size(), 3u);
  EXPECT_EQ(r.readable_per_class, (std::vector<int64_t>{1, 3}));
  const std::string text_report = r.text();
  for (const char* name : {"zero.jpg", "truncated.jpg", "corrupt.jpg", "text.jpg", "huge.jpg", "png.jpg", "gray.jpg", "cmyk.JPG"}) {
    EXPECT_NE(text_report.find(name), std::string::npos) << name << " missing from\n" << text_report;
  }
  EXPECT_EQ(text_report.find("good.jpg"), std::string::npos) << text_report;

  LoaderOptions o;
  o.batch_size = 3;
  o.workers = 2;
  o.transform.size = 32;
  o.transform.augment = Augment::RandomResizedCrop;
  Loader l(ds, o);
  ::testing::internal::CaptureStderr();
  int64_t images = 0;
  for (int64_t epoch : {0, 1}) {
    l.start_epoch(epoch);
    while (auto b = l.next()) images += b->labels.size(0);
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_EQ(images, 8);
  EXPECT_EQ(l.stats().skipped, 5);
  for (const char* name : {"zero.jpg", "truncated.jpg", "corrupt.jpg", "text.jpg", "huge.jpg"}) {
    const std::string path = (std::string(name) == "text.jpg" || std::string(name) == "huge.jpg" ? dog : cat) / name;
    const size_t first = err.find(path);
    EXPECT_NE(first, std::string::npos) << path << " not reported in\n" << err;
    EXPECT_EQ(err.find(path, first + 1), std::string::npos) << path << " reported twice in\n" << err;
  }
}

}  // namespace
}  // namespace minidl::data
