// The modelled and measured training step (train_step.h).
#include "perfmodel/train_step.h"

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/error.h"
#include "core/generator.h"
#include "core/ops.h"
#include "kernels/cuda/runtime.h"
#include "nn/keras_cnn.h"
#include "nn/resnet.h"
#include "optim/sgd.h"

namespace minidl::gpumodel {

TrainStep::TrainStep(const StepConfig& c, int64_t image, Device device) : c_(c), image_(image), device_(device) {
  Generator gen(7);
  optim::SgdOptions o;
  if (c.model == "resnet50") {
    model_ = nn::resnet50(2, &gen);
    o.lr = 0.001;
    o.momentum = 0.9;
    o.weight_decay = 1e-4;
  } else if (c.model == "smallcnn") {
    model_ = std::make_shared<nn::KerasSmallCnn>(image, &gen);
    o.lr = 0.01;
  } else {
    throw UsageError("--model '" + c.model + "' is not modelled (resnet50 or smallcnn)");
  }
  model_->to(device_);
  if (c.nhwc) model_->to_channels_last();   // weights KRSC: cuDNN on NHWC with no copies
  model_->train();
  opt_ = std::make_unique<optim::SGD>(model_->parameters(), o);
  // Scale 1: every step must really update (a skipped step runs other launches, and each emulated
  // ResNet-50 step costs minutes); the launches do not depend on the scale, only on skipping.
  scaler_ = std::make_unique<optim::GradScaler>(optim::GradScalerOptions{.init_scale = 1.0, .enabled = c.amp});
  cuda::set_conv_nhwc(false);   // channels-last is the tensors' format, never the transposing mode
}

void TrainStep::prepare(int64_t batch, int64_t image) {
  MINIDL_CHECK(c_.model != "smallcnn" || image == image_, "gpumodel: the small CNN was built for ", image_,
               " px images, not ", image);
  graph_.reset();   // its captured inputs are the previous shape's
  if (scaler_->device_state()) scaler_->to_host_state();
  // An eager step with the device's scaler (StepConfig::device_scaler); a graph moves it at capture.
  if (c_.amp && c_.device_scaler && !c_.graph && device_.is_cuda()) scaler_->to_device_state(device_);
  Generator gen(static_cast<uint64_t>(batch) * 1000 + static_cast<uint64_t>(image));
  x_ = randn({batch, 3, image, image}, {}, &gen).to(device_);
  if (c_.nhwc) x_ = to_channels_last(x_);   // as the loader writes it with --channels-last
  labels_ = (gt(rand({batch}, {}, &gen), full({1}, 0.5)).to(DType::i64)).to(device_);
}

void TrainStep::ready() {
  if (!c_.graph || graph_) return;
  step();   // eager at this shape: algorithm choices, workspaces
  if (c_.amp) scaler_->to_device_state(device_);
  graph_ = backend(device_).capture_graph(device_.index, [this] { step(); });
}

void TrainStep::run() {
  if (!c_.graph) return step();
  ready();
  graph_->replay();
}

bool TrainStep::last_stepped() const {
  if (c_.graph && c_.amp && graph_) return scaler_->device_found_inf().item() == 0.0;
  return stepped_;
}

void TrainStep::step() {
  Tensor logits;
  {
    AutocastGuard autocast(DType::f16, c_.amp);
    logits = (*model_)(x_);
  }
  if (logits.dtype() != DType::f32) logits = logits.to(DType::f32);
  const Tensor loss = c_.model == "smallcnn"
                          ? binary_cross_entropy_with_logits(logits, labels_.to(DType::f32).reshape({-1, 1}))
                          : cross_entropy(logits, labels_);
  (c_.amp ? scaler_->scale(loss) : loss).backward();
  if (c_.amp) {
    stepped_ = scaler_->step(*opt_);
    scaler_->update();
  } else {
    opt_->step();
    stepped_ = true;
  }
  opt_->zero_grad();
}

}  // namespace minidl::gpumodel
