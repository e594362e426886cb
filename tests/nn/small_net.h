// The small conv / batch-norm / linear stack the nn tests move, save and compare (a parameter of
// each kind and batch-norm buffers, 8x8 inputs, 5 outputs), shared by the CPU and CUDA suites.
#pragma once
#include <memory>
#include <vector>

#include "core/generator.h"
#include "nn/layers.h"
#include "nn/module.h"

namespace minidl::nn::testing {

inline std::shared_ptr<Sequential> small_net(Generator& gen) {
  return std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
      std::make_shared<Conv2d>(3, 4, 3, 1, 1, 1, true, &gen), std::make_shared<BatchNorm2d>(4),
      std::make_shared<ReLU>(), std::make_shared<MaxPool2d>(2), std::make_shared<Flatten>(),
      std::make_shared<Linear>(4 * 4 * 4, 5, true, &gen)});
}

}  // namespace minidl::nn::testing
