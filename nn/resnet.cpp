// torchvision's ResNet builder (torchvision/models/resnet.py) transcribed: same module tree, same
// registration order (so state_dict order matches), same initialisation pass after construction.
// A small-input stem is the one addition, for CPU-sized images.
#include "nn/resnet.h"

#include "nn/init.h"

namespace minidl::nn {

namespace {

std::shared_ptr<Conv2d> conv3x3(int64_t in, int64_t out, int64_t stride, Generator* gen) {
  return std::make_shared<Conv2d>(in, out, 3, stride, 1, 1, false, gen);
}

std::shared_ptr<Conv2d> conv1x1(int64_t in, int64_t out, int64_t stride, Generator* gen) {
  return std::make_shared<Conv2d>(in, out, 1, stride, 0, 1, false, gen);
}

}  // namespace

BasicBlock::BasicBlock(int64_t inplanes, int64_t planes, int64_t stride, std::shared_ptr<Module> downsample,
                       Generator* gen)
    : ResidualBlock("BasicBlock") {
  conv1_ = register_module("conv1", conv3x3(inplanes, planes, stride, gen));
  bn1_ = register_module("bn1", std::make_shared<BatchNorm2d>(planes));
  relu_ = register_module("relu", std::make_shared<ReLU>());
  conv2_ = register_module("conv2", conv3x3(planes, planes, 1, gen));
  bn2_ = register_module("bn2", std::make_shared<BatchNorm2d>(planes));
  if (downsample) downsample_ = register_module("downsample", std::move(downsample));
}

bool ResidualBlock::chained(ConvBnPairs pairs) const {
  if (!conv_bn_ || Module::summarizing()) return false;
  for (const auto& [conv, bn] : pairs) {
    if (bn->synchronised()) return false;
  }
  return true;
}

Tensor ResidualBlock::chain_forward(const Tensor& x, ConvBnPairs pairs) {
  Tensor in = x;
  BnAffine a;   // undefined before the first convolution: it reads the block's input as it is
  for (const auto& [conv, bn] : pairs) {
    const ConvStats s = conv2d_stats(in, a.scale, a.bias, conv->weight(), conv->options());
    a = bn->affine(s);
    in = s.y;
  }
  return scale_bias_relu(in, a.scale, a.bias, identity(x));
}

Tensor BasicBlock::forward(const Tensor& x) {
  const ConvBnPairs pairs{{conv1_.get(), bn1_.get()}, {conv2_.get(), bn2_.get()}};
  if (chained(pairs)) return chain_forward(x, pairs);
  if (fused_ && !Module::summarizing()) {
    const Tensor out = (*conv2_)(bn1_->forward_relu((*conv1_)(x)));
    return bn2_->forward_relu(out, identity(x));
  }
  Tensor out = (*relu_)((*bn1_)((*conv1_)(x)));
  out = (*bn2_)((*conv2_)(out));
  return (*relu_)(out + identity(x));
}

Bottleneck::Bottleneck(int64_t inplanes, int64_t planes, int64_t stride, std::shared_ptr<Module> downsample,
                       Generator* gen)
    : ResidualBlock("Bottleneck") {
  conv1_ = register_module("conv1", conv1x1(inplanes, planes, 1, gen));
  bn1_ = register_module("bn1", std::make_shared<BatchNorm2d>(planes));
  conv2_ = register_module("conv2", conv3x3(planes, planes, stride, gen));
  bn2_ = register_module("bn2", std::make_shared<BatchNorm2d>(planes));
  conv3_ = register_module("conv3", conv1x1(planes, planes * kExpansion, 1, gen));
  bn3_ = register_module("bn3", std::make_shared<BatchNorm2d>(planes * kExpansion));
  relu_ = register_module("relu", std::make_shared<ReLU>());
  if (downsample) downsample_ = register_module("downsample", std::move(downsample));
}

Tensor Bottleneck::forward(const Tensor& x) {
  const ConvBnPairs pairs{{conv1_.get(), bn1_.get()}, {conv2_.get(), bn2_.get()}, {conv3_.get(), bn3_.get()}};
  if (chained(pairs)) return chain_forward(x, pairs);
  if (fused_ && !Module::summarizing()) {
    Tensor out = bn1_->forward_relu((*conv1_)(x));
    out = (*conv3_)(bn2_->forward_relu((*conv2_)(out)));
    return bn3_->forward_relu(out, identity(x));
  }
  Tensor out = (*relu_)((*bn1_)((*conv1_)(x)));
  out = (*relu_)((*bn2_)((*conv2_)(out)));
  out = (*bn3_)((*conv3_)(out));
  return (*relu_)(out + identity(x));
}

ResNet::ResNet(const ResNetOptions& opts, Generator* gen) : Module("ResNet"), opts_(opts) {
  MINIDL_CHECK(opts.layers.size() == 4, "ResNet: layers must list 4 stage depths (e.g. {2, 2, 2, 2}), got ",
               opts.layers.size());
  for (int64_t n : opts.layers) MINIDL_CHECK(n > 0, "ResNet: every stage needs at least one block, got ", n);
  MINIDL_CHECK(opts.num_classes > 0, "ResNet: num_classes must be positive, got ", opts.num_classes);
  if (opts.small_input) {
    conv1_ = register_module("conv1", std::make_shared<Conv2d>(3, 64, 3, 1, 1, 1, false, gen));
  } else {
    conv1_ = register_module("conv1", std::make_shared<Conv2d>(3, 64, 7, 2, 3, 1, false, gen));
  }
  bn1_ = register_module("bn1", std::make_shared<BatchNorm2d>(64));
  relu_ = register_module("relu", std::make_shared<ReLU>());
  if (!opts.small_input) maxpool_ = register_module("maxpool", std::make_shared<MaxPool2d>(3, 2, 1));
  const int64_t planes[4] = {64, 128, 256, 512};
  for (int i = 0; i < 4; ++i) {
    layers_.push_back(register_module("layer" + std::to_string(i + 1),
                                      make_layer(planes[i], opts.layers[static_cast<size_t>(i)], i == 0 ? 1 : 2, gen)));
  }
  avgpool_ = register_module("avgpool", std::make_shared<AdaptiveAvgPool2d>(1));
  const int64_t expansion = opts.block == BlockKind::Basic ? BasicBlock::kExpansion : Bottleneck::kExpansion;
  fc_ = register_module("fc", std::make_shared<Linear>(512 * expansion, opts.num_classes, true, gen));

  // torchvision's initialisation pass, in module order.
  for (auto& [name, m] : named_modules()) {
    if (auto* conv = dynamic_cast<Conv2d*>(m)) {
      init::kaiming_normal_(conv->weight(), 0.0, init::FanMode::FanOut, gen);
    } else if (auto* bn = dynamic_cast<BatchNorm2d*>(m)) {
      init::constant_(bn->weight(), 1.0);
      init::constant_(bn->bias(), 0.0);
    }
  }
  if (opts.zero_init_residual) for_each_block([](ResidualBlock& b) { init::constant_(b.last_bn()->weight(), 0.0); });
  set_fused_bn_relu(opts.fused_bn_relu);
  set_conv_bn_chain(opts.conv_bn_chain);
}

void ResNet::set_conv_bn_chain(bool on) {
  opts_.conv_bn_chain = on;
  for_each_block([on](ResidualBlock& b) { b.set_conv_bn_chain(on); });
}

void ResNet::set_fused_bn_relu(bool on) {
  opts_.fused_bn_relu = on;
  for_each_block([on](ResidualBlock& b) { b.set_fused_bn_relu(on); });
}

void ResNet::for_each_block(const std::function<void(ResidualBlock&)>& fn) {
  for (auto& [name, m] : named_modules()) {
    if (auto* b = dynamic_cast<ResidualBlock*>(m)) fn(*b);
  }
}

std::shared_ptr<Sequential> ResNet::make_layer(int64_t planes, int64_t blocks, int64_t stride, Generator* gen) {
  const bool basic = opts_.block == BlockKind::Basic;
  const int64_t expansion = basic ? BasicBlock::kExpansion : Bottleneck::kExpansion;
  auto make_block = [&](int64_t in, int64_t s, std::shared_ptr<Module> ds) -> std::shared_ptr<Module> {
    if (basic) return std::make_shared<BasicBlock>(in, planes, s, std::move(ds), gen);
    return std::make_shared<Bottleneck>(in, planes, s, std::move(ds), gen);
  };
  std::shared_ptr<Module> downsample;
  if (stride != 1 || inplanes_ != planes * expansion) {
    downsample = std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{
        conv1x1(inplanes_, planes * expansion, stride, gen), std::make_shared<BatchNorm2d>(planes * expansion)});
  }
  auto layer = std::make_shared<Sequential>();
  layer->push_back(make_block(inplanes_, stride, downsample));
  inplanes_ = planes * expansion;
  for (int64_t i = 1; i < blocks; ++i) layer->push_back(make_block(inplanes_, 1, nullptr));
  return layer;
}

ChainLink ResNet::stem() {
  ChainLink link{"stem", nullptr, {conv1_, bn1_, relu_}};
  if (maxpool_) link.modules.push_back(maxpool_);
  link.run = [this](const Tensor& x) {
    const bool fused = opts_.fused_bn_relu && !Module::summarizing();
    Tensor h = fused ? bn1_->forward_relu((*conv1_)(x)) : (*relu_)((*bn1_)((*conv1_)(x)));
    return maxpool_ ? (*maxpool_)(h) : h;
  };
  return link;
}

std::shared_ptr<Sequential> ResNet::stage(int i) const {
  MINIDL_CHECK(i >= 1 && i <= 4, "ResNet::stage(", i, "): stages are numbered 1..4 (layer1..layer4)");
  return layers_[static_cast<size_t>(i - 1)];
}

ChainLink ResNet::head() {
  ChainLink link{"head", nullptr, {avgpool_, fc_}};
  link.run = [this](const Tensor& x) { return (*fc_)((*avgpool_)(x).flatten(1)); };
  return link;
}

std::vector<ChainLink> ResNet::stages() {
  std::vector<ChainLink> out{stem()};
  for (int i = 1; i <= 4; ++i) {
    Sequential* layer = stage(i).get();
    out.push_back({"layer" + std::to_string(i), [layer](const Tensor& x) { return (*layer)(x); }, {stage(i)}});
  }
  out.push_back(head());
  return out;
}

std::vector<ChainLink> ResNet::chain() {
  std::vector<ChainLink> out{stem()};
  for (int i = 1; i <= 4; ++i) {
    for (const auto& [name, block] : stage(i)->named_children()) {
      Module* b = block.get();
      out.push_back({"layer" + std::to_string(i) + "." + name, [b](const Tensor& x) { return (*b)(x); }, {block}});
    }
  }
  out.push_back(head());
  return out;
}

Tensor ResNet::forward(const Tensor& x) {
  Tensor h = x;
  for (const ChainLink& link : stages()) h = link.run(h);
  return h;
}

namespace {

std::shared_ptr<ResNet> make(BlockKind kind, std::vector<int64_t> layers, int64_t num_classes, Generator* gen,
                             bool zero_init_residual, bool small_input) {
  ResNetOptions o;
  o.block = kind;
  o.layers = std::move(layers);
  o.num_classes = num_classes;
  o.zero_init_residual = zero_init_residual;
  o.small_input = small_input;
  return std::make_shared<ResNet>(o, gen);
}

}  // namespace

std::shared_ptr<ResNet> resnet18(int64_t num_classes, Generator* gen, bool zero_init_residual, bool small_input) {
  return make(BlockKind::Basic, {2, 2, 2, 2}, num_classes, gen, zero_init_residual, small_input);
}

std::shared_ptr<ResNet> resnet34(int64_t num_classes, Generator* gen, bool zero_init_residual, bool small_input) {
  return make(BlockKind::Basic, {3, 4, 6, 3}, num_classes, gen, zero_init_residual, small_input);
}

std::shared_ptr<ResNet> resnet50(int64_t num_classes, Generator* gen, bool zero_init_residual, bool small_input) {
  return make(BlockKind::Bottleneck, {3, 4, 6, 3}, num_classes, gen, zero_init_residual, small_input);
}

}  // namespace minidl::nn
