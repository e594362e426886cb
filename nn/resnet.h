// ResNet-18/34/50 with torchvision's exact module tree, names, shapes and initialisation, so
// state_dicts interchange with torchvision.models.resnet*. The stages are exposed as a chain of
// callables so recomputation (checkpointing) can wrap any stage or run of blocks.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/generator.h"
#include "nn/layers.h"
#include "nn/module.h"

namespace minidl::nn {

// What both residual blocks share: the switch to the fused ops, the final ReLU, the identity branch
// (the input or `downsample` of it) and the last batch norm, whose weight zero_init_residual zeroes.
class ResidualBlock : public Module {
 public:
  using Module::Module;
  virtual std::shared_ptr<BatchNorm2d> last_bn() const = 0;
  // The batch norms followed by a ReLU, and the last one with the add and ReLU, run as the fused
  // ops (BatchNorm2d::forward_relu); default on.
  void set_fused_bn_relu(bool on) { fused_ = on; }
  bool fused_bn_relu() const { return fused_; }
  // The convolutions carry the batch norms (ResNetOptions::conv_bn_chain); off by default.
  void set_conv_bn_chain(bool on) { conv_bn_ = on; }
  bool conv_bn_chain() const { return conv_bn_; }

 protected:
  Tensor identity(const Tensor& x) { return downsample_ ? (*downsample_)(x) : x; }
  // The block's convolution -> batch norm pairs, in order.
  using ConvBnPairs = std::initializer_list<std::pair<Conv2d*, BatchNorm2d*>>;
  // Whether this forward runs the chain: switched on, not summarising, no synchronised batch norm.
  bool chained(ConvBnPairs pairs) const;
  // The block as the chain: each convolution reads the previous pair's affine, the last affine
  // ends in scale_bias_relu with the identity branch.
  Tensor chain_forward(const Tensor& x, ConvBnPairs pairs);

  std::shared_ptr<ReLU> relu_;
  std::shared_ptr<Module> downsample_;
  bool fused_ = true;
  bool conv_bn_ = false;
};

// conv3x3 -> bn -> relu -> conv3x3 -> bn, plus the identity or `downsample`, then relu.
class BasicBlock : public ResidualBlock {
 public:
  static constexpr int64_t kExpansion = 1;
  BasicBlock(int64_t inplanes, int64_t planes, int64_t stride, std::shared_ptr<Module> downsample, Generator* gen);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<BatchNorm2d> last_bn() const override { return bn2_; }

 private:
  std::shared_ptr<Conv2d> conv1_, conv2_;
  std::shared_ptr<BatchNorm2d> bn1_, bn2_;
};

// v1.5 (torchvision): 1x1 reduce -> 3x3 carrying the stride -> 1x1 expand (x4).
class Bottleneck : public ResidualBlock {
 public:
  static constexpr int64_t kExpansion = 4;
  Bottleneck(int64_t inplanes, int64_t planes, int64_t stride, std::shared_ptr<Module> downsample, Generator* gen);
  Tensor forward(const Tensor& x) override;
  std::shared_ptr<BatchNorm2d> last_bn() const override { return bn3_; }

 private:
  std::shared_ptr<Conv2d> conv1_, conv2_, conv3_;
  std::shared_ptr<BatchNorm2d> bn1_, bn2_, bn3_;
};

enum class BlockKind { Basic, Bottleneck };

struct ResNetOptions {
  BlockKind block = BlockKind::Basic;
  std::vector<int64_t> layers{2, 2, 2, 2};
  int64_t num_classes = 1000;
  // Zero the last BN weight of every block so each residual branch starts as the identity.
  bool zero_init_residual = false;
  // 3x3 stride-1 stem and no max-pool, for 32-96 px inputs. The state_dict keys stay the same
  // (conv1.weight becomes [64, 3, 3, 3]; maxpool has no state and is simply not registered).
  bool small_input = false;
  // Each batch norm followed by a ReLU (the stem's, each block's inner ones) and each block's tail
  // (last batch norm + identity or downsample + ReLU) run as one fused op (core batch_norm_relu /
  // batch_norm_add_relu: fewer passes over the activations, ReLU's backward folded into batch
  // norm's). The module tree, state_dict and values are the composed ops' (in f32 and f64 on the
  // CPU, bit for bit); off runs the modules one by one. summary() always does.
  bool fused_bn_relu = true;
  // Batch norm carried by the convolutions (core/conv_bn.h, docs/conv_bn.md): each block's
  // convolutions emit their output's statistics and apply the previous batch norm's scale, bias
  // and ReLU to their input, and the block ends in one scale + bias + add + ReLU. Same module tree,
  // parameters, running statistics and (up to rounding) values. For backends with fused
  // convolution graphs; elsewhere it runs as a composition, slower than the fused batch norms.
  bool conv_bn_chain = false;
};

// One link of ResNet::chain(): composing the links in order is forward().
struct ChainLink {
  std::string name;                                  // "stem", "layer1", "layer1.0", "head"
  std::function<Tensor(const Tensor&)> run;          // calls the modules through operator()
  std::vector<std::shared_ptr<Module>> modules;      // the modules it runs (for profiling, train/eval)
};

class ResNet : public Module {
 public:
  ResNet(const ResNetOptions& opts, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;

  // Recomputation hooks. The links capture `this`: use them only while the ResNet is alive.
  // stages(): stem (conv1, bn1, relu, maxpool), layer1..layer4, head (avgpool, flatten, fc): 6 links.
  std::vector<ChainLink> stages();
  // chain(): stem, every block ("layer1.0", ...), head: the finest split a planner can use.
  std::vector<ChainLink> chain();
  ChainLink stem();
  std::shared_ptr<Sequential> stage(int i) const;   // layer1..layer4 for i = 1..4
  ChainLink head();
  const ResNetOptions& options() const { return opts_; }
  // Switches ResNetOptions::fused_bn_relu for the stem and every block (between steps: the
  // parameters and buffers are the same either way).
  void set_fused_bn_relu(bool on);
  // Switches ResNetOptions::conv_bn_chain for every block (between steps).
  void set_conv_bn_chain(bool on);

 private:
  void for_each_block(const std::function<void(ResidualBlock&)>& fn);
  std::shared_ptr<Sequential> make_layer(int64_t planes, int64_t blocks, int64_t stride, Generator* gen);

  ResNetOptions opts_;
  int64_t inplanes_ = 64;
  std::shared_ptr<Conv2d> conv1_;
  std::shared_ptr<BatchNorm2d> bn1_;
  std::shared_ptr<ReLU> relu_;
  std::shared_ptr<MaxPool2d> maxpool_;   // null with small_input
  std::vector<std::shared_ptr<Sequential>> layers_;
  std::shared_ptr<AdaptiveAvgPool2d> avgpool_;
  std::shared_ptr<Linear> fc_;
};

// torchvision.models.resnet18/34/50 (weights=None) with `num_classes` outputs.
std::shared_ptr<ResNet> resnet18(int64_t num_classes = 1000, Generator* gen = nullptr, bool zero_init_residual = false,
                                 bool small_input = false);
std::shared_ptr<ResNet> resnet34(int64_t num_classes = 1000, Generator* gen = nullptr, bool zero_init_residual = false,
                                 bool small_input = false);
std::shared_ptr<ResNet> resnet50(int64_t num_classes = 1000, Generator* gen = nullptr, bool zero_init_residual = false,
                                 bool small_input = false);

}  // namespace minidl::nn
