// Layer constructors and forwards of nn/layers.h. Shape checks here name the layer and its
// configuration, which the op-level errors cannot (they do not know which module called them).
#include "nn/layers.h"

#include <cmath>

#include "core/autograd.h"
#include "nn/init.h"

namespace minidl::nn {

Conv2d::Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride, int64_t padding,
               int64_t dilation, bool bias, Generator* gen)
    : Module("Conv2d"), in_channels_(in_channels) {
  MINIDL_CHECK(in_channels > 0 && out_channels > 0 && kernel_size > 0 && stride > 0 && padding >= 0 && dilation > 0,
               "Conv2d(", in_channels, ", ", out_channels, ", kernel ", kernel_size, ", stride ", stride, ", padding ",
               padding, ", dilation ", dilation, "): channels, kernel, stride and dilation must be positive and padding >= 0");
  opts_.stride = {stride, stride};
  opts_.padding = {padding, padding};
  opts_.dilation = {dilation, dilation};
  weight_ = register_parameter("weight", empty({out_channels, in_channels, kernel_size, kernel_size}));
  if (bias) bias_ = register_parameter("bias", empty({out_channels}));
  init::pytorch_default_(weight_, bias_, gen);
}

Tensor Conv2d::forward(const Tensor& x) {
  MINIDL_CHECK(x.dim() == 4 && x.size(1) == in_channels_, "Conv2d(", in_channels_, " -> ", weight_.size(0),
               ", kernel ", weight_.size(2), "): expected input [N, ", in_channels_, ", H, W], got ", x.meta());
  return conv2d(x, weight_, bias_, opts_);
}

BatchNorm2d::BatchNorm2d(int64_t num_features, double eps, double momentum)
    : Module("BatchNorm2d"), num_features_(num_features), eps_(eps), momentum_(momentum) {
  MINIDL_CHECK(num_features > 0 && eps > 0 && momentum >= 0 && momentum <= 1, "BatchNorm2d(", num_features, ", eps ",
               eps, ", momentum ", momentum, "): need num_features > 0, eps > 0 and momentum in [0, 1]");
  weight_ = register_parameter("weight", ones({num_features}));
  bias_ = register_parameter("bias", zeros({num_features}));
  running_mean_ = register_buffer("running_mean", zeros({num_features}));
  running_var_ = register_buffer("running_var", ones({num_features}));
  num_batches_tracked_ = register_buffer("num_batches_tracked", zeros({}, {.dtype = DType::i64}));
  one_ = scalar_tensor(1.0, num_batches_tracked_.options());
}

void BatchNorm2d::moved_to(Device device) {
  if (one_.device() != device) one_ = scalar_tensor(1.0, num_batches_tracked_.options());
}

void BatchNorm2d::check_input(const Tensor& x) const {
  MINIDL_CHECK(x.dim() == 4 && x.size(1) == num_features_, "BatchNorm2d(", num_features_, "): expected input [N, ",
               num_features_, ", H, W], got ", x.meta());
}

void BatchNorm2d::count_batch() {
  if (is_training() && !recomputing()) {  // a checkpoint rerun is not a new batch
    NoGradGuard no_grad;
    num_batches_tracked_.add_(one_);   // one_ follows the counter (the constructor, moved_to)
  }
}

Tensor BatchNorm2d::forward(const Tensor& x) {
  check_input(x);
  Tensor out = reduce_ && is_training()
                   ? sync_forward(x)
                   : batch_norm(x, weight_, bias_, running_mean_, running_var_, is_training(), momentum_, eps_);
  count_batch();
  return out;
}

Tensor BatchNorm2d::forward_relu(const Tensor& x, const Tensor& residual) {
  if ((reduce_ && is_training()) || (residual.defined() && residual.dtype() != x.dtype())) {
    const Tensor out = forward(x);
    return relu(residual.defined() ? out + residual : out);
  }
  check_input(x);
  Tensor out = residual.defined() ? batch_norm_add_relu(x, residual, weight_, bias_, running_mean_, running_var_,
                                                        is_training(), momentum_, eps_)
                                  : batch_norm_relu(x, weight_, bias_, running_mean_, running_var_, is_training(),
                                                    momentum_, eps_);
  count_batch();
  return out;
}

BnAffine BatchNorm2d::affine(const ConvStats& stats) {
  MINIDL_CHECK(!synchronised(), "BatchNorm2d(", num_features_, ", synchronised): the conv + batch-norm chain "
               "needs this process's statistics; turn the chain off (ResNet::set_conv_bn_chain(false))");
  MINIDL_CHECK(!stats.y.defined() || stats.y.size(1) == num_features_, "BatchNorm2d(", num_features_,
               "): statistics of ", stats.y.size(1), " channels");
  if (!is_training()) return bn_running_affine(weight_, bias_, running_mean_, running_var_, eps_);
  BnAffine a = bn_finalize(stats, weight_, bias_, running_mean_, running_var_, momentum_, eps_);
  count_batch();
  return a;
}

// Two passes (mean, then squared deviations) in f32 or f64, with minidl's differentiable ops, so
// autograd derives the backward; the reductions over processes are reduce_'s.
Tensor BatchNorm2d::sync_forward(const Tensor& x) {
  const int64_t c = num_features_;
  const Tensor xf = is_float16(x.dtype()) ? x.to(DType::f32) : x;
  const std::vector<int64_t> dims{0, 2, 3};
  const Shape per_channel{1, c, 1, 1};
  Tensor count = full({1}, static_cast<double>(x.numel() / c), {.dtype = DType::f64});
  const double n = reduce_(count).item();
  MINIDL_CHECK(n > 1.0, "BatchNorm2d(", c, ", synchronised): ", n, " value(s) per channel over all processes; ",
               "batch statistics need more than one");
  const Tensor mean = reduce_(sum(xf, dims)) * (1.0 / n);
  const Tensor centred = xf - mean.view(per_channel);
  const Tensor var = reduce_(sum(square(centred), dims)) * (1.0 / n);  // biased, as normalisation uses
  Tensor out = centred / sqrt(var + eps_).view(per_channel);
  if (weight_.defined()) out = out * weight_.view(per_channel) + bias_.view(per_channel);
  if (!recomputing()) {
    NoGradGuard no_grad;
    running_mean_.mul_(1.0 - momentum_).add_(mean.detach().to(running_mean_.dtype()), momentum_);
    running_var_.mul_(1.0 - momentum_).add_(var.detach().to(running_var_.dtype()), momentum_ * n / (n - 1.0));
  }
  return is_float16(x.dtype()) ? out.to(x.dtype()) : out;
}

Linear::Linear(int64_t in_features, int64_t out_features, bool bias, Generator* gen)
    : Module("Linear"), in_features_(in_features) {
  MINIDL_CHECK(in_features > 0 && out_features > 0, "Linear(", in_features, ", ", out_features,
               "): feature counts must be positive");
  weight_ = register_parameter("weight", empty({out_features, in_features}));
  if (bias) bias_ = register_parameter("bias", empty({out_features}));
  init::pytorch_default_(weight_, bias_, gen);
}

Tensor Linear::forward(const Tensor& x) {
  MINIDL_CHECK(x.dim() >= 1 && x.size(-1) == in_features_, "Linear(", in_features_, " -> ", weight_.size(0),
               "): expected input [..., ", in_features_, "], got ", x.meta(),
               "; flatten convolutional features first (nn::Flatten)");
  return linear(x, weight_, bias_);
}

MaxPool2d::MaxPool2d(int64_t kernel_size, int64_t stride, int64_t padding, bool ceil_mode) : Module("MaxPool2d") {
  opts_.kernel = {kernel_size, kernel_size};
  opts_.stride = {stride, stride};
  opts_.padding = {padding, padding};
  opts_.ceil_mode = ceil_mode;
}

AvgPool2d::AvgPool2d(int64_t kernel_size, int64_t stride, int64_t padding, bool ceil_mode, bool count_include_pad)
    : Module("AvgPool2d") {
  opts_.kernel = {kernel_size, kernel_size};
  opts_.stride = {stride, stride};
  opts_.padding = {padding, padding};
  opts_.ceil_mode = ceil_mode;
  opts_.count_include_pad = count_include_pad;
}

AdaptiveAvgPool2d::AdaptiveAvgPool2d(int64_t output_size) : Module("AdaptiveAvgPool2d") {
  MINIDL_CHECK(output_size == 1, "AdaptiveAvgPool2d(", output_size,
               "): only output size 1 (global average pooling) is supported");
}

Dropout::Dropout(double p, Generator* gen) : Module("Dropout"), p_(p), gen_(gen) {
  MINIDL_CHECK(p >= 0 && p < 1, "Dropout(", p, "): p must be in [0, 1)");
}

Sequential::Sequential(const std::vector<std::shared_ptr<Module>>& modules) : Module("Sequential") {
  for (const auto& m : modules) push_back(m);
}

void Sequential::push_back(std::shared_ptr<Module> m) { add_child(std::to_string(size()), std::move(m)); }

std::shared_ptr<Module> Sequential::operator[](size_t i) const {
  MINIDL_CHECK(i < size(), "Sequential: index ", i, " out of range for ", size(), " modules");
  return named_children()[i].second;
}

Tensor Sequential::forward(const Tensor& x) {
  Tensor h = x;
  for (const auto& [name, m] : named_children()) h = (*m)(h);
  return h;
}

}  // namespace minidl::nn
