// A built-in two-class image set generated in memory from a seed, so every program and test runs
// with no download. The classes differ only in the orientation of a striped patch at a random
// place, so a linear model on pixels or colour statistics stays at chance but a small CNN learns it.
#pragma once
#include <cstdint>
#include <vector>

#include "core/tensor.h"

namespace minidl::data {

struct SyntheticImages {
  Tensor images;  // [N, 3, size, size] f32 on the CPU, roughly zero mean and unit scale
  Tensor labels;  // [N] i64, 0 or 1; exactly ceil(N/2) zeros, in a seeded random order
};

// Each image: a background colour, a soft-edged disc of sinusoidal stripes (random centre, radius
// 22-35% of the size, period 3-8 pixels, phase and colour), pixel noise and a distracting Gaussian
// blob. Class 0 stripes vary along x (orientation 0 deg), class 1 along y (90 deg), each jittered by
// up to difficulty * 45 deg, so at difficulty 1 the classes touch at the diagonal and some images
// are ambiguous. difficulty (in [0, 1]) also scales the noise (std 0.15 + 0.6 * difficulty, times
// 64 / size above 64 px, so the total noise energy stops growing with the pixel count) and the
// blob, and lowers the contrast. At the default, the SmallCnn of nn/functional_cnn.h reaches ~99% at
// 32x32 in five epochs of 2048 images. The same (n, size, seed, difficulty) gives the same images on
// any thread count.
SyntheticImages make_synthetic_images(int64_t n, int64_t size, uint64_t seed, double difficulty = 0.6);

// The same set one image at a time, for datasets that generate lazily (data::synthetic_dataset):
// render(i) gives exactly the values make_synthetic_images puts at images[i], because every draw
// is addressed by its position in the same Philox streams. Holds only the labels and 16 numbers
// per image.
class SyntheticRenderer {
 public:
  SyntheticRenderer(int64_t n, int64_t size, uint64_t seed, double difficulty = 0.6);
  int64_t count() const { return n_; }
  int64_t image_size() const { return size_; }
  int64_t label(int64_t i) const { return labels_[static_cast<size_t>(i)]; }
  // Writes image i as [3, size, size] f32 into out.
  void render(int64_t i, float* out) const;

 private:
  int64_t n_, size_;
  uint64_t seed_;
  double difficulty_;
  uint64_t noise_offset_;
  std::vector<float> params_;
  std::vector<int64_t> labels_;
};

}  // namespace minidl::data
