// The small CNN of the Keras batch-size study ("How to maximize GPU utilization by finding the
// right batch size"): one VGG-style block and a dense head, trained on 200x200 cats vs dogs. The
// accuracy-vs-batch-size experiments reproduce that study with exactly this model.
#pragma once
#include <cstdint>
#include <memory>

#include "core/generator.h"
#include "nn/layers.h"
#include "nn/module.h"

namespace minidl::nn {

// conv 32 3x3 'same' + ReLU -> max-pool 2 -> flatten -> dense 128 + ReLU -> dense 1.
// Initialisation as the Keras model's defaults: Glorot-uniform kernels, zero biases (He-uniform,
// as in some tutorials' version of this model, makes plain SGD at lr 0.01 spike to a loss of
// 34-94 on its first steps; keras_cnn.cpp has the numbers). The final sigmoid of the Keras
// model is folded into the loss: forward() returns the logit [N, 1], to be trained with
// binary_cross_entropy_with_logits (the same function, numerically stable); predict() applies it.
// Parameter names: conv.weight/bias, fc1.weight/bias, fc2.weight/bias. At 200x200 it has 40,961,153
// parameters like the Keras model (whose flatten order is channels-last, so fc1's columns are
// ordered differently when importing Keras weights). forward() pools before the first ReLU: the
// same numbers, forward and backward (max-pooling commutes with the ReLU, keras_cnn_test.cpp checks
// it bit for bit), with the ReLU on a quarter of the elements and none of the conv's full-size output kept.
class KerasSmallCnn : public Module {
 public:
  explicit KerasSmallCnn(int64_t image_size = 200, Generator* gen = nullptr);
  Tensor forward(const Tensor& x) override;  // x [N, 3, S, S] -> logits [N, 1]
  Tensor predict(const Tensor& x);           // probabilities of class 1, [N, 1]
  int64_t image_size() const { return image_size_; }

 private:
  int64_t image_size_;
  std::shared_ptr<Conv2d> conv_;
  std::shared_ptr<ReLU> relu1_, relu2_;
  std::shared_ptr<MaxPool2d> pool_;
  std::shared_ptr<Flatten> flatten_;
  std::shared_ptr<Linear> fc1_, fc2_;
};

}  // namespace minidl::nn
