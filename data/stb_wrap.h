// A narrow internal interface to the stb headers, so their implementation is compiled once (in
// data/stb_wrap.cpp, with static linkage: no clash with another copy of stb in a user's program).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "data/dataset.h"

namespace minidl::data::stb {

// Why minidl refuses these bytes before stb reads them ("" when it does not): inputs that reach
// known faults of stb_image (16-bit or absurd PGM / PPM headers, see stb_wrap.cpp).
std::string refused(const uint8_t* data, int size);
bool info(const uint8_t* data, int size, int* w, int* h, int* comp);
// Decodes to 3 channels; nullopt with the reason in *why on failure.
std::optional<Image> load_rgb(const uint8_t* data, int size, std::string* why);
// Resizes an RGB region (row stride in bytes) to out_w x out_h with a triangle filter scaled to
// the reduction (PIL's antialiased BILINEAR, what torchvision uses), edges clamped.
void resize_rgb(const uint8_t* src, int w, int h, int stride, uint8_t* dst, int out_w, int out_h);

}  // namespace minidl::data::stb
