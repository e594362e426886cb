// The training step, written once: forward (under autocast with --amp), loss, backward and, at the
// end of its accumulation window, the update through optim::AccumulatingTrainer (the gradient
// scaler, clipping, the schedule, data-parallel synchronisation), or a replay of the step captured
// in a CUDA graph (the default on CUDA, graphed_step.h). minidl-train's loop, the trials of
// minidl-maxbatch and minidl-memest, the step benchmark and the step-time model all run this step,
// so what they measure is what training runs.
#pragma once
#include <cstdint>
#include <memory>

#include "core/device.h"
#include "core/tensor.h"
#include "optim/accumulation.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"
#include "train/graphed_step.h"
#include "train/model.h"

namespace minidl::train {

class Step {
 public:
  // `options.scaler` is set from `scaler` when it is enabled. `graphs`: replay full batches from a
  // CUDA graph on `device` once the warm-up has stepped eagerly (check_cuda_graphs says when).
  Step(Model& model, optim::Optimizer& opt, optim::GradScaler& scaler, optim::AccumulationOptions options = {},
       bool graphs = false, Device device = Device::cpu());
  ~Step();
  Step(const Step&) = delete;
  Step& operator=(const Step&) = delete;

  // What a micro-batch's forward gave. A replayed graph has also updated the weights (`replayed`,
  // `stepped`); an eager one waits for update(), so that the loop can look at the loss first (a
  // diverged loss stops the run before its update).
  struct Forward {
    // Beside held graphs, an eager micro-batch runs in their pool (GraphedStep::Lending): declared
    // first, it ends after the tensors below are gone.
    std::shared_ptr<GraphedStep::Lending> lending;
    Tensor loss, logits, labels;   // labels: those the logits are for (a replay's captured copy)
    bool replayed = false;
    bool stepped = false;
    optim::MicroBatch mb;
    Tensor images;
  };
  // Phase one of a micro-batch at its place in its window (optim::plan_accumulation); `micro` is the
  // phase's full micro-batch (a smaller, last batch of an epoch never replays).
  Forward forward(const Tensor& images, const Tensor& labels, const optim::MicroBatch& mb, int64_t micro);
  // Phase two: backward and, when mb.steps, the update. Returns whether the optimizer stepped.
  bool update(const Forward& f);
  // Both phases: one micro-batch, by default a whole step on one batch.
  Forward run(const Tensor& images, const Tensor& labels);
  Forward run(const Tensor& images, const Tensor& labels, const optim::MicroBatch& mb);

  // With graphs: drops the captured graphs and their pool (GraphedStep::release); nothing otherwise.
  void release_graph();
  // With graphs: the accumulation of the windows to come (GraphedStep::set_accumulation).
  void set_accumulation(int64_t k);

  optim::AccumulatingTrainer& trainer() { return *trainer_; }
  const GraphedStep* graphed() const { return graphed_.get(); }
  GraphedStep* graphed() { return graphed_.get(); }

 private:
  Model& model_;
  std::unique_ptr<optim::AccumulatingTrainer> trainer_;
  std::unique_ptr<GraphedStep> graphed_;
};

}  // namespace minidl::train
