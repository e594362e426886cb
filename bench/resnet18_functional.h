// ResNet-18 (torchvision's layout: 7x7 stem, max pool, four stages of two BasicBlocks, global pool,
// linear) written with the functional ops of core/ops.h, so the CPU benchmark can time a whole
// training step before the nn issue brings real modules. Benchmark-only: not part of the library.
#pragma once
#include <cstdint>
#include <vector>

#include "core/generator.h"
#include "core/ops.h"
#include "core/tensor.h"

namespace minidl::bench {

class ResNet18Functional {
 public:
  // Initialised as torchvision: convolutions Kaiming-normal (fan_out, ReLU), batch norm 1 / 0,
  // the classifier PyTorch's default uniform(+-1/sqrt(fan_in)).
  ResNet18Functional(int64_t num_classes, Generator& gen);
  // x [N,3,H,W]; logits [N,num_classes]. training: batch statistics and running-stat updates.
  Tensor forward(const Tensor& x, bool training);
  std::vector<Tensor> parameters() const;
  int64_t num_parameters() const;

 private:
  struct ConvBn {
    Tensor weight, bn_weight, bn_bias, running_mean, running_var;
    Conv2dOptions conv;
  };
  struct Block {
    ConvBn conv1, conv2;
    bool has_downsample = false;
    ConvBn downsample;
  };
  static ConvBn make_conv_bn(int64_t in_c, int64_t out_c, int64_t k, int64_t stride, int64_t pad, Generator& gen);
  static Tensor conv_bn(const ConvBn& c, const Tensor& x, bool training);

  ConvBn stem_;
  std::vector<Block> blocks_;
  Tensor fc_weight_, fc_bias_;
};

}  // namespace minidl::bench
