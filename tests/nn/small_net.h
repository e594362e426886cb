// The small conv / batch-norm / linear stack the nn tests move, save and compare (a parameter of
// each kind and batch-norm buffers, 8x8 inputs, 5 outputs), shared by the CPU and CUDA suites; and
// the short ResNets of the fused and channels-last tests.
#pragma once
#include <memory>
#include <vector>

#include "core/generator.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "nn/resnet.h"

namespace minidl::nn::testing {

inline std::shared_ptr<Sequential> small_net(Generator& gen) {
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Conv2d>(3, 4, 3, 1, 1, 1, true, &gen), std::make_shared<BatchNorm2d>(4),
      std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(2), std::make_shared<Flatten>(),
      std::make_shared<Linear>(4 * 4 * 4, 5, true, &gen)});
}

// Short ResNets (one or two blocks per stage, small-input stem) keep each test cheap while covering
// the stem, blocks with a downsample branch and a block whose identity is its input.
inline std::shared_ptr<ResNet> short_resnet(BlockKind kind, uint64_t seed) {
  ResNetOptions o;
  o.block = kind;
  o.layers = {2, 1, 1, 1};
  o.num_classes = 10;
  o.small_input = true;
  Generator gen(seed);
  return std::make_shared<ResNet>(o, &gen);
}

}  // namespace minidl::nn::testing
