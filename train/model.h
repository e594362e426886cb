// What a run trains and how: the model named by --model, its forward with the chosen
// recomputation mode, its loss and accuracy, and the optimizer. The training loop, the
// maximum-batch finder and the memory estimator all build their step from these pieces so they
// measure exactly the same computation.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "core/tensor.h"
#include "train/config.h"
#include "nn/module.h"
#include "nn/recompute.h"
#include "nn/resnet.h"
#include "optim/optimizer.h"

namespace minidl::train {

struct Model {
  std::string name;
  std::shared_ptr<nn::Module> module;
  std::shared_ptr<nn::ResNet> resnet;  // set for ResNet models (recomputation needs the stages)
  bool binary = false;                 // one logit + BCE (smallcnn), else 2 classes + cross-entropy
  int64_t image_size = 0;
  CheckpointSpec checkpoint;
  std::shared_ptr<nn::Recomputer> recomputer;  // ResNet with --checkpoint other than none
  bool amp = false;                    // forward under autocast (mixed precision) ...
  DType amp_dtype = DType::f16;        // ... in this dtype (f16 or bf16)
  bool channels_last = false;          // weights channels-last; forward takes images to the format

  // Logits for images [N, 3, S, S]: [N, 1] (binary) or [N, 2]; under autocast with --amp.
  Tensor forward(const Tensor& images);
  // Mean loss of logits against i64 labels [N].
  Tensor loss(const Tensor& logits, const Tensor& labels) const;
  // Number of correct predictions: on the device as a 0-dim f64 tensor (a replayed evaluation's
  // output), or read on the host.
  Tensor correct_count(const Tensor& logits, const Tensor& labels) const;
  int64_t correct(const Tensor& logits, const Tensor& labels) const;
  Shape input_shape(int64_t batch) const { return {batch, 3, image_size, image_size}; }
};

// Builds the model of c (initialised from seed) on the CPU; the caller moves it to the device.
Model make_model(const TrainConfig& c, uint64_t seed);

// The optimizer of c over the model's parameters with learning rate `lr`.
std::unique_ptr<optim::Optimizer> make_optimizer(const TrainConfig& c, nn::Module& model, double lr);

// Bytes of optimizer state per parameter byte once every parameter has stepped (sgd with
// momentum 1, without 0; adam/adamw 2).
double optimizer_state_factor(const TrainConfig& c);

}  // namespace minidl::train
