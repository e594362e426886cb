// Crops, resizes, flips and normalisation for the loader. The random draws follow torchvision's
// RandomResizedCrop.get_params step by step, but come from Philox(key, index) instead of a global
// generator, so the result does not depend on which worker ran the sample or when.
#include "data/transform.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "core/philox.h"
#include "data/resize.h"

namespace minidl::data {

namespace {

// Counters reserved per sample: 16 Philox draws = 64 uniforms, enough for RandomResizedCrop's 10
// attempts of 4 draws plus the flip.
constexpr uint64_t kCountersPerSample = 16;

// The w-th uniform of sample `index` (w < 64).
double uniform(uint64_t key, int64_t index, int w) {
  const philox::U4 u = philox::draw(key, static_cast<uint64_t>(index) * kCountersPerSample + static_cast<uint64_t>(w / 4));
  return philox::uniform01(philox::word(u, w % 4));
}

// Python's round(): half to even (the default floating-point rounding mode).
int64_t round_even(double v) { return static_cast<int64_t>(std::nearbyint(v)); }

// Resizes the box (top, left, ch, cw) of src into an out_w x out_h RGB buffer with filter f.
void resize_box(const Image& src, int64_t top, int64_t left, int64_t ch, int64_t cw, uint8_t* dst, int64_t out_h,
                int64_t out_w, Interpolation f) {
  const uint8_t* start = src.pixels.data() + (top * src.width + left) * 3;
  if (ch == out_h && cw == out_w) {
    for (int64_t y = 0; y < out_h; ++y) {
      std::memcpy(dst + y * out_w * 3, start + y * src.width * 3, static_cast<size_t>(out_w * 3));
    }
    return;
  }
  if (f == Interpolation::Nearest) {
    resize_rgb_nearest(start, cw, ch, src.width * 3, dst, out_w, out_h);
  } else {
    resize_rgb(start, cw, ch, src.width * 3, dst, out_w, out_h);
  }
}

Image resized(const Image& src, int64_t out_h, int64_t out_w, Interpolation f) {
  Image out;
  out.height = out_h;
  out.width = out_w;
  out.pixels.resize(static_cast<size_t>(out_h * out_w * 3));
  resize_box(src, 0, 0, src.height, src.width, out.pixels.data(), out_h, out_w, f);
  return out;
}

void hflip(uint8_t* img, int64_t size) {
  for (int64_t y = 0; y < size; ++y) {
    uint8_t* row = img + y * size * 3;
    for (int64_t a = 0, b = size - 1; a < b; ++a, --b) {
      for (int c = 0; c < 3; ++c) std::swap(row[a * 3 + c], row[b * 3 + c]);
    }
  }
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

}  // namespace

int64_t resolved_resize(const TransformOptions& t) {
  if (t.resize > 0) return t.resize;
  return t.augment == Augment::Keras ? round_even(static_cast<double>(t.size) * 250.0 / 200.0) : t.size;
}

int64_t imagenet_resize(int64_t size) { return round_even(static_cast<double>(size) * 256.0 / 224.0); }

uint64_t epoch_key(uint64_t seed, int64_t epoch, uint64_t stream) {
  return splitmix64(splitmix64(splitmix64(seed) ^ static_cast<uint64_t>(epoch)) ^ stream);
}

Image make_base(Image decoded, const TransformOptions& t) {
  MINIDL_CHECK(decoded.height > 0 && decoded.width > 0, "make_base: empty image");
  const int64_t r = resolved_resize(t);
  switch (t.augment) {
    case Augment::RandomResizedCrop:
      return decoded;
    case Augment::Keras:
      if (decoded.height == r && decoded.width == r) return decoded;
      return resized(decoded, r, r, t.interpolation);
    case Augment::None: {
      if (t.fit == Fit::Squash) {
        if (decoded.height == t.size && decoded.width == t.size) return decoded;
        return resized(decoded, t.size, t.size, t.interpolation);
      }
      const int64_t h = decoded.height, w = decoded.width;
      // torchvision's Resize(int): the shorter side becomes r, the longer int(r * long / short).
      const int64_t nh = h <= w ? r : r * h / w;
      const int64_t nw = h <= w ? r * w / h : r;
      if (nh == h && nw == w) return decoded;
      return resized(decoded, nh, nw, t.interpolation);
    }
  }
  MINIDL_FAIL("make_base: unknown augment mode");
}

CropBox random_resized_crop_box(int64_t height, int64_t width, uint64_t key, int64_t index) {
  const double area = static_cast<double>(height * width);
  const double log_lo = std::log(3.0 / 4.0), log_hi = std::log(4.0 / 3.0);
  for (int attempt = 0; attempt < 10; ++attempt) {
    const double target = area * (0.08 + (1.0 - 0.08) * uniform(key, index, 4 * attempt));
    const double aspect = std::exp(log_lo + (log_hi - log_lo) * uniform(key, index, 4 * attempt + 1));
    const int64_t cw = round_even(std::sqrt(target * aspect));
    const int64_t ch = round_even(std::sqrt(target / aspect));
    if (cw > 0 && cw <= width && ch > 0 && ch <= height) {
      const auto top = static_cast<int64_t>(uniform(key, index, 4 * attempt + 2) * static_cast<double>(height - ch + 1));
      const auto left = static_cast<int64_t>(uniform(key, index, 4 * attempt + 3) * static_cast<double>(width - cw + 1));
      return {std::min(top, height - ch), std::min(left, width - cw), ch, cw};
    }
  }
  // torchvision's fallback: the whole image, its aspect ratio clamped to the range, centred.
  const double in_ratio = static_cast<double>(width) / static_cast<double>(height);
  int64_t cw = width, ch = height;
  if (in_ratio < 3.0 / 4.0) {
    ch = std::min(height, round_even(static_cast<double>(width) / (3.0 / 4.0)));
  } else if (in_ratio > 4.0 / 3.0) {
    cw = std::min(width, round_even(static_cast<double>(height) * (4.0 / 3.0)));
  }
  return {(height - ch) / 2, (width - cw) / 2, ch, cw};
}

void apply_transform(const Image& base, const TransformOptions& t, uint64_t key, int64_t index, uint8_t* out) {
  const int64_t s = t.size;
  bool flip = false;
  switch (t.augment) {
    case Augment::None: {
      MINIDL_CHECK(base.height >= s && base.width >= s, "transform: image of ", base.height, "x", base.width,
                   " is smaller than the crop ", s, "; use resize >= size");
      const int64_t top = round_even(static_cast<double>(base.height - s) / 2.0);
      const int64_t left = round_even(static_cast<double>(base.width - s) / 2.0);
      resize_box(base, top, left, s, s, out, s, s, t.interpolation);
      break;
    }
    case Augment::RandomResizedCrop: {
      const CropBox b = random_resized_crop_box(base.height, base.width, key, index);
      resize_box(base, b.top, b.left, b.height, b.width, out, s, s, t.interpolation);
      flip = t.hflip && uniform(key, index, 63) < 0.5;
      break;
    }
    case Augment::Keras: {
      MINIDL_CHECK(base.height >= s && base.width >= s, "transform: image of ", base.height, "x", base.width,
                   " is smaller than the crop ", s, "; use resize >= size");
      const auto top = std::min(base.height - s, static_cast<int64_t>(uniform(key, index, 0) * static_cast<double>(base.height - s + 1)));
      const auto left = std::min(base.width - s, static_cast<int64_t>(uniform(key, index, 1) * static_cast<double>(base.width - s + 1)));
      resize_box(base, top, left, s, s, out, s, s, t.interpolation);
      flip = t.hflip && uniform(key, index, 63) < 0.5;
      break;
    }
  }
  if (flip) hflip(out, s);
}

BatchWriter::BatchWriter(const TransformOptions& t, DType dtype, bool channels_last)
    : size_(t.size), dtype_(dtype), channels_last_(channels_last) {
  MINIDL_CHECK(dtype == DType::f32 || dtype == DType::f16, "Loader: batches are f32 or f16, got ", dtype_name(dtype));
  MINIDL_CHECK(!t.normalize || (t.mean.size() == 3 && t.std.size() == 3), "Loader: normalize needs 3 means and 3 stds, got ",
               t.mean.size(), " and ", t.std.size());
  for (int c = 0; c < 3; ++c) {
    for (int v = 0; v < 256; ++v) {
      float x = static_cast<float>(v) / 255.0f;
      if (t.normalize) {
        MINIDL_CHECK(t.std[static_cast<size_t>(c)] != 0.0f, "Loader: normalize std of channel ", c, " is zero");
        x = (x - t.mean[static_cast<size_t>(c)]) / t.std[static_cast<size_t>(c)];
      }
      lut32_[static_cast<size_t>(c)][static_cast<size_t>(v)] = x;
      lut16_[static_cast<size_t>(c)][static_cast<size_t>(v)] = Half::from_float(x);
    }
  }
}

void BatchWriter::write(const uint8_t* hwc, void* batch, int64_t slot) const {
  const int64_t plane = size_ * size_;
  const auto run = [&](auto* out, const auto& lut) {
    out += slot * plane * 3;
    if (channels_last_) {
      for (int64_t p = 0; p < plane; ++p) {
        for (int64_t c = 0; c < 3; ++c) out[p * 3 + c] = lut[static_cast<size_t>(c)][hwc[p * 3 + c]];
      }
    } else {
      for (int64_t c = 0; c < 3; ++c) {
        const auto& l = lut[static_cast<size_t>(c)];
        auto* o = out + c * plane;
        for (int64_t p = 0; p < plane; ++p) o[p] = l[hwc[p * 3 + c]];
      }
    }
  };
  if (dtype_ == DType::f32) {
    run(static_cast<float*>(batch), lut32_);
  } else {
    run(static_cast<uint16_t*>(batch), lut16_);
  }
}

}  // namespace minidl::data
