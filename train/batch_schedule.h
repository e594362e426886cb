// --batch-schedule: the batch size as a function of the epoch (grow the batch as training settles,
// instead of or beside decaying the learning rate: Smith et al. 2017), the learning-rate rule at
// each change, the fallback to gradient accumulation when a scheduled batch does not fit the
// memory budget, and epoch units in --schedule milestones, which become optimizer steps only once
// the batch of every epoch is known.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/device.h"
#include "train/config.h"
#include "train/model.h"
#include "optim/optimizer.h"

namespace minidl::train {

// A parsed --batch-schedule. Epochs count completed epochs, as PyTorch's MultiStepLR milestones:
// "64@5" takes effect after five epochs, i.e. from the sixth ("epoch 6/N" in the progress lines);
// "@0" is the first epoch. Forms:
//   B0@0,B1@E1,B2@E2,...  explicit batches (epochs strictly increasing; before the first entry,
//                         the initial batch, --batch-size)
//   xF@every:N            the initial batch times F after every N epochs (F an integer >= 2)
//   xF@E1,E2,...          the initial batch times F at each listed epoch
// An empty spec is a constant batch.
class BatchSchedule {
 public:
  // Throws UsageError naming --batch-schedule, the bad part and the expected forms.
  static BatchSchedule parse(const std::string& spec, int64_t initial_batch);
  bool active() const { return !spec_.empty(); }
  const std::string& spec() const { return spec_; }
  // The batch of the epoch that starts after `completed` epochs (0: the first epoch).
  int64_t batch_at(int64_t completed) const;

 private:
  std::string spec_;
  int64_t initial_ = 1;
  std::vector<std::pair<int64_t, int64_t>> entries_;  // explicit form: (epoch, batch)
  int64_t factor_ = 0;                                // growth forms
  int64_t every_ = 0;                                 // xF@every:N
  std::vector<int64_t> at_;                           // xF@E1,E2,...
};

// What one epoch trains with.
struct EpochBatch {
  int64_t scheduled = 0;     // the schedule's batch (the micro-batch it asks for)
  int64_t micro = 0;         // the micro-batch used: smaller than `scheduled` when that did not fit
  int64_t accumulation = 1;  // micro-batches per optimizer step: --accumulation-steps x the fallback's
  int64_t effective() const { return micro * accumulation; }
  bool fell_back() const { return micro != scheduled; }
};

// The learning-rate multiplier of --batch-schedule-lr for an epoch whose scheduled batch is `batch`
// in a run whose first epoch had `first_batch`: keep 1, linear batch / first_batch, sqrt its root.
double batch_schedule_lr_factor(const std::string& rule, int64_t batch, int64_t first_batch);

// Epoch units in a --schedule spec: "multistep:4e,8e:0.25" or "step:3e:0.5" (decimals allowed,
// "2.5e"). Each E e becomes epoch_start_step(E), the optimizer step at which epoch E (completed
// epochs, as above) starts, minus `warmup_steps` (the inner schedule starts after the warmup, so
// the decay still happens at the epoch boundary); step:Ne becomes multistep at N, 2N, ... below
// `epochs` (constant when there is none). A spec without epoch units comes back unchanged. Throws
// UsageError when a milestone falls inside the warmup.
std::string resolve_epoch_units(const std::string& spec, const std::function<double(double)>& epoch_start_step,
                                int64_t epochs, int64_t warmup_steps);

// The micro-batch and accumulation for a scheduled batch: `scheduled` itself when fits(scheduled);
// else the largest micro-batch that fits (bisection between 0 and `scheduled`, one fits() call per
// step), split exactly (micro x steps = scheduled) with the fewest steps up to twice the fewest
// possible, else as the finder's accumulation_for (slightly more than scheduled); the steps are
// multiplied into `accumulation`. micro 0 when not even a micro-batch of 1 fits.
EpochBatch fit_scheduled_batch(int64_t scheduled, int64_t accumulation, const std::function<bool(int64_t)>& fits);

// The batch of every epoch of one run: the schedule over the run's epochs, the optimizer steps it
// implies for `train_size` images (ceil(N / effective batch) per epoch, which a fallback to
// accumulation keeps: ceil(ceil(N / m) / k) = ceil(N / mk)), and what the run logs at a phase start.
class EpochBatches {
 public:
  EpochBatches(const TrainConfig& c, int64_t train_size);
  const BatchSchedule& schedule() const { return schedule_; }
  int64_t scheduled(int64_t epoch) const;      // the schedule's batch of epoch (1-based)
  bool phase_starts(int64_t epoch) const;      // epoch 1, or a batch other than the epoch before's
  int64_t steps(int64_t epoch) const;          // optimizer steps of epoch (clamped to 1..epochs)
  int64_t total_steps() const;
  // The optimizer step at which the epoch after `completed` epochs starts (fractional: within it).
  double epoch_start_step(double completed) const;
  // --batch-schedule-lr's multiplier for epoch: its batch against the first epoch's.
  double lr_factor(int64_t epoch) const;
  // The micro-batch sizes of an epoch at eb.micro (the last one may be short).
  std::vector<int64_t> micro_sizes(const EpochBatch& eb) const;
  // The log lines of a phase start (none without a schedule and without a fallback) and the
  // progress lines' suffix for it ("  batch 128 (64 x 2: 128 does not fit)").
  std::vector<std::string> phase_lines(int64_t epoch, const EpochBatch& eb, const std::string& limit_name) const;
  std::string progress_note(const EpochBatch& eb) const;

 private:
  BatchSchedule schedule_;
  std::string lr_rule_;
  int64_t accumulation_ = 1, train_size_ = 0;
  std::vector<int64_t> batch_;   // [epoch], 1-based
};

// The honest "does it fit" test: one training step's forward and backward of `micro` random images
// (two micro-batches when `accumulating`: the second adds into the first one's gradients) through
// the run's own model under its memory budget, an OutOfMemoryError caught. It also holds what the
// step adds that a bare forward/backward does not: the loader's next batch, the optimizer state
// when no step has made it yet, and, after the backward, the unfused update's temporaries (copies
// of the largest parameter: SGD one per weight decay and Nesterov, Adam two plus one with weight
// decay). Batch-norm running statistics, the default generator and the gradients
// are restored, so the run's numbers do not depend on it.
bool trial_step_fits(Model& m, optim::Optimizer& opt, const TrainConfig& c, Device device, int64_t micro,
                     bool accumulating);

}  // namespace minidl::train
