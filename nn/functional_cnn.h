// A tiny CNN and its SGD training loop written with the functional ops of core/ops.h only, shared
// by the training demo (experiments/demo_main.cpp) and the end-to-end test. A placeholder until the
// nn (Module) and optim issues land: then SmallCnn becomes a Module and sgd_momentum_step optim::SGD.
#pragma once
#include <cstdint>
#include <vector>

#include "core/generator.h"
#include "core/tensor.h"

namespace minidl::nn {

struct SmallCnnOptions {
  int64_t in_channels = 3;
  int64_t channels1 = 16;
  int64_t channels2 = 32;
  int64_t num_classes = 2;
};

// conv3x3 -> batch_norm -> relu -> max_pool 2 -> conv3x3 -> batch_norm -> relu -> global average
// pool -> linear. Convolutions have no bias (batch norm follows). Initialisation as PyTorch's
// torchvision ResNets: convolutions Kaiming-normal (fan_out, ReLU gain), batch norm weight 1 and
// bias 0, the linear layer PyTorch's default uniform(+-1/sqrt(fan_in)) for weight and bias.
class SmallCnn {
 public:
  SmallCnn(const SmallCnnOptions& opts, Generator& gen);
  // x [N, in_channels, H, W] f32; returns logits [N, num_classes]. training: batch statistics
  // (and running-statistics updates) instead of the running ones.
  Tensor forward(const Tensor& x, bool training);
  std::vector<Tensor> parameters() const;  // leaves with requires_grad, in a fixed order
  std::vector<Tensor> buffers() const;     // batch-norm running means and variances
  int64_t num_parameters() const;

 private:
  Tensor conv1_weight_, bn1_weight_, bn1_bias_, bn1_running_mean_, bn1_running_var_;
  Tensor conv2_weight_, bn2_weight_, bn2_bias_, bn2_running_mean_, bn2_running_var_;
  Tensor fc_weight_, fc_bias_;
};

// PyTorch's SGD update (dampening 0, no Nesterov): v = momentum * v + (grad + weight_decay * p),
// p -= lr * v. velocities starts empty and is filled with zeros on the first call; parameters
// without a gradient are skipped. Runs under NoGradGuard. Placeholder until optim::SGD.
void sgd_momentum_step(const std::vector<Tensor>& params, std::vector<Tensor>& velocities, double lr,
                       double momentum, double weight_decay);

// Rows `index` of t along dim 0, copied into a new contiguous tensor (no autograd): the batch
// assembly of a shuffled epoch until the data loader lands.
Tensor gather_rows(const Tensor& t, const std::vector<int64_t>& index);

struct TrainOptions {
  int64_t batch_size = 64;
  double lr = 0.05;
  double momentum = 0.9;
  double weight_decay = 5e-4;
};

struct EpochResult {
  double mean_loss = 0.0;   // per-image average of the batch losses
  double accuracy = 0.0;    // of the training batches, measured before each update
  double seconds = 0.0;
  int64_t images = 0;
};

// One pass over images [N,C,H,W] / labels [N] (i64) in an order drawn from gen; the last partial
// batch is kept. velocities as in sgd_momentum_step.
EpochResult train_epoch(SmallCnn& model, const Tensor& images, const Tensor& labels, const TrainOptions& opts,
                        std::vector<Tensor>& velocities, Generator& gen);

// Fraction of images whose argmax logit equals the label, with running batch-norm statistics.
double evaluate_accuracy(SmallCnn& model, const Tensor& images, const Tensor& labels, int64_t batch_size);

}  // namespace minidl::nn
