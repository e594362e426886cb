// The parts of one training run (run.h's run_training), shared by the two files that define
// them: run.cpp sets a run up and drives it, run_epoch.cpp trains and closes its epochs. Not a
// public interface: programs call run_training.
#pragma once
#include <chrono>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/device.h"
#include "distributed/data_parallel.h"
#include "distributed/process_group.h"
#include "train/batch_schedule.h"
#include "train/data_source.h"
#include "train/eta.h"
#include "train/evaluate.h"
#include "train/gpu_monitor.h"
#include "train/graphed_step.h"
#include "train/model.h"
#include "train/run_state.h"
#include "train/step.h"
#include "train/run.h"
#include "optim/accumulation.h"
#include "optim/grad_scaler.h"
#include "optim/schedule.h"

namespace minidl::train::detail {

using Clock = std::chrono::steady_clock;

inline double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Removes the run's memory budget however run_training ends: an exception after the budget was
// set (a refused --resume) must not leave it on the device for the next run of a sweep.
struct BudgetReset {
  Device device;
  bool armed = false;
  ~BudgetReset() {
    if (armed) set_memory_budget(device, 0);
  }
};

// One run of run_training, as named parts: the set-up (model, budget, data, optimizer, resume),
// then per epoch its batch phase, its micro-batches and its end (metrics, evaluation, line), then
// the end of the run (test evaluation, saving). The members are what the parts share.
class Run {
 public:
  Run(const TrainConfig& c, const RunHooks& hooks);
  RunResult execute();

 private:
  // Everything an epoch's micro-batches share until its end.
  struct Epoch {
    int64_t number = 0;
    EpochMetrics em;
    size_t i = 0;                     // micro-batches done
    double wait0 = 0.0, cpu0 = 0.0;   // the loader's wait and the process's CPU time at the start
    double device_wait = 0.0;         // seconds blocked on the device's work (EpochMetrics)
    double trial_seconds = 0.0;       // the phase's batch trials, counted as the epoch's cost
    double batch_lr = 1.0;            // --batch-schedule-lr's factor for this epoch's batch
    std::optional<GpuBusyMeter> gpu;
    Clock::time_point t0;
    std::optional<Clock::time_point> t_steady;
    int64_t images_steady0 = 0;
    double loss_sum = 0.0;
    int64_t correct = 0;
    bool cut = false;                 // left early (divergence, SIGINT, --max-steps, OOM)
  };

  void log(const std::string& s) const;
  bool agreed(bool flag) const { return group_ ? group_->any(flag) : flag; }
  void load_model();
  void apply_budget();
  void load_data();
  void set_optimal_limit(int64_t micro);
  void log_new_plans();
  void settle_skips();
  void plan_steps();
  void build_optimizer();
  void resume();
  void log_head() const;
  // The epoch's batch when a phase of the batch schedule starts (trials where memory is limited);
  // false when not even a micro-batch of 1 fits.
  bool start_phase(Epoch& e);
  void train_epoch(Epoch& e);
  // One micro-batch; false when the epoch ends after it.
  bool micro_batch(Epoch& e, const TensorBatch& b);
  void progress_line(const Epoch& e, int64_t step);
  void end_epoch(Epoch& e);
  void evaluate_epoch(Epoch& e, bool complete);
  // train::evaluate on src; an evaluation that runs out of memory ends the run as a training step's
  // does (status "oom", the note naming `pass`), with NaN results, and the weights it trained stay
  // whole (--save-weights still saves them).
  EvalResult evaluate_or_stop(BatchSource* src, const std::string& pass);
  void finish();
  // The graphs' counts into the result and their summary line (after --save-weights, whose copies
  // may drop them: GraphedStep::make_room).
  void report_graphs();

  const TrainConfig& c_;
  const RunHooks& hooks_;
  distributed::ProcessGroup* group_ = nullptr;
  bool lead_ = true;
  Clock::time_point t_start_ = Clock::now();
  Device device_;
  RunResult r_;
  Model m_;
  std::map<std::string, std::string> resumed_meta_;
  std::unique_ptr<distributed::DataParallel> dp_;
  BudgetReset budget_reset_;
  RunData data_;
  bool optimal_under_budget_ = false;   // --checkpoint optimal with --memory-budget: optimal_recompute_limit
  int64_t plans_logged_ = 0;            // --checkpoint optimal: the plans printed (one per profiled shape)
  std::optional<EpochBatches> batches_;
  int64_t total_steps_ = 0;
  std::string spec_;
  std::unique_ptr<optim::LrSchedule> schedule_;
  std::unique_ptr<optim::Optimizer> opt_;
  std::unique_ptr<optim::GradScaler> scaler_;
  std::unique_ptr<Step> step_;   // forward, backward, update (or a graph's replay)
  ResumePoint rp_;   // where this session starts: epoch 1, or where the --resume file stopped
  bool trials_ = false;
  std::string limit_name_;
  EpochBatch eb_;                          // the current phase's batch
  std::vector<optim::MicroBatch> plan_;    // its micro-batches' accumulation windows
  std::string phase_note_;                 // the progress lines' suffix
  double train_seconds_ = 0.0;
  double diverge_loss_ = 0.0;
  Clock::time_point t_loop_, t_line_;
  int64_t session_images_ = 0;
  std::optional<RunEta> eta_;
  bool stop_ = false;
  bool evaluation_oom_ = false;   // the run's OOM came in an evaluation, after whole steps
};

}  // namespace minidl::train::detail
