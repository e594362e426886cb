// The training step (step.h).
#include "train/step.h"

namespace minidl::train {

namespace {

optim::AccumulationOptions with_scaler(optim::AccumulationOptions o, optim::GradScaler& scaler) {
  if (scaler.is_enabled()) o.scaler = &scaler;
  return o;
}

}  // namespace

Step::Step(Model& model, optim::Optimizer& opt, optim::GradScaler& scaler, optim::AccumulationOptions options,
           bool graphs, Device device)
    : model_(model), trainer_(std::make_unique<optim::AccumulatingTrainer>(opt, with_scaler(options, scaler))) {
  if (graphs) graphed_ = std::make_unique<GraphedStep>(model_, *trainer_, opt, scaler, device);
}

Step::~Step() = default;

void Step::release_graph() {
  if (graphed_) graphed_->release();
}

void Step::set_accumulation(int64_t k) {
  if (graphed_) graphed_->set_accumulation(k);
}

Step::Forward Step::forward(const Tensor& images, const Tensor& labels, const optim::MicroBatch& mb, int64_t micro) {
  Forward f;
  f.mb = mb;
  f.images = images;
  if (graphed_ && graphed_->replayable(images, mb, micro)) {
    if (const std::optional<GraphedStep::Output> out = graphed_->step(images, labels, mb)) {
      f.loss = out->loss, f.logits = out->logits, f.labels = out->labels, f.stepped = out->stepped;
      f.replayed = true;
      return f;
    }   // its capture did not fit and fell back: the micro-batch runs eagerly
  }
  if (graphed_) f.lending = graphed_->lend_for_eager();
  f.logits = model_.forward(images);
  f.loss = model_.loss(f.logits, labels);
  f.labels = labels;
  return f;
}

bool Step::update(const Forward& f) {
  if (f.replayed) return f.stepped;
  if (f.lending) f.lending->keep_open = !f.mb.steps;   // a window run eagerly pauses in the pool to its end
  return graphed_ ? graphed_->eager_step(f.loss, f.mb, f.images) : trainer_->micro_batch(f.loss, f.mb);
}

Step::Forward Step::run(const Tensor& images, const Tensor& labels) {
  return run(images, labels, optim::MicroBatch{.loss_weight = 1.0, .steps = true, .samples = images.size(0)});
}

Step::Forward Step::run(const Tensor& images, const Tensor& labels, const optim::MicroBatch& mb) {
  Forward f = forward(images, labels, mb, images.size(0));
  f.stepped = update(f);
  return f;
}

}  // namespace minidl::train
