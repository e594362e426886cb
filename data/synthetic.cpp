// The synthetic two-class set: every random draw is addressed in seeded Philox streams (the ones a
// minidl::Generator hands out: parameters, then label keys, then pixel noise), so the set depends
// only on its arguments, not on the thread count, and one image can be rendered alone.
#include "data/synthetic.h"

#include <algorithm>
#include <cmath>
#include <numbers>
#include <numeric>
#include <vector>

#include "core/philox.h"

namespace minidl::data {

namespace {
constexpr int64_t kParamsPerImage = 16;
}

SyntheticRenderer::SyntheticRenderer(int64_t n, int64_t size, uint64_t seed, double difficulty)
    : n_(n), size_(size), seed_(seed), difficulty_(difficulty) {
  MINIDL_CHECK(n > 0, "make_synthetic_images: n must be positive, got ", n);
  MINIDL_CHECK(size >= 8, "make_synthetic_images: size must be at least 8 pixels, got ", size);
  MINIDL_CHECK(difficulty >= 0.0 && difficulty <= 1.0,
               "make_synthetic_images: difficulty must be in [0, 1], got ", difficulty);
  // Stream layout (part of the format: changing it changes every image of every seed): the same
  // offsets Generator(seed) gives rand({n, 16}), rand({n}), randn({n, 3, size, size}) in turn.
  const auto un = static_cast<uint64_t>(n);
  const uint64_t order_offset = philox::counters_for(un * kParamsPerImage);
  noise_offset_ = order_offset + philox::counters_for(un);
  params_.resize(static_cast<size_t>(n * kParamsPerImage));
  for (size_t k = 0; k < params_.size(); ++k) params_[k] = static_cast<float>(philox::uniform_at(seed, 0, k));
  std::vector<float> order_keys(static_cast<size_t>(n));
  for (size_t k = 0; k < order_keys.size(); ++k) order_keys[k] = static_cast<float>(philox::uniform_at(seed, order_offset, k));

  // Exactly balanced labels (class 0 gets the odd one), shuffled by sorting seeded keys; the
  // stable sort keeps ties (vanishingly rare) deterministic.
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  std::stable_sort(perm.begin(), perm.end(), [&](int64_t a, int64_t b) {
    return order_keys[static_cast<size_t>(a)] < order_keys[static_cast<size_t>(b)];
  });
  labels_.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) labels_[static_cast<size_t>(perm[static_cast<size_t>(i)])] = i < (n + 1) / 2 ? 0 : 1;
}

void SyntheticRenderer::render(int64_t i, float* img) const {
  MINIDL_CHECK(i >= 0 && i < n_, "synthetic image index ", i, " out of range [0, ", n_, ")");
  const float* p = params_.data() + i * kParamsPerImage;
  const bool class1 = labels_[static_cast<size_t>(i)] != 0;
  const double pi = std::numbers::pi;
  const double s = static_cast<double>(size_);
  const double difficulty = difficulty_;
  // The pixel noise is white, so its energy grows with the pixel count: above 64 px its std falls as
  // 64 / size, keeping the image's total noise energy that of a 64 px image. Without this the
  // Keras CNN (one conv, then a dense layer over 100x100x32 features at 200 px) sees mostly noise
  // energy, and plain SGD at lr 0.01 swings its dense units dead within 20 steps (measured: val
  // 50.00% at 200 px with std 0.51; see docs/data.md, "The synthetic set"). 64 px and below: unchanged.
  const double noise_std = (0.15 + 0.6 * difficulty) * std::min(1.0, 64.0 / s);
  const int64_t size = size_;
  const int64_t plane = size * size;
  const double cx = s * (0.25 + 0.5 * p[0]);
  const double cy = s * (0.25 + 0.5 * p[1]);
  const double radius = s * (0.22 + 0.13 * p[2]);
  // 3 to 8 pixels per period at every image size: never aliased into another orientation, and the
  // local texture a 3x3 convolution sees is the same at 32 and at 224 pixels.
  const double period = 3.0 + 5.0 * p[3];
  const double phase = 2.0 * pi * p[4];
  const double theta = (class1 ? pi / 2.0 : 0.0) + (2.0 * p[5] - 1.0) * difficulty * pi / 4.0;
  const double contrast = 1.0 - 0.6 * difficulty * p[6];
  const double colour[3] = {0.4 + 0.6 * p[7], 0.4 + 0.6 * p[8], 0.4 + 0.6 * p[9]};
  const double base = 0.6 * (p[10] - 0.5);
  const double background[3] = {base + 0.2 * (p[11] - 0.5), base + 0.2 * (p[12] - 0.5), base + 0.2 * (p[13] - 0.5)};
  const double blob_x = s * p[14], blob_y = s * p[15];
  const double blob_sigma = 0.08 * s;
  const double blob_amp = 0.8 * difficulty;
  const double kx = 2.0 * pi / period * std::cos(theta), ky = 2.0 * pi / period * std::sin(theta);

  // The noise of this image: elements [i*3*plane, (i+1)*3*plane) of the normal stream, four per
  // Philox counter (the same values randn gives).
  const auto first = static_cast<uint64_t>(i * 3 * plane);
  std::vector<float> noise(static_cast<size_t>(3 * plane));
  for (uint64_t k = 0; k < noise.size();) {
    const uint64_t g = first + k;
    double v[4];
    philox::normals4(philox::draw(seed_, noise_offset_ + g / 4), v);
    for (uint64_t j = g % 4; j < 4 && k < noise.size(); ++j, ++k) noise[k] = static_cast<float>(v[j]);
  }

  for (int64_t h = 0; h < size; ++h) {
    const double y = static_cast<double>(h) + 0.5;
    for (int64_t w = 0; w < size; ++w) {
      const double x = static_cast<double>(w) + 0.5;
      // Raised-cosine edge: a hard disc edge would add strong edges of every orientation to the
      // stripes' single one.
      const double d = std::hypot(x - cx, y - cy) / radius;
      const double window = d < 0.6 ? 1.0 : d < 1.0 ? 0.5 * (1.0 + std::cos(pi * (d - 0.6) / 0.4)) : 0.0;
      const double stripes = window == 0.0 ? 0.0 : contrast * window * std::sin(kx * (x - cx) + ky * (y - cy) + phase);
      const double bx = x - blob_x, by = y - blob_y;
      const double blob = blob_amp * std::exp(-(bx * bx + by * by) / (2.0 * blob_sigma * blob_sigma));
      for (int64_t c = 0; c < 3; ++c) {
        const int64_t at = c * plane + h * size + w;
        img[at] = static_cast<float>(background[c] + colour[c] * stripes + blob +
                                     noise_std * static_cast<double>(noise[static_cast<size_t>(at)]));
      }
    }
  }
}

SyntheticImages make_synthetic_images(int64_t n, int64_t size, uint64_t seed, double difficulty) {
  const SyntheticRenderer r(n, size, seed, difficulty);
  std::vector<double> label_values(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) label_values[static_cast<size_t>(i)] = static_cast<double>(r.label(i));
  SyntheticImages out;
  out.labels = from_vector(label_values, {n}, {.dtype = DType::i64});
  out.images = empty({n, 3, size, size});
  float* img = out.images.data<float>();
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) r.render(i, img + i * 3 * size * size);
  return out;
}

}  // namespace minidl::data
