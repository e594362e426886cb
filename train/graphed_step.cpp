// The captured training step of graphed_step.h: what --cuda-graphs refuses, when a step is
// captured again (a new batch shape, never a new rate), and the host's bookkeeping of steps that
// only the device ran.
#include "train/graphed_step.h"

#include <string>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/ops.h"

namespace minidl::train {
namespace {

[[noreturn]] void refuse(const std::string& what, const std::string& fix) {
  throw UsageError("--cuda-graphs " + what + " (" + fix + ")");
}

}  // namespace

void check_cuda_graphs(const TrainConfig& c) {
  Device d;
  try {
    d = Device::parse(c.device);
  } catch (const Error&) {
    return;   // resolve_device names the bad --device
  }
  if (!d.is_cuda())
    refuse("needs a CUDA device, got --device " + c.device + ": a graph replays work captured on a CUDA stream",
           "use --device cuda, or run without --cuda-graphs");
  if (c.accumulation_steps > 1)
    refuse("replays whole optimizer steps of one micro-batch; --accumulation-steps " +
               std::to_string(c.accumulation_steps) + " steps once per window",
           "use --accumulation-steps 1, or run without --cuda-graphs");
  if (c.world_size > 1)
    refuse("cannot replay data-parallel steps (" + std::to_string(c.world_size) +
               " ranks): the gradient allreduce and the ranks' agreed decisions run on the host",
           "run one process, or run without --cuda-graphs");
}

GraphedStep::GraphedStep(Model& model, optim::AccumulatingTrainer& trainer, optim::Optimizer& opt,
                         optim::GradScaler& scaler, Device device)
    : model_(model), trainer_(trainer), opt_(opt), scaler_(scaler), device_(device) {
  // meta:cuda too: the dry run of a graphed run captures on the model of the GPU (its private pool).
  MINIDL_CHECK(device.target() == DeviceType::CUDA, "GraphedStep: CUDA graphs need a CUDA device, got ",
               device.str());
}

void GraphedStep::release() {
  loss_ = logits_ = Tensor();   // in the graph's pool: dropped first, as in the destructor
  graph_.reset();
  x_ = y_ = Tensor();
  warm_.reset();
}

GraphedStep::~GraphedStep() {
  // The outputs live in the graph's pool: dropped first, so releasing the pool frees its segments.
  loss_ = logits_ = Tensor();
  graph_.reset();
}

bool GraphedStep::replayable(const Tensor& images, const optim::MicroBatch& mb, int64_t micro) const {
  if (!ready_ || !mb.steps || mb.loss_weight != 1.0 || images.size(0) != micro) return false;
  const Layout l = layout(images);
  if (graph_ && l == layout(x_)) return true;   // a replay of the graph as it is
  // A capture runs the step's host code: only at the layout whose host code ran last, so that
  // cuDNN's algorithm choice, workspaces and --checkpoint optimal's profile of the shape exist.
  return l == warm_;
}

bool GraphedStep::skipped_on_device() const {
  return scaler_.is_enabled() && scaler_.device_state() && scaler_.device_found_inf().item() != 0.0;
}

bool GraphedStep::eager_step(const Tensor& loss, const optim::MicroBatch& mb, const Tensor& images) {
  warm_ = layout(images);
  if (!ready_) {   // the scaler's host state: the trainer's verdict is the real one
    const bool stepped = trainer_.micro_batch(loss, mb);
    if (stepped) {
      ready_ = true;
      if (scaler_.is_enabled()) scaler_.to_device_state(device_);
      opt_.to_device_state(device_);   // rates and step counts: a replay reads them on the device
    }
    return stepped;
  }
  const optim::AccumulatingTrainer::Counts before = trainer_.counts();
  if (!trainer_.micro_batch(loss, mb)) return false;
  const bool skipped = skipped_on_device();
  trainer_.settle_device_step(before, skipped);
  return !skipped;
}

void GraphedStep::capture() {
  loss_ = logits_ = Tensor();   // the old graph's outputs, then the graph and its pool
  graph_.reset();
  graph_ = backend(device_).capture_graph(device_.index, [&] {
    logits_ = model_.forward(x_);
    loss_ = model_.loss(logits_, y_);
    trainer_.micro_batch(loss_, optim::MicroBatch{.loss_weight = 1.0, .steps = true, .samples = x_.size(0)});
  });
  loss_ = loss_.detach();
  logits_ = logits_.detach();
  warm_ = layout(x_);
  ++captures_;
}

GraphedStep::Output GraphedStep::step(const Tensor& images, const Tensor& labels) {
  // The fused losses read their target-range verdict on the host, except while capturing: a label
  // outside [0, 2) would otherwise index past the logits in every replay, unchecked.
  const Tensor host_labels = labels.to(Device::cpu()).contiguous();
  MINIDL_CHECK(host_labels.dtype() == DType::i64, "--cuda-graphs: labels must be i64, got ", host_labels.meta());
  const int64_t* l = host_labels.data<int64_t>();
  for (int64_t i = 0; i < host_labels.numel(); ++i)
    MINIDL_CHECK(l[i] == 0 || l[i] == 1, "--cuda-graphs: label ", l[i], " of sample ", i,
                 " is outside [0, 2) (the models here have two classes); the batch was not copied in");
  bool recapture = !graph_;
  if (!x_.defined() || layout(images) != layout(x_) || layout(labels) != layout(y_)) {
    x_ = images.clone();   // clone keeps the memory format (channels-last batches stay so)
    y_ = labels.clone();
    recapture = true;
  } else {
    NoGradGuard no_grad;
    x_.copy_(images);
    y_.copy_(labels);
  }
  const optim::AccumulatingTrainer::Counts before = trainer_.counts();
  opt_.upload_lrs();   // this step's rates, read by the replay (the capture's host code writes none)
  if (recapture) capture();   // runs the step's host code (and counts it) without its device work
  graph_->replay();
  const bool skipped = skipped_on_device();
  trainer_.settle_device_step(before, skipped);
  ++replays_;
  return {loss_, logits_, y_, !skipped};
}

}  // namespace minidl::train
