// The model, loss and optimizer factories behind every experiment program (see model.h).
#include "train/model.h"

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/generator.h"
#include "core/ops.h"
#include "nn/keras_cnn.h"
#include "optim/adam.h"
#include "optim/sgd.h"

namespace minidl::train {

Tensor Model::forward(const Tensor& images) {
  AutocastGuard autocast(amp_dtype, amp);
  // Loader batches arrive channels-last already (a view, no copy); other sources are converted.
  const Tensor x = channels_last ? to_channels_last(images) : images;
  if (recomputer) return recomputer->forward(x);
  return (*module)(x);
}

Tensor Model::loss(const Tensor& logits_in, const Tensor& labels) const {
  // Losses in f32, as under autocast (the logits of an AMP forward may be f16).
  const Tensor logits = logits_in.dtype() == DType::f32 ? logits_in : logits_in.to(DType::f32);
  if (binary) {
    const Tensor target = labels.to(DType::f32).reshape({-1, 1});
    return binary_cross_entropy_with_logits(logits, target);
  }
  return cross_entropy(logits, labels);
}

Tensor Model::correct_count(const Tensor& logits_in, const Tensor& labels) const {
  NoGradGuard guard;
  const Tensor logits = logits_in.dtype() == DType::f32 ? logits_in : logits_in.to(DType::f32);
  Tensor pred;
  if (binary) {
    pred = gt(logits.reshape({-1}), zeros({1}, logits.options())).to(DType::i64);
  } else {
    pred = argmax(logits, 1);
  }
  return sum(eq(pred, labels.to(pred.device())).to(DType::f64));
}

int64_t Model::correct(const Tensor& logits, const Tensor& labels) const {
  return static_cast<int64_t>(correct_count(logits, labels).item());
}

Model make_model(const TrainConfig& c, uint64_t seed) {
  Model m;
  m.name = c.model;
  m.image_size = c.resolved_image_size();
  m.checkpoint = parse_checkpoint(c.checkpoint);
  m.amp = c.amp;
  m.amp_dtype = c.resolved_amp_dtype();
  m.channels_last = c.resolved_channels_last();
  Generator gen(seed);
  if (c.model == "smallcnn") {
    m.module = std::make_shared<nn::KerasSmallCnn>(m.image_size, &gen);
    m.binary = true;
    if (m.channels_last) m.module->to_channels_last();
    return m;
  }
  const bool small = c.model.size() > 6 && c.model.substr(c.model.size() - 6) == "-small";
  const std::string base = small ? c.model.substr(0, c.model.size() - 6) : c.model;
  if (base == "resnet18") m.resnet = nn::resnet18(2, &gen, false, small);
  else if (base == "resnet34") m.resnet = nn::resnet34(2, &gen, false, small);
  else if (base == "resnet50") m.resnet = nn::resnet50(2, &gen, false, small);
  else throw UsageError("--model '" + c.model + "' is unknown");
  m.module = m.resnet;
  m.resnet->set_conv_bn_chain(c.conv_bn_chain);
  if (m.channels_last) m.module->to_channels_last();   // device moves keep the format
  // The recomputation modes of nn/recompute.h; optimal plans for the device's memory budget.
  if (m.checkpoint.kind != CheckpointSpec::Kind::None)
    m.recomputer = std::make_shared<nn::Recomputer>(*m.resnet, nn::RecomputeMode::parse(c.checkpoint));
  return m;
}

std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c, nn::Module& model, double lr) {
  if (c.optimizer == "sgd") {
    optim::SgdOptions o;
    o.lr = lr;
    o.momentum = c.momentum;
    o.nesterov = c.nesterov;
    o.weight_decay = c.resolved_weight_decay();
    return std::make_unique<optim::SGD>(model.parameters(), o);
  }
  optim::AdamOptions o;
  o.lr = lr;
  o.beta1 = c.beta1;
  o.beta2 = c.beta2;
  o.eps = c.eps;
  o.keras_eps = c.eps_mode == "keras";
  o.weight_decay = c.resolved_weight_decay();
  if (c.optimizer == "adamw") return std::make_unique<optim::AdamW>(model.parameters(), o);
  return std::make_unique<optim::Adam>(model.parameters(), o);
}

double optimizer_state_factor(const TrainConfig& c) {
  if (c.optimizer == "sgd") return c.momentum > 0 ? 1.0 : 0.0;
  return 2.0;
}

}  // namespace minidl::train
