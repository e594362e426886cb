// Weight initialisers with PyTorch's formulas, drawing from a minidl::Generator so a seed fixes a
// model's weights on every device and thread count. Layers use the PyTorch defaults; ResNets
// re-initialise as torchvision does (Kaiming normal, fan_out, ReLU gain).
#pragma once
#include <cstdint>
#include <utility>

#include "core/generator.h"
#include "core/tensor.h"

namespace minidl::nn::init {

enum class FanMode { FanIn, FanOut };

// (fan_in, fan_out) of a weight [out, in, k...] as torch.nn.init._calculate_fan_in_and_fan_out.
std::pair<int64_t, int64_t> fans(const Tensor& w);

// All of these overwrite t in place (under NoGradGuard) and return it; gen null: default_generator().
Tensor uniform_(Tensor t, double low, double high, Generator* gen = nullptr);
Tensor normal_(Tensor t, double mean, double std, Generator* gen = nullptr);
Tensor constant_(Tensor t, double value);
// std = gain / sqrt(fan), gain = sqrt(2 / (1 + a^2)) (leaky ReLU slope a; 0 is ReLU).
Tensor kaiming_normal_(Tensor t, double a = 0.0, FanMode mode = FanMode::FanIn, Generator* gen = nullptr);
// bound = gain * sqrt(3 / fan).
Tensor kaiming_uniform_(Tensor t, double a = 0.0, FanMode mode = FanMode::FanIn, Generator* gen = nullptr);

// Glorot (Xavier) uniform, Keras' default kernel initialiser: bound = gain * sqrt(6 / (fan_in + fan_out)).
Tensor xavier_uniform_(Tensor t, double gain = 1.0, Generator* gen = nullptr);

// PyTorch's default for Conv2d / Linear (reset_parameters): weight kaiming_uniform(a = sqrt(5)),
// i.e. uniform(+-1/sqrt(fan_in)), and bias uniform(+-1/sqrt(fan_in)) when defined.
void pytorch_default_(Tensor weight, Tensor bias, Generator* gen = nullptr);

}  // namespace minidl::nn::init
