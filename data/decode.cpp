// The decode wrapper: format sniffing, size limits before allocation, libjpeg-turbo for JPEG (one
// decompressor per thread, so loader workers never share one) and stb_image for the rest.
#include "data/decode.h"

#include <turbojpeg.h>

#include <cctype>
#include <cstring>
#include <fstream>
#include <limits>
#include <vector>

#include "data/stb_wrap.h"

namespace minidl::data {

namespace {

// One TurboJPEG decompressor per thread, created on first use and destroyed at thread exit.
// After a failed decode it is replaced: TurboJPEG 2.x can leave a handle mid-stream (the next
// file then fails with "two SOI markers").
struct TjHandle {
  tjhandle h = tjInitDecompress();
  ~TjHandle() {
    if (h != nullptr) tjDestroy(h);
  }
};
thread_local TjHandle t_handle;
tjhandle thread_decompressor() {
  if (t_handle.h == nullptr) t_handle.h = tjInitDecompress();
  return t_handle.h;
}
void discard_decompressor() {
  if (t_handle.h != nullptr) tjDestroy(t_handle.h);
  t_handle.h = nullptr;
}

// The SOI marker alone: anything that starts like a JPEG goes to libjpeg-turbo, which rejects it
// cleanly if the rest is not one (stb_image is built without its JPEG decoder).
bool is_jpeg(const uint8_t* d, size_t n) { return n >= 2 && d[0] == 0xFF && d[1] == 0xD8; }

std::string too_large(int64_t w, int64_t h, int64_t max_pixels) {
  return detail::concat("image of ", w, " x ", h, " pixels exceeds the limit of ", max_pixels, " pixels");
}

// What the header alone says against decoding (the file's size, a corrupt header, absurd or
// too large dimensions): "" when the pixels may be decoded. Shared by the decoders and probe_image.
std::string jpeg_header_problem(tjhandle tj, const uint8_t* data, size_t size, int64_t max_pixels, int* w, int* h,
                                int* colorspace) {
  if (size > static_cast<size_t>(std::numeric_limits<unsigned long>::max())) return "file too large";
  int subsamp = 0;
  if (tjDecompressHeader3(tj, data, static_cast<unsigned long>(size), w, h, &subsamp, colorspace) != 0)
    return std::string("corrupt JPEG header: ") + tjGetErrorStr2(tj);
  if (*w <= 0 || *h <= 0) return detail::concat("corrupt JPEG header: invalid dimensions ", *w, " x ", *h);
  if (static_cast<int64_t>(*w) * *h > max_pixels) return too_large(*w, *h, max_pixels);
  return "";
}

std::string other_header_problem(const uint8_t* data, size_t size, int64_t max_pixels, int* w, int* h, int* comp) {
  if (size > static_cast<size_t>(std::numeric_limits<int>::max())) return "file too large";
  if (std::string why = stb::refused(data, static_cast<int>(size)); !why.empty()) return why;
  if (!stb::info(data, static_cast<int>(size), w, h, comp))
    return "not an image in a supported format (JPEG, PNG, BMP, GIF, PNM, TGA)";
  if (*w <= 0 || *h <= 0) return detail::concat("image with invalid dimensions ", *w, " x ", *h);
  if (static_cast<int64_t>(*w) * *h > max_pixels) return too_large(*w, *h, max_pixels);
  return "";
}

DecodeResult decode_jpeg_once(const uint8_t* data, size_t size, int64_t max_pixels) {
  DecodeResult r;
  tjhandle tj = thread_decompressor();
  if (tj == nullptr) {
    r.error = "cannot create a TurboJPEG decompressor";
    return r;
  }
  int w = 0, h = 0, colorspace = 0;
  r.error = jpeg_header_problem(tj, data, size, max_pixels, &w, &h, &colorspace);
  if (!r.error.empty()) return r;
  const bool cmyk = colorspace == TJCS_CMYK || colorspace == TJCS_YCCK;
  const int channels = cmyk ? 4 : 3;
  std::vector<uint8_t> buf(static_cast<size_t>(w) * static_cast<size_t>(h) * static_cast<size_t>(channels));
  // LIMITSCANS refuses progressive files with absurd scan counts (a decode-time bomb).
  const int rc = tjDecompress2(tj, data, static_cast<unsigned long>(size), buf.data(), w, 0, h,
                               cmyk ? TJPF_CMYK : TJPF_RGB, TJFLAG_LIMITSCANS);
  if (rc != 0) {
    const std::string msg = tjGetErrorStr2(tj);
    // Warnings leave a complete image (libjpeg tolerates e.g. stray bytes before a marker, as
    // every viewer does), except a premature end: the bottom of the image would be grey.
    if (tjGetErrorCode(tj) != TJERR_WARNING) {
      r.error = "corrupt JPEG: " + msg;
      return r;
    }
    if (msg.find("Premature end") != std::string::npos) {
      r.error = "truncated JPEG (" + msg + ")";
      return r;
    }
    r.note = "JPEG decoded with a warning: " + msg;
  }
  Image img;
  img.height = h;
  img.width = w;
  if (cmyk) {
    // Adobe (inverted) CMYK: stored c = 255 - C etc., so R = 255 (1 - C)(1 - K) = c k / 255.
    const size_t n = static_cast<size_t>(w) * static_cast<size_t>(h);
    img.pixels.resize(n * 3);
    for (size_t i = 0; i < n; ++i) {
      const unsigned k = buf[4 * i + 3];
      for (size_t c = 0; c < 3; ++c) {
        img.pixels[3 * i + c] = static_cast<uint8_t>((buf[4 * i + c] * k + 127u) / 255u);
      }
    }
    r.note = r.note.empty() ? "CMYK JPEG converted to RGB" : r.note + "; CMYK JPEG converted to RGB";
  } else {
    img.pixels = std::move(buf);
    if (colorspace == TJCS_GRAY) r.note = r.note.empty() ? "grayscale JPEG converted to RGB" : r.note;
  }
  r.image = std::move(img);
  return r;
}

DecodeResult decode_jpeg(const uint8_t* data, size_t size, int64_t max_pixels) {
  DecodeResult r = decode_jpeg_once(data, size, max_pixels);
  if (!r.ok()) discard_decompressor();
  return r;
}

DecodeResult decode_other(const uint8_t* data, size_t size, int64_t max_pixels) {
  DecodeResult r;
  int w = 0, h = 0, comp = 0;
  r.error = other_header_problem(data, size, max_pixels, &w, &h, &comp);
  if (!r.error.empty()) return r;
  std::string why;
  std::optional<Image> img = stb::load_rgb(data, static_cast<int>(size), &why);
  if (!img) {
    r.error = "corrupt image: " + why;
    return r;
  }
  if (comp != 3) r.note = detail::concat(comp, "-channel image converted to RGB");
  r.image = std::move(img);
  return r;
}

}  // namespace

DecodeResult decode_image(const uint8_t* data, size_t size, int64_t max_pixels) {
  if (data == nullptr || size == 0) return DecodeResult{std::nullopt, "empty file", ""};
  if (is_jpeg(data, size)) return decode_jpeg(data, size, max_pixels);
  return decode_other(data, size, max_pixels);
}

std::string probe_image(const uint8_t* data, size_t size, int64_t max_pixels) {
  if (data == nullptr || size == 0) return "empty file";
  int w = 0, h = 0, extra = 0;
  if (!is_jpeg(data, size)) return other_header_problem(data, size, max_pixels, &w, &h, &extra);
  tjhandle tj = thread_decompressor();
  if (tj == nullptr) return "cannot create a TurboJPEG decompressor";
  std::string why = jpeg_header_problem(tj, data, size, max_pixels, &w, &h, &extra);
  if (!why.empty()) discard_decompressor();
  return why;
}

namespace {

// The whole file, or why it cannot be read ("" on success): a size check before any allocation.
std::string read_file(const std::filesystem::path& path, std::vector<uint8_t>* bytes) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return "cannot read the file: " + ec.message();
  if (size == 0) return "empty file";
  if (size > static_cast<uintmax_t>(kMaxFileBytes))
    return detail::concat("file of ", size, " bytes exceeds the limit of ", kMaxFileBytes);
  std::ifstream in(path, std::ios::binary);
  bytes->resize(static_cast<size_t>(size));
  if (!in.read(reinterpret_cast<char*>(bytes->data()), static_cast<std::streamsize>(size))) return "cannot read the file";
  return "";
}

}  // namespace

std::string probe_file(const std::filesystem::path& path, int64_t max_pixels) {
  std::vector<uint8_t> bytes;
  const std::string why = read_file(path, &bytes);
  return why.empty() ? probe_image(bytes.data(), bytes.size(), max_pixels) : why;
}

DecodeResult decode_file(const std::filesystem::path& path, int64_t max_pixels) {
  std::vector<uint8_t> bytes;
  if (std::string why = read_file(path, &bytes); !why.empty()) return DecodeResult{std::nullopt, why, ""};
  DecodeResult r = decode_image(bytes.data(), bytes.size(), max_pixels);
  // A PNG (or anything else) named .jpg decodes by its content; say so, it is worth renaming.
  std::string ext = path.extension().string();
  for (char& c : ext) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const bool named_jpeg = ext == ".jpg" || ext == ".jpeg" || ext == ".jpe" || ext == ".jfif";
  if (r.ok() && named_jpeg && !is_jpeg(bytes.data(), bytes.size())) {
    const std::string what = "not JPEG data despite the " + path.extension().string() + " name";
    r.note = r.note.empty() ? what : what + "; " + r.note;
  }
  return r;
}

}  // namespace minidl::data
