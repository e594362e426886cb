// The small CNN and SGD loop of nn/functional_cnn.h: the smallest complete use of conv2d,
// batch_norm, pooling, linear, cross_entropy and backward, so the demo and the end-to-end test
// exercise the whole stack before Module and optim exist.
#include "nn/functional_cnn.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "core/autograd.h"
#include "core/ops.h"

namespace minidl::nn {

namespace {

Tensor kaiming_normal_conv(int64_t out_c, int64_t in_c, int64_t k, Generator& gen) {
  // fan_out mode with the ReLU gain, as torchvision initialises ResNet convolutions.
  const double std_dev = std::sqrt(2.0 / static_cast<double>(out_c * k * k));
  return normal({out_c, in_c, k, k}, 0.0, std_dev, {}, &gen).set_requires_grad(true);
}

Tensor leaf(Tensor t) { return t.set_requires_grad(true); }

}  // namespace

SmallCnn::SmallCnn(const SmallCnnOptions& opts, Generator& gen) {
  MINIDL_CHECK(opts.in_channels > 0 && opts.channels1 > 0 && opts.channels2 > 0 && opts.num_classes > 1,
               "SmallCnn: channel counts must be positive and num_classes at least 2");
  conv1_weight_ = kaiming_normal_conv(opts.channels1, opts.in_channels, 3, gen);
  bn1_weight_ = leaf(ones({opts.channels1}));
  bn1_bias_ = leaf(zeros({opts.channels1}));
  bn1_running_mean_ = zeros({opts.channels1});
  bn1_running_var_ = ones({opts.channels1});
  conv2_weight_ = kaiming_normal_conv(opts.channels2, opts.channels1, 3, gen);
  bn2_weight_ = leaf(ones({opts.channels2}));
  bn2_bias_ = leaf(zeros({opts.channels2}));
  bn2_running_mean_ = zeros({opts.channels2});
  bn2_running_var_ = ones({opts.channels2});
  const double bound = 1.0 / std::sqrt(static_cast<double>(opts.channels2));
  fc_weight_ = leaf(uniform({opts.num_classes, opts.channels2}, -bound, bound, {}, &gen));
  fc_bias_ = leaf(uniform({opts.num_classes}, -bound, bound, {}, &gen));
}

Tensor SmallCnn::forward(const Tensor& x, bool training) {
  Conv2dOptions same;
  same.padding = {1, 1};
  Tensor h = conv2d(x, conv1_weight_, Tensor(), same);
  h = relu(batch_norm(h, bn1_weight_, bn1_bias_, bn1_running_mean_, bn1_running_var_, training));
  h = max_pool2d(h, Pool2dOptions{});
  h = conv2d(h, conv2_weight_, Tensor(), same);
  h = relu(batch_norm(h, bn2_weight_, bn2_bias_, bn2_running_mean_, bn2_running_var_, training));
  h = adaptive_avg_pool2d(h).flatten(1);
  return linear(h, fc_weight_, fc_bias_);
}

std::vector<Tensor> SmallCnn::parameters() const {
  return {conv1_weight_, bn1_weight_, bn1_bias_, conv2_weight_, bn2_weight_, bn2_bias_, fc_weight_, fc_bias_};
}

std::vector<Tensor> SmallCnn::buffers() const {
  return {bn1_running_mean_, bn1_running_var_, bn2_running_mean_, bn2_running_var_};
}

int64_t SmallCnn::num_parameters() const {
  int64_t total = 0;
  for (const Tensor& p : parameters()) total += p.numel();
  return total;
}

void sgd_momentum_step(const std::vector<Tensor>& params, std::vector<Tensor>& velocities, double lr,
                       double momentum, double weight_decay) {
  NoGradGuard no_grad;
  if (velocities.empty()) {
    for (const Tensor& p : params) velocities.push_back(zeros_like(p));
  }
  MINIDL_CHECK(velocities.size() == params.size(), "sgd_momentum_step: ", velocities.size(),
               " velocities for ", params.size(), " parameters (pass the same list every step)");
  for (size_t i = 0; i < params.size(); ++i) {
    Tensor p = params[i];
    const Tensor g = p.grad();
    if (!g.defined()) continue;
    // With v starting at zero, the first step gives v = d_p, exactly PyTorch's buffer initialisation.
    Tensor& v = velocities[i];
    v.mul_(momentum);
    v.add_(g);
    if (weight_decay != 0.0) v.add_(p, weight_decay);
    p.add_(v, -lr);
  }
}

Tensor gather_rows(const Tensor& t, const std::vector<int64_t>& index) {
  Shape shape = t.shape();
  MINIDL_CHECK(!shape.empty(), "gather_rows: needs at least one dim, got ", t.meta());
  shape[0] = static_cast<int64_t>(index.size());
  Tensor out = empty(shape, t.options());
  NoGradGuard no_grad;
  for (size_t j = 0; j < index.size(); ++j) {
    out.select(0, static_cast<int64_t>(j)).copy_(t.select(0, index[j]));
  }
  return out;
}

namespace {

// Argmax predictions compared on the host: small tensors, and it avoids reducing a bool tensor.
int64_t count_correct(const Tensor& logits, const Tensor& labels) {
  const std::vector<double> pred = argmax(logits.detach(), 1).to_vector();
  const std::vector<double> truth = labels.to_vector();
  int64_t correct = 0;
  for (size_t i = 0; i < pred.size(); ++i) correct += pred[i] == truth[i] ? 1 : 0;
  return correct;
}

}  // namespace

EpochResult train_epoch(SmallCnn& model, const Tensor& images, const Tensor& labels, const TrainOptions& opts,
                        std::vector<Tensor>& velocities, Generator& gen) {
  const int64_t n = images.size(0);
  MINIDL_CHECK(labels.dim() == 1 && labels.size(0) == n, "train_epoch: labels ", labels.meta(),
               " do not match images ", images.meta());
  MINIDL_CHECK(opts.batch_size > 0, "train_epoch: batch_size must be positive, got ", opts.batch_size);
  const auto start = std::chrono::steady_clock::now();
  // The order comes from the seeded generator (argsort of uniforms), not from std::shuffle, whose
  // algorithm differs between standard libraries.
  const std::vector<double> keys = rand({n}, {}, &gen).to_vector();
  std::vector<int64_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), int64_t{0});
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) {
    return keys[static_cast<size_t>(a)] < keys[static_cast<size_t>(b)];
  });
  const std::vector<Tensor> params = model.parameters();
  EpochResult r;
  double loss_sum = 0.0;
  int64_t correct = 0;
  for (int64_t begin = 0; begin < n; begin += opts.batch_size) {
    const int64_t end = std::min(n, begin + opts.batch_size);
    const std::vector<int64_t> idx(order.begin() + begin, order.begin() + end);
    const Tensor x = gather_rows(images, idx);
    const Tensor y = gather_rows(labels, idx);
    const Tensor logits = model.forward(x, /*training=*/true);
    const Tensor loss = cross_entropy(logits, y);
    for (Tensor p : params) p.zero_grad();
    loss.backward();
    sgd_momentum_step(params, velocities, opts.lr, opts.momentum, opts.weight_decay);
    loss_sum += loss.item() * static_cast<double>(end - begin);
    correct += count_correct(logits, y);
  }
  r.images = n;
  r.mean_loss = loss_sum / static_cast<double>(n);
  r.accuracy = static_cast<double>(correct) / static_cast<double>(n);
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return r;
}

double evaluate_accuracy(SmallCnn& model, const Tensor& images, const Tensor& labels, int64_t batch_size) {
  MINIDL_CHECK(batch_size > 0, "evaluate_accuracy: batch_size must be positive, got ", batch_size);
  NoGradGuard no_grad;
  const int64_t n = images.size(0);
  int64_t correct = 0;
  for (int64_t begin = 0; begin < n; begin += batch_size) {
    const int64_t end = std::min(n, begin + batch_size);
    correct += count_correct(model.forward(images.slice(0, begin, end), /*training=*/false), labels.slice(0, begin, end));
  }
  return static_cast<double>(correct) / static_cast<double>(n);
}

}  // namespace minidl::nn
