// The training step the model costs and the GPU calibration times: the same code in both
// programs (minidl-gpumodel on the emulated device, minidl-gpumodel-cuda on a GPU), and it is
// minidl-train's step (train/step.h) on minidl-train's model and optimizer (train/model.h):
// ResNet-50 with 2 classes, cross-entropy, SGD momentum 0.9 and weight decay 1e-4 (the batch-size
// techniques study), or the Keras study's small CNN with one logit, BCE and plain SGD; --amp is
// autocast f16 with the gradient scaler.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "core/backend.h"
#include "core/device.h"
#include "core/error.h"
#include "core/tensor.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "train/model.h"
#include "train/step.h"

namespace minidl::gpumodel {

// A bad flag or configuration: the program prints it and exits with status 2.
class UsageError : public Error {
 public:
  using Error::Error;
};

struct StepConfig {
  std::string model = "resnet50";   // resnet50 | smallcnn
  bool amp = false;
  bool bf16 = false;                // with amp: bf16 autocast, no gradient scaler (f16 with one otherwise)
  bool nhwc = false;                // channels-last memory format: weights and batch (to_channels_last)
  // The step as a CUDA graph replays it (--mode graph): captured after one eager warm-up step at
  // each shape, with the gradient scaler's device state; run() is then one replay.
  bool graph = false;
  // AMP: the gradient scaler's state on the device from the first step (no host sync a step), as
  // minidl_bench_step and PyTorch's fused SGD keep it; --measure sets it, so the host time it
  // reports is the host's own work and not a wait for the GPU.
  bool device_scaler = false;
  // The ResNet's convolutions carry its batch norms (ResNetOptions::conv_bn_chain): cuDNN's fused
  // scale-bias-ReLU-convolution-statistics graphs where they apply, composed elsewhere.
  bool conv_bn_chain = false;
};

class TrainStep {
 public:
  // Builds the model for `image` (the small CNN's dense layer depends on it) on `device`.
  TrainStep(const StepConfig& c, int64_t image, Device device);
  // One full step at (batch, image): forward, loss, backward, optimizer step. Inputs are made on
  // the device beforehand by prepare() (a loader's copy runs on its own stream and is not costed).
  // The ResNet takes any image size; the small CNN only the one it was built for.
  void prepare(int64_t batch, int64_t image);
  // With StepConfig::graph: the eager warm-up step at the prepared shape and the capture, so that
  // run() is one replay (nothing without it).
  void ready();
  void run();
  // false: AMP skipped the update (inf/NaN). With a graph under AMP it reads the device's flag (a
  // host sync), so that a profiled replay holds no host read.
  bool last_stepped() const;
  int64_t built_for() const { return image_; }

 private:
  StepConfig c_;
  int64_t image_;
  Device device_;
  train::Model model_;
  std::unique_ptr<optim::Optimizer> opt_;
  std::unique_ptr<optim::GradScaler> scaler_;
  std::unique_ptr<train::Step> train_step_;
  Tensor x_, labels_;
  bool stepped_ = false;
  std::unique_ptr<Backend::Graph> graph_;   // of the prepared shape

  void step();   // the eager step, or the one the graph captures
};

}  // namespace minidl::gpumodel
