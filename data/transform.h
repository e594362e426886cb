// The per-sample image transforms of the loader, split in two so the RAM cache can sit between
// them: make_base (deterministic resize, what the cache keeps) and apply_transform (the random
// crop and flip, drawn from a counter-based stream keyed by (seed, epoch) and the sample index).
#pragma once
#include <array>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "data/dataset.h"
#include "data/loader.h"

namespace minidl::data {

// The shorter side (None with Fit::ShorterCrop) or square side (Keras) before cropping; 0 in the
// options means size for None (an image of size x size is left as it is) and size * 250 / 200
// for Keras.
int64_t resolved_resize(const TransformOptions& t);

// torchvision's ImageNet evaluation resize for a crop of `size`: size * 256 / 224, rounded (73
// for 64, 256 for 224); set it as TransformOptions::resize for Resize(256) + CenterCrop(224).
int64_t imagenet_resize(int64_t size);

// The image the random part starts from: None with ShorterCrop resizes the shorter side to
// resolved_resize (as torchvision's Resize(int), the longer side truncated), None with Squash
// resizes to size x size; Keras squashes to resize x resize (as Keras' target_size);
// RandomResizedCrop keeps the decoded image.
Image make_base(Image decoded, const TransformOptions& t);

// The Philox key of one epoch's draws: shuffle and augmentation depend on (seed, epoch) only.
uint64_t epoch_key(uint64_t seed, int64_t epoch, uint64_t stream);

// Crops (centre or random), resizes and flips `base` into out (size x size x 3, HWC). The draws
// are a function of (key, index) alone, so any worker produces the same pixels.
void apply_transform(const Image& base, const TransformOptions& t, uint64_t key, int64_t index, uint8_t* out);

// The crop box torchvision's RandomResizedCrop.get_params would choose (scale (0.08, 1), ratio
// (3/4, 4/3), 10 attempts then a centre crop), from the sample's uniform draws.
struct CropBox {
  int64_t top = 0, left = 0, height = 0, width = 0;
};
CropBox random_resized_crop_box(int64_t height, int64_t width, uint64_t key, int64_t index);

// Converts HWC u8 samples into one slot of a batch: per-channel lookup tables (256 entries) make
// normalisation and the f16 conversion a table read per element.
class BatchWriter {
 public:
  BatchWriter(const TransformOptions& t, DType dtype, bool channels_last);
  // batch points at the batch tensor's data ([N,3,S,S] or [N,S,S,3] of dtype).
  void write(const uint8_t* hwc, void* batch, int64_t slot) const;
  // The bytes of one sample in the batch: slot k starts at k * sample_bytes() (both layouts).
  int64_t sample_bytes() const { return size_ * size_ * 3 * static_cast<int64_t>(dtype_size(dtype_)); }

 private:
  int64_t size_;
  DType dtype_;
  bool channels_last_;
  std::array<std::array<float, 256>, 3> lut32_{};
  std::array<std::array<uint16_t, 256>, 3> lut16_{};
};

}  // namespace minidl::data
