// The small batch-norm CNN several end-to-end tests train (AMP, pure f16): one definition so
// the tests compare the same model. conv3x3(16) -> bn -> relu -> maxpool 2 -> conv3x3(32) -> bn ->
// relu -> global average pool -> linear(2).
#pragma once
#include <cstdint>
#include <memory>

#include "core/generator.h"
#include "nn/layers.h"

namespace minidl::testing {

inline std::shared_ptr<nn::Sequential> make_small_bn_cnn(uint64_t seed) {
  Generator gen(seed);
  auto m = std::make_shared<nn::Sequential>();
  m->push_back(std::make_shared<nn::Conv2d>(3, 16, 3, 1, 1, 1, false, &gen));
  m->push_back(std::make_shared<nn::BatchNorm2d>(16));
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::MaxPool2d>(2));
  m->push_back(std::make_shared<nn::Conv2d>(16, 32, 3, 1, 1, 1, false, &gen));
  m->push_back(std::make_shared<nn::BatchNorm2d>(32));
  m->push_back(std::make_shared<nn::ReLU>());
  m->push_back(std::make_shared<nn::AdaptiveAvgPool2d>(1));
  m->push_back(std::make_shared<nn::Flatten>(1));
  m->push_back(std::make_shared<nn::Linear>(32, 2, true, &gen));
  return m;
}

}  // namespace minidl::testing
