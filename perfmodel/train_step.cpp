// The modelled and measured training step (train_step.h).
#include "perfmodel/train_step.h"

#include "core/error.h"
#include "core/generator.h"
#include "core/ops.h"
#include "kernels/cuda/runtime.h"
#include "train/config.h"

namespace minidl::gpumodel {

namespace {

// minidl-train's configuration of the modelled step.
train::TrainConfig step_config(const StepConfig& c, int64_t image) {
  train::TrainConfig t;
  t.model = c.model;
  t.image_size = image;
  t.amp = c.amp;
  t.amp_dtype = c.bf16 ? "bf16" : "f16";
  t.channels_last = c.nhwc;   // weights KRSC: cuDNN on NHWC with no copies
  if (c.model == "resnet50") {
    t.lr = 0.001;
    t.momentum = 0.9;
    t.weight_decay = 1e-4;
  } else if (c.model == "smallcnn") {
    t.lr = 0.01;
  } else {
    throw UsageError("--model '" + c.model + "' is not modelled (resnet50 or smallcnn)");
  }
  // Scale 1: every step must really update (a skipped step runs other launches, and each emulated
  // ResNet-50 step costs minutes); the launches do not depend on the scale, only on skipping.
  t.amp_init_scale = 1.0;
  return t;
}

}  // namespace

TrainStep::TrainStep(const StepConfig& c, int64_t image, Device device) : c_(c), image_(image), device_(device) {
  const train::TrainConfig t = step_config(c, image);
  model_ = train::make_model(t, 7);
  if (c.conv_bn_chain) {
    MINIDL_CHECK(model_.resnet != nullptr, "gpumodel: the conv + batch-norm chain needs a ResNet, not ", c.model);
    model_.resnet->set_conv_bn_chain(true);
  }
  model_.module->to(device_);
  model_.module->train();
  opt_ = train::make_optimizer(t, *model_.module, t.resolved_lr());
  scaler_ = std::make_unique<optim::GradScaler>(optim::GradScalerOptions{.init_scale = 1.0, .enabled = t.uses_grad_scaler()});
  train_step_ = std::make_unique<train::Step>(model_, *opt_, *scaler_);
  cuda::set_conv_nhwc(false);   // channels-last is the tensors' format, never the transposing mode
}

void TrainStep::prepare(int64_t batch, int64_t image) {
  MINIDL_CHECK(c_.model != "smallcnn" || image == image_, "gpumodel: the small CNN was built for ", image_,
               " px images, not ", image);
  graph_.reset();   // its captured inputs are the previous shape's
  if (scaler_->device_state()) scaler_->to_host_state();
  // An eager step with the device's scaler (StepConfig::device_scaler); a graph moves it at capture.
  if (scaler_->is_enabled() && c_.device_scaler && !c_.graph && device_.is_cuda()) scaler_->to_device_state(device_);
  Generator gen(static_cast<uint64_t>(batch) * 1000 + static_cast<uint64_t>(image));
  x_ = randn({batch, 3, image, image}, {}, &gen).to(device_);
  if (c_.nhwc) x_ = to_channels_last(x_);   // as the loader writes it with --channels-last
  labels_ = (gt(rand({batch}, {}, &gen), full({1}, 0.5)).to(DType::i64)).to(device_);
}

void TrainStep::ready() {
  if (!c_.graph || graph_) return;
  step();   // eager at this shape: algorithm choices, workspaces
  if (scaler_->is_enabled()) scaler_->to_device_state(device_);
  graph_ = backend(device_).capture_graph(device_.index, [this] { step(); });
}

void TrainStep::run() {
  if (!c_.graph) return step();
  ready();
  graph_->replay();
}

bool TrainStep::last_stepped() const {
  if (c_.graph && scaler_->is_enabled() && graph_) return scaler_->device_found_inf().item() == 0.0;
  return stepped_;
}

void TrainStep::step() { stepped_ = train_step_->run(x_, labels_).stepped; }

}  // namespace minidl::gpumodel
