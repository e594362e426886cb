// --cuda-graphs (docs/cuda/graphs.md): minidl-train's step of one
// micro-batch captured into a CUDA graph once and replayed for every full batch, which cuts the
// host's launch cost of a small-batch step to one cudaGraphLaunch. The training loop (run.cpp)
// keeps everything that reads the host (loss, accuracy, divergence, progress) outside the replay.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

#include "core/backend.h"
#include "core/tensor.h"
#include "train/config.h"
#include "train/model.h"
#include "optim/accumulation.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"

namespace minidl::train {

// Throws UsageError, naming --cuda-graphs and the fix, for what a replayed step cannot do: a
// non-CUDA device, accumulation, data-parallel ranks. Every optimizer, schedule and --max-grad-norm
// replays (their values live on the device). Called by validate().
void check_cuda_graphs(const TrainConfig& c);

// The captured step and its captured inputs and outputs. The loop asks replayable() per
// micro-batch; a replayable one goes through step() (the update is done when it returns), any
// other runs its forward eagerly and its update through eager_step(), which is also the warm-up: nothing is
// captured until an eager step has really stepped the optimizer (its momentum buffers exist; AMP's
// skipped first steps do not count) and until the batch's shape has run eagerly once (cuDNN's
// algorithm choice, workspaces and --checkpoint optimal's profile happen outside the capture).
// That first real step moves the optimizer (learning rates, Adam's step counts) and the gradient
// scaler to their device states, so a replay needs no host value and one graph serves every rate.
class GraphedStep {
 public:
  GraphedStep(Model& model, optim::AccumulatingTrainer& trainer, optim::Optimizer& opt, optim::GradScaler& scaler,
              Device device);
  ~GraphedStep();
  GraphedStep(const GraphedStep&) = delete;
  GraphedStep& operator=(const GraphedStep&) = delete;

  // Whether this micro-batch can be a replay: after the warm-up, a whole optimizer step (weight 1)
  // of a full batch of `micro` samples (the epoch's last partial batch runs eagerly), and either the
  // graph's layout, or (a capture inside step()) the layout of the last step whose host code ran,
  // eager or captured. Otherwise the step runs eagerly and warms its layout.
  bool replayable(const Tensor& images, const optim::MicroBatch& mb, int64_t micro) const;

  // What a replay wrote: the loss (0-dim f32), the logits and the labels it used, all on the device;
  // `stepped`: false when the gradient scaler skipped the step on the device.
  struct Output {
    Tensor loss, logits, labels;
    bool stepped = true;
  };
  // Checks the labels on the host (the fused losses skip their own host check during a capture),
  // copies the batch into the captured inputs, writes the current learning rates to the device,
  // captures again when the shape changed, replays, and counts the step in the trainer and the
  // optimizer as the eager loop would (a step the scaler skipped on the device is not one: its
  // flag is read after the replay).
  Output step(const Tensor& images, const Tensor& labels);

  // The eager update of a micro-batch the loop ran forward itself (trainer.micro_batch), counted
  // as step() counts; returns whether the optimizer stepped. Its shape is then warm; the first time
  // the optimizer really stepped, the gradient scaler moves to its device state.
  bool eager_step(const Tensor& loss, const optim::MicroBatch& mb, const Tensor& images);

  // Drops the graph, its pool and its captured inputs and outputs, and forgets the warm layout, so
  // that the next step runs eagerly before a capture (the maximum-batch trials: one graph per
  // trial, nothing left from the one before).
  void release();

  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }

 private:
  // A batch's shape, strides and dtype: what a graph's captured input must match.
  struct Layout {
    Shape shape, strides;
    DType dtype = DType::f32;
    bool operator==(const Layout&) const = default;
  };
  static Layout layout(const Tensor& t) { return {t.shape(), t.strides(), t.dtype()}; }
  void capture();
  // Whether the step that just ran was skipped by the scaler's device state (a host read).
  bool skipped_on_device() const;

  Model& model_;
  optim::AccumulatingTrainer& trainer_;
  optim::Optimizer& opt_;
  optim::GradScaler& scaler_;
  Device device_;
  bool ready_ = false;        // the optimizer has really stepped eagerly
  std::optional<Layout> warm_;      // the layout of the last step whose host code ran
  std::unique_ptr<Backend::Graph> graph_;
  Tensor x_, y_;              // captured inputs: each batch is copied into them
  Tensor loss_, logits_;      // captured outputs: each replay writes them (the graph's pool)
  int64_t captures_ = 0;
  int64_t replays_ = 0;
};

}  // namespace minidl::train
