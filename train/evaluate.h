// A model's loss and accuracy over a batch source, for one process or summed over the ranks of a
// data-parallel run (each rank evaluates its own part; the counts are added, so the accuracy is
// the whole set's). Internal to the trainer (run.cpp).
#pragma once
#include <initializer_list>
#include <limits>

#include "distributed/process_group.h"
#include "train/data_source.h"
#include "train/graphed_step.h"
#include "train/model.h"

namespace minidl::train {

struct EvalResult {
  double loss = std::numeric_limits<double>::quiet_NaN();   // NaN: no image anywhere
  double acc = std::numeric_limits<double>::quiet_NaN();
};

// Each value summed over the ranks in one allreduce (f64, so counts stay exact); nothing without
// a group (null).
void sum_over_ranks(distributed::ProcessGroup* group, std::initializer_list<double*> values);

// Loss and accuracy of m (in eval mode, no gradients) over src (null or empty: nothing from this
// rank). With a group the sums (loss x images, correct predictions, images) are added over the
// ranks, not the shards' accuracies averaged; every rank must then call it. With `graphed`
// (CUDA graphs) the batches it can replay (GraphedStep::eval_replayable) are replays of a
// captured forward, the others eager, with the same results.
EvalResult evaluate(Model& m, BatchSource* src, distributed::ProcessGroup* group, GraphedStep* graphed = nullptr);

}  // namespace minidl::train
