// The layers ResNets and the small CNN are built from, as Modules with PyTorch's parameter names,
// shapes and default initialisation, so their state_dict keys match torch.nn exactly. Randomness
// (initialisation, dropout) comes from the Generator passed in, or default_generator() when null.
#pragma once
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "core/conv_bn.h"
#include "core/generator.h"
#include "core/ops.h"
#include "nn/module.h"

namespace minidl::nn {

// weight [out, in, k, k], bias [out] when `bias`. PyTorch's default initialisation.
class Conv2d : public Module {
 public:
  Conv2d(int64_t in_channels, int64_t out_channels, int64_t kernel_size, int64_t stride = 1, int64_t padding = 0,
         int64_t dilation = 1, bool bias = true, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }  // undefined without bias
  const Conv2dOptions& options() const { return opts_; }

 private:
  int64_t in_channels_;
  Conv2dOptions opts_;
  Tensor weight_, bias_;
};

// weight 1, bias 0, running_mean 0, running_var 1, num_batches_tracked (i64 scalar) counting the
// training-mode forwards, as PyTorch.
class BatchNorm2d : public Module {
 public:
  explicit BatchNorm2d(int64_t num_features, double eps = 1e-5, double momentum = 0.1);
  Tensor forward(const Tensor& x) override;
  // relu(this(x) + residual), or relu(this(x)) when residual is undefined, in one fused op
  // (core batch_norm_add_relu / batch_norm_relu): the same parameters, buffers, running-statistics
  // and num_batches_tracked updates as calling the layer, the add and a ReLU. A synchronised layer,
  // or a residual whose dtype differs from x's, takes that composed path instead.
  Tensor forward_relu(const Tensor& x, const Tensor& residual = Tensor());
  // This layer as the per-channel affine its output is y * scale + bias (core/conv_bn.h): in
  // training, from the batch statistics a conv2d_stats computed (bn_finalize, with this layer's
  // running-statistics and num_batches_tracked updates); in evaluation, from the running
  // statistics (the ConvStats' are not read). Not for a synchronised layer.
  BnAffine affine(const ConvStats& stats);
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }
  const Tensor& running_mean() const { return running_mean_; }
  const Tensor& running_var() const { return running_var_; }
  const Tensor& num_batches_tracked() const { return num_batches_tracked_; }
  // Synchronised batch norm (distributed::convert_sync_batch_norm sets it): `reduce` sums a tensor over
  // every process of the job, differentiably (its backward sums the gradients the same way). In
  // training the element count, the per-channel sum and the per-channel sum of squared deviations
  // go through it, so the batch statistics (and the running ones) are those of the global batch.
  // Empty (the default): this process's statistics, through the fused batch_norm op.
  using StatsReducer = std::function<Tensor(const Tensor&)>;
  void set_stats_reducer(StatsReducer reduce) { reduce_ = std::move(reduce); }
  bool synchronised() const { return reduce_ != nullptr; }

 private:
  Tensor sync_forward(const Tensor& x);
  void check_input(const Tensor& x) const;
  void count_batch();   // num_batches_tracked += 1 in a training forward (not in a checkpoint rerun)
  void moved_to(Device device) override;   // one_ on the counter's new device
  int64_t num_features_;
  double eps_, momentum_;
  StatsReducer reduce_;
  Tensor weight_, bias_, running_mean_, running_var_, num_batches_tracked_;
  // The 1 that count_batch adds, kept on the counter's device: making it every step cost a fill
  // launch per batch norm on a GPU (53 a ResNet-50 step). Not a buffer: not in the state dict.
  // Made with the layer and again when it moves (Module::moved_to).
  Tensor one_;
};

// weight [out, in], bias [out]. PyTorch's default initialisation.
class Linear : public Module {
 public:
  Linear(int64_t in_features, int64_t out_features, bool bias = true, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;
  const Tensor& weight() const { return weight_; }
  const Tensor& bias() const { return bias_; }

 private:
  int64_t in_features_;
  Tensor weight_, bias_;
};

class ReLU : public Module {
 public:
  ReLU() : Module("ReLU") {}
  Tensor forward(const Tensor& x) override { return relu(x); }
};

// stride 0 means stride = kernel (PyTorch's default).
class MaxPool2d : public Module {
 public:
  explicit MaxPool2d(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0, bool ceil_mode = false);
  Tensor forward(const Tensor& x) override { return max_pool2d(x, opts_); }

 private:
  Pool2dOptions opts_;
};

class AvgPool2d : public Module {
 public:
  explicit AvgPool2d(int64_t kernel_size, int64_t stride = 0, int64_t padding = 0, bool ceil_mode = false,
                     bool count_include_pad = true);
  Tensor forward(const Tensor& x) override { return avg_pool2d(x, opts_); }

 private:
  Pool2dOptions opts_;
};

// Global average pooling to [N, C, 1, 1] (the only output size the op supports).
class AdaptiveAvgPool2d : public Module {
 public:
  explicit AdaptiveAvgPool2d(int64_t output_size = 1);
  Tensor forward(const Tensor& x) override { return adaptive_avg_pool2d(x, {1, 1}); }
};

// Identity in eval mode; masks drawn from the generator given at construction.
class Dropout : public Module {
 public:
  explicit Dropout(double p = 0.5, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override { return dropout(x, p_, is_training(), gen_); }

 private:
  double p_;
  Generator* gen_;
};

class Flatten : public Module {
 public:
  explicit Flatten(int64_t start_dim = 1, int64_t end_dim = -1)
      : Module("Flatten"), start_dim_(start_dim), end_dim_(end_dim) {}
  Tensor forward(const Tensor& x) override { return x.flatten(start_dim_, end_dim_); }

 private:
  int64_t start_dim_, end_dim_;
};

// Children named "0", "1", ... in the order given; forward chains them.
class Sequential : public Module {
 public:
  Sequential() : Module("Sequential") {}
  explicit Sequential(const std::vector<std::shared_ptr<Module>>& modules);
  void push_back(std::shared_ptr<Module> m);
  size_t size() const { return named_children().size(); }
  std::shared_ptr<Module> operator[](size_t i) const;
  Tensor forward(const Tensor& x) override;
};

}  // namespace minidl::nn
