// The functional ResNet-18 of resnet18_functional.h. Kept next to the benchmark (not in nn/) because
// the nn issue will replace it with Module-based models; until then it is the heaviest realistic
// workload we can time on the CPU.
#include "resnet18_functional.h"

#include <cmath>

namespace minidl::bench {

ResNet18Functional::ConvBn ResNet18Functional::make_conv_bn(int64_t in_c, int64_t out_c, int64_t k, int64_t stride,
                                                            int64_t pad, Generator& gen) {
  ConvBn c;
  const double std_dev = std::sqrt(2.0 / static_cast<double>(out_c * k * k));
  c.weight = normal({out_c, in_c, k, k}, 0.0, std_dev, {}, &gen).set_requires_grad(true);
  c.bn_weight = ones({out_c}).set_requires_grad(true);
  c.bn_bias = zeros({out_c}).set_requires_grad(true);
  c.running_mean = zeros({out_c});
  c.running_var = ones({out_c});
  c.conv.stride = {stride, stride};
  c.conv.padding = {pad, pad};
  return c;
}

Tensor ResNet18Functional::conv_bn(const ConvBn& c, const Tensor& x, bool training) {
  return batch_norm(conv2d(x, c.weight, Tensor(), c.conv), c.bn_weight, c.bn_bias, c.running_mean, c.running_var,
                    training);
}

ResNet18Functional::ResNet18Functional(int64_t num_classes, Generator& gen) {
  stem_ = make_conv_bn(3, 64, 7, 2, 3, gen);
  int64_t in_c = 64;
  for (const int64_t out_c : {64, 128, 256, 512}) {
    for (int b = 0; b < 2; ++b) {
      const int64_t stride = (b == 0 && out_c != 64) ? 2 : 1;
      Block blk;
      blk.conv1 = make_conv_bn(in_c, out_c, 3, stride, 1, gen);
      blk.conv2 = make_conv_bn(out_c, out_c, 3, 1, 1, gen);
      if (stride != 1 || in_c != out_c) {
        blk.has_downsample = true;
        blk.downsample = make_conv_bn(in_c, out_c, 1, stride, 0, gen);
      }
      blocks_.push_back(blk);
      in_c = out_c;
    }
  }
  const double bound = 1.0 / std::sqrt(512.0);
  fc_weight_ = uniform({num_classes, 512}, -bound, bound, {}, &gen).set_requires_grad(true);
  fc_bias_ = uniform({num_classes}, -bound, bound, {}, &gen).set_requires_grad(true);
}

Tensor ResNet18Functional::forward(const Tensor& x, bool training) {
  Pool2dOptions pool;
  pool.kernel = {3, 3};
  pool.stride = {2, 2};
  pool.padding = {1, 1};
  Tensor h = max_pool2d(relu(conv_bn(stem_, x, training)), pool);
  for (const Block& blk : blocks_) {
    const Tensor identity = blk.has_downsample ? conv_bn(blk.downsample, h, training) : h;
    const Tensor out = conv_bn(blk.conv2, relu(conv_bn(blk.conv1, h, training)), training);
    h = relu(out + identity);
  }
  return linear(adaptive_avg_pool2d(h).flatten(1), fc_weight_, fc_bias_);
}

std::vector<Tensor> ResNet18Functional::parameters() const {
  std::vector<Tensor> p;
  auto add = [&](const ConvBn& c) {
    p.push_back(c.weight);
    p.push_back(c.bn_weight);
    p.push_back(c.bn_bias);
  };
  add(stem_);
  for (const Block& blk : blocks_) {
    add(blk.conv1);
    add(blk.conv2);
    if (blk.has_downsample) add(blk.downsample);
  }
  p.push_back(fc_weight_);
  p.push_back(fc_bias_);
  return p;
}

int64_t ResNet18Functional::num_parameters() const {
  int64_t total = 0;
  for (const Tensor& t : parameters()) total += t.numel();
  return total;
}

}  // namespace minidl::bench
