// The training loop of train.h. Evaluation, divergence checks and the SIGINT stop all happen at
// optimizer-step boundaries, so an interrupted run's weights and metrics are always consistent.
#include "experiments/harness/train.h"

#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <optional>
#include <sstream>
#include <thread>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/backend.h"
#include "core/generator.h"
#include "distributed/data_parallel.h"
#include "distributed/process_group.h"
#include "experiments/harness/batch_schedule.h"
#include "experiments/harness/data_source.h"
#include "experiments/harness/eta.h"
#include "experiments/harness/evaluate.h"
#include "experiments/harness/gpu_monitor.h"
#include "experiments/harness/graphed_step.h"
#include "experiments/harness/model.h"
#include "experiments/harness/run_state.h"
#include "nn/safetensors.h"
#include "optim/accumulation.h"
#include "optim/grad_scaler.h"
#include "optim/schedule.h"

namespace minidl::harness {
namespace {

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point t) { return std::chrono::duration<double>(Clock::now() - t).count(); }

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
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

// A diverged run's note. A high but finite loss may be one that would recover (Adam's first steps
// on photos), so the note names the limit and the flag that raises it.
std::string diverged_note(double loss, int64_t step, double limit) {
  char b[320];
  if (std::isfinite(loss))
    std::snprintf(b, sizeof(b), "training loss %.4g at step %lld above --diverge-loss %g; if it would recover, "
                  "give a higher --diverge-loss", loss, static_cast<long long>(step), limit);
  else
    std::snprintf(b, sizeof(b), "training loss %g at step %lld; a lower --lr or --max-grad-norm may keep it finite",
                  loss, static_cast<long long>(step));
  return b;
}

// Why an epoch ended before its last micro-batch, for its line instead of "done".
std::string epoch_cut_reason(const RunResult& r, const TrainConfig& c, int64_t steps) {
  if (r.status == "oom") return "out of memory in step " + std::to_string(steps + 1);
  if (r.status == "interrupted") return "interrupted (" + r.note + ")";
  if (r.status == "diverged") return "diverged at step " + std::to_string(steps);
  return "stopped at --max-steps " + std::to_string(c.max_steps);
}

// A batch larger than the training set would train every step on the whole set while its memory
// and any learning-rate scaling are those of the asked batch: refused (an `error` row in a sweep,
// whose other batches may fit). `train_size` is this rank's share under several ranks.
void check_batch_fits_data(const TrainConfig& c, const EpochBatches& batches, int64_t train_size) {
  int64_t largest = 0, at = 1;
  for (int64_t e = 1; e <= c.epochs; ++e)
    if (batches.scheduled(e) > largest) largest = batches.scheduled(e), at = e;
  if (largest <= train_size) return;
  const std::string set = c.world_size > 1 ? std::to_string(train_size) + " images per rank over " +
                                                 std::to_string(c.world_size) + " ranks"
                                           : std::to_string(train_size) + " images";
  const std::string what = batches.schedule().active() ? "--batch-schedule " + c.batch_schedule + ": batch " +
                                                             std::to_string(largest) + " at epoch " + std::to_string(at)
                                                       : "--batch-size " + std::to_string(c.batch_size);
  throw RunInputError(what + " is larger than the training set (" + set + "): use a batch of at most " +
                      std::to_string(train_size) + ", or a --split with more training images");
}

}  // namespace

namespace {

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
  void finish();

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
  bool optimal_under_budget_ = false;
  double optimal_room_ = 0.0;
  std::optional<EpochBatches> batches_;
  int64_t total_steps_ = 0;
  std::string spec_;
  std::unique_ptr<optim::LrSchedule> schedule_;
  std::unique_ptr<optim::Optimizer> opt_;
  std::unique_ptr<optim::GradScaler> scaler_;
  std::unique_ptr<optim::AccumulatingTrainer> trainer_;
  std::unique_ptr<GraphedStep> graphed_;
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
};

Run::Run(const TrainConfig& c, const RunHooks& hooks) : c_(c), hooks_(hooks) {
  validate(c_);
  // Several ranks (mpirun -np N): each trains on its shard, gradients are averaged by DataParallel,
  // every decision that ends a loop is agreed, and rank 0 alone logs and writes files.
  group_ = c_.world_size > 1 ? &distributed::world() : nullptr;
  if (group_ && group_->world_size() != c_.world_size)
    throw UsageError("the configuration says " + std::to_string(c_.world_size) + " ranks but this process is " +
                     group_->describe());
  lead_ = group_ == nullptr || group_->rank() == 0;
  device_ = resolve_device(c_.device);
  budget_reset_.device = device_;
  apply_backend_switches(c_, device_);
  // The previous run of a sweep (same process) leaves its blocks cached on a caching allocator:
  // released here, so this run's reserved and peak-reserved figures, and the optimal plan's room
  // under the budget (reserved counts), are its own.
  empty_cache(device_);
  reset_peak_stats(device_);
  r_.device_name = device_description(device_);
}

void Run::log(const std::string& s) const {
  if (!lead_) return;
  if (hooks_.log) hooks_.log(s);
  else if (!c_.quiet) std::printf("%s\n", s.c_str()), std::fflush(stdout);
}

void Run::load_model() {
  m_ = make_model(c_, c_.seed * 4 + 3);
  // A file of another model or not safetensors at all is a usage error (exit 2). Only the resumed
  // file's metadata is kept: its tensors would count against --memory-budget for the whole run.
  if (!c_.init_weights.empty())
    load_weights(m_, "--init-weights", c_.init_weights, read_weights_file("--init-weights", c_.init_weights));
  if (!c_.resume.empty()) {
    nn::SafetensorsFile f = read_weights_file("--resume", c_.resume);
    load_weights(m_, "--resume", c_.resume, f);
    resumed_meta_ = std::move(f.metadata);
  }
  if (!c_.save_initial_weights.empty() && lead_) {
    nn::save_safetensors(c_.save_initial_weights, m_.module->state_dict(), {{"model", c_.model}, {"steps", "0"}});
    log("saved the initial weights to " + c_.save_initial_weights);
  }
  m_.module->to(device_);
  m_.module->train();
  r_.parameters = m_.module->num_parameters();
  // The replicas start from rank 0's parameters and buffers; the gradients of every stepping
  // micro-batch are averaged in buckets during backward (the trainer's .sync below).
  if (group_) dp_ = std::make_unique<distributed::DataParallel>(*m_.module, *group_);
}

// A budget that cannot even hold the weights, their gradients and the optimizer state is a
// configuration error, not an out-of-memory result.
void Run::apply_budget() {
  if (c_.memory_budget.empty()) return;
  const int64_t budget = static_cast<int64_t>(parse_bytes(c_.memory_budget));
  // allocated: the weights (and anything else already on the device); then gradients and state.
  const int64_t fixed = memory_stats(device_).allocated_bytes +
                        static_cast<int64_t>(m_.module->parameter_bytes() * (1.0 + optimizer_state_factor(c_)));
  if (fixed > budget)
    throw UsageError("--memory-budget " + c_.memory_budget + " is smaller than the model itself: " + c_.model +
                     " needs " + format_bytes(static_cast<size_t>(fixed)) + " for weights, gradients and optimizer state");
  set_memory_budget(device_, static_cast<size_t>(budget));
  budget_reset_.armed = true;
}

void Run::load_data() {
  // Every rank reads the same split; rank 0 first when it writes the --manifest the others read.
  const Shard shard{group_ ? group_->rank() : 0, group_ ? group_->world_size() : 1};
  if (group_ && !c_.manifest.empty() && !lead_) group_->barrier();
  data_ = make_run_data(c_, device_, m_.image_size, shard);
  if (group_ && !c_.manifest.empty() && lead_) group_->barrier();
  // The optimal plan's limit, when derived by the Recomputer at the first forward, cannot know
  // that the optimizer's state is allocated only at the first step: leave room for it here. The
  // room is taken now, before the state exists; a batch schedule changes only the input's share.
  optimal_under_budget_ =
      m_.recomputer && m_.checkpoint.kind == CheckpointSpec::Kind::Optimal && !c_.memory_budget.empty();
  if (optimal_under_budget_) {
    const auto ms = memory_stats(device_);
    const double state =
        static_cast<double>(m_.module->parameter_bytes()) * optimizer_state_factor(c_) * (c_.amp ? 1.5 : 1.0);
    optimal_room_ = 0.9 * (static_cast<double>(ms.budget_bytes - ms.reserved_bytes) - state);
  }
  set_optimal_limit(c_.batch_size);
  if (!data_.split_note.empty()) log(data_.split_note);
  if (!data_.validation_report.empty()) log(data_.validation_report);
  r_.data_description = data_.description;
  r_.split = data_.split;
  r_.val_images = (data_.val ? data_.val->size() : 0) * c_.world_size;
  r_.test_images = (data_.test ? data_.test->size() : 0) * c_.world_size;
  settle_skips();
}

void Run::set_optimal_limit(int64_t micro) {
  const double limit = optimal_room_ + static_cast<double>(micro * 3 * m_.image_size * m_.image_size * 4);
  if (optimal_under_budget_ && limit > 0) m_.recomputer->set_memory_limit(static_cast<int64_t>(limit));
}

// Unreadable files found while loading are counted out after each pass; one that empties a class's
// part ends the run (UsageError) on every rank at once.
void Run::settle_skips() {
  if (data_.account)
    r_.skipped_files = settle_late_skips(*data_.account, {data_.train.get(), data_.val.get(), data_.test.get()}, group_);
}

// The batches of every epoch, the optimizer steps, the warmup and the learning-rate schedule.
void Run::plan_steps() {
  TrainConfig fitted = c_;   // the batch of a bound (batch_up_to_data) down to the training set
  if (c_.batch_up_to_data && c_.batch_schedule.empty() && c_.batch_size > data_.train->size()) {
    fitted.batch_size = data_.train->size();
    log("batch " + std::to_string(c_.batch_size) + " is larger than the training set: training at batch " +
        std::to_string(fitted.batch_size) + ", the whole set");
  }
  batches_.emplace(fitted, data_.train->size());   // --batch-schedule (a fixed batch without it)
  check_batch_fits_data(fitted, *batches_, data_.train->size());
  total_steps_ = batches_->total_steps();
  if (c_.max_steps > 0) total_steps_ = std::min(total_steps_, c_.max_steps);
  const auto epoch_start_step = [&](double completed) { return batches_->epoch_start_step(completed); };
  r_.warmup_steps = c_.warmup_epochs > 0 ? static_cast<int64_t>(std::llround(epoch_start_step(c_.warmup_epochs)))
                                         : c_.warmup_steps;
  spec_ = (r_.warmup_steps > 0 ? "warmup:" + std::to_string(r_.warmup_steps) + "+" : "") +
          resolve_epoch_units(c_.schedule, epoch_start_step, c_.epochs, r_.warmup_steps);
  schedule_ = optim::parse_schedule(spec_, total_steps_);
  // A scheduled batch is tried before its phase where memory is limited (a budget, or a device's
  // own memory); on the CPU without a budget every batch fits.
  trials_ = batches_->schedule().active() && (!c_.memory_budget.empty() || !device_.is_cpu());
  limit_name_ = c_.memory_budget.empty() ? "the device memory" : "--memory-budget " + c_.memory_budget;
}

void Run::build_optimizer() {
  // --lr-scaling scales --lr from --base-batch to the first epoch's effective batch, once;
  // --batch-schedule-lr then scales it from the first epoch's batch to each later one.
  TrainConfig first_epoch_config = c_;
  first_epoch_config.batch_size = batches_->scheduled(1);
  r_.lr = first_epoch_config.scaled_lr();
  opt_ = make_optimizer(c_, *m_.module, r_.lr);
  optim::AccumulationOptions ao;
  ao.max_grad_norm = c_.max_grad_norm;
  // Mixed precision: dynamic loss scaling (PyTorch's defaults unless --amp-init-scale /
  // --amp-growth-interval), once per effective batch.
  optim::GradScalerOptions so;
  so.enabled = c_.amp;
  so.init_scale = c_.amp_init_scale;
  so.growth_interval = c_.amp_growth_interval;
  scaler_ = std::make_unique<optim::GradScaler>(so);
  if (c_.amp) ao.scaler = scaler_.get();
  ao.sync = dp_.get();
  // Built before the saved optimizer state is loaded: the trainer keeps the configured learning
  // rates as the schedule's base, while the saved ones are already scheduled (warmup, decay).
  trainer_ = std::make_unique<optim::AccumulatingTrainer>(*opt_, ao);
  // --cuda-graphs: full batches replay a captured step once the warm-up has stepped eagerly.
  if (c_.cuda_graphs) graphed_ = std::make_unique<GraphedStep>(m_, *trainer_, *opt_, *scaler_, device_);
}

void Run::resume() {
  if (!c_.resume.empty()) {
    rp_ = resume_point(c_, resumed_meta_, *batches_, *opt_, *scaler_, [this](const std::string& s) { log(s); });
    r_.best_val_acc = rp_.progress.best_val_acc;
    r_.best_epoch = rp_.progress.best_epoch;
    r_.time_to_target = rp_.progress.time_to_target;
  }
  r_.first_epoch = rp_.first_epoch;
  train_seconds_ = rp_.progress.train_seconds;
}

void Run::log_head() const {
  const EpochBatches& batches = *batches_;
  std::ostringstream head;
  head << c_.model << " (" << r_.parameters << " parameters) on " << r_.device_name << "; " << data_.description;
  if (group_)
    head << "; " << group_->world_size() << " ranks x batch " << batches.scheduled(1) << " per device x "
         << c_.accumulation_steps << " accumulation = effective batch "
         << group_->world_size() * batches.scheduled(1) * c_.accumulation_steps;
  else
    head << "; batch " << batches.scheduled(1) << " x " << c_.accumulation_steps << " accumulation = "
         << batches.scheduled(1) * c_.accumulation_steps;
  if (batches.schedule().active())
    head << " (--batch-schedule " << c_.batch_schedule << ", lr " << c_.batch_schedule_lr << ")";
  head << ", " << c_.optimizer << " lr " << r_.lr << " (" << c_.lr_scaling << " scaling), schedule " << spec_ << ", "
       << total_steps_ << " optimizer steps";
  log(head.str());
  if (!rp_.line.empty()) log(rp_.line);
}

bool Run::start_phase(Epoch& e) {
  const int64_t epoch = e.number;
  if (epoch != rp_.first_epoch && !batches_->phase_starts(epoch)) return true;
  const auto t_trial = Clock::now();
  const int64_t want = batches_->scheduled(epoch);
  if (epoch == rp_.first_epoch && rp_.batch) {
    eb_ = *rp_.batch;
  } else if (!trials_) {
    eb_ = {want, want, c_.accumulation_steps};
  } else {
    eb_ = fit_scheduled_batch(want, c_.accumulation_steps, [&](int64_t micro) {
      set_optimal_limit(micro);
      // Without communication (an OOM must not leave another rank in a collective); then the
      // ranks agree: the batch fits when it fits on every one.
      std::optional<distributed::DataParallel::NoSyncGuard> local;
      if (dp_) local.emplace(*dp_);
      const bool fits = trial_step_fits(m_, *opt_, c_, device_, micro, micro < want || c_.accumulation_steps > 1);
      return !agreed(!fits);
    });
    e.trial_seconds = seconds_since(t_trial);
  }
  if (eb_.micro == 0) {
    r_.status = "oom";
    r_.note = "--batch-schedule: not even a micro-batch of 1 fits " + limit_name_ + " at epoch " + std::to_string(epoch);
    return false;
  }
  if (graphed_ && eb_.accumulation > 1)
    throw UsageError("--cuda-graphs replays whole optimizer steps of one micro-batch, but --batch-schedule's batch " +
                     std::to_string(eb_.scheduled) + " at epoch " + std::to_string(epoch) + " fits " + limit_name_ +
                     " only as " + std::to_string(eb_.accumulation) + " accumulated micro-batches (use a smaller "
                     "scheduled batch, or run without --cuda-graphs)");
  set_optimal_limit(eb_.micro);
  data_.train->set_batch_size(eb_.micro);
  plan_ = optim::plan_accumulation(batches_->micro_sizes(eb_), eb_.accumulation);
  for (const std::string& line : batches_->phase_lines(epoch, eb_, limit_name_)) log(line);
  phase_note_ = batches_->progress_note(eb_);
  return true;
}

void Run::train_epoch(Epoch& e) {
  e.batch_lr = batches_->lr_factor(e.number);
  Progress& prog = rp_.progress;
  prog.batch_size = eb_.micro;
  prog.accumulation_steps = eb_.accumulation;
  prog.scheduled_batch = eb_.scheduled;
  e.em.epoch = e.number;
  e.em.batch_size = eb_.micro;
  e.em.accumulation_steps = eb_.accumulation;
  reset_peak_stats(device_);
  data_.train->start_epoch(e.number);
  // A resumed partial epoch: the order is a function of (seed, epoch), so skipping the
  // micro-batches already trained lands exactly where the saved run stopped.
  if (e.number == rp_.first_epoch)
    while (e.i < static_cast<size_t>(rp_.skip_micro) && e.i < plan_.size() && data_.train->next()) ++e.i;
  e.wait0 = data_.train->wait_seconds();
  e.cpu0 = cpu_seconds();
  e.gpu.emplace(device_);
  e.t0 = Clock::now();
  try {
    for (;;) {
      auto b = data_.train->next();
      // A file found unreadable while loading can leave one rank a batch short: all ranks end
      // the epoch together rather than wait for it in the next allreduce.
      if (group_ ? group_->any(!b) : !b) break;
      if (e.i == plan_.size()) break;  // the loader delivered more than planned: never step twice
      if (!micro_batch(e, *b)) break;
    }
  } catch (const OutOfMemoryError& x) {
    if (group_) throw;   // the other ranks may wait in a collective: the job ends (run_or_abort)
    r_.status = "oom";
    r_.note = x.what();
    stop_ = e.cut = true;
    opt_->zero_grad();
  }
}

bool Run::micro_batch(Epoch& e, const TensorBatch& b) {
  if (e.i % static_cast<size_t>(eb_.accumulation) == 0) {
    const double f = schedule_->factor(opt_->step_count()) * e.batch_lr;
    for (size_t g = 0; g < opt_->num_groups(); ++g) opt_->set_lr(g, trainer_->base_lrs()[g] * f);
  }
  e.gpu->step_begin();
  if (dp_) dp_->sync_buffers();
  const int64_t n = b.labels.size(0);
  optim::MicroBatch mb = plan_[e.i];
  if (mb.samples != n) mb.loss_weight = std::min(1.0, mb.loss_weight * static_cast<double>(n) / mb.samples);
  // A replay has updated the weights when it returns: its loss is checked after the update.
  const bool replay = graphed_ && graphed_->replayable(b.images, mb, eb_.micro);
  Tensor logits, loss, labels = b.labels;
  bool stepped = false;
  if (replay) {
    const GraphedStep::Output out = graphed_->step(b.images, b.labels);
    logits = out.logits, loss = out.loss, labels = out.labels, stepped = out.stepped;
  } else {
    logits = m_.forward(b.images);
    loss = m_.loss(logits, b.labels);
  }
  const double lv = loss.item();
  e.loss_sum += lv * static_cast<double>(n);
  e.correct += m_.correct(logits, labels);
  e.em.images += n;
  session_images_ += n;
  if (agreed(!std::isfinite(lv) || lv > diverge_loss_)) {   // every rank stops at the same micro-batch
    r_.status = "diverged";
    r_.note = group_ && std::isfinite(lv) && lv <= diverge_loss_
                  ? "another rank's training loss was NaN or above --diverge-loss at step " +
                        std::to_string(opt_->step_count())
                  : diverged_note(lv, opt_->step_count(), diverge_loss_);
    stop_ = e.cut = true;
    return false;
  }
  if (!replay) stepped = graphed_ ? graphed_->eager_step(loss, mb, b.images) : trainer_->micro_batch(loss, mb);
  e.gpu->step_end();
  ++e.i;
  if (!e.t_steady && e.i % static_cast<size_t>(eb_.accumulation) == 0) {
    synchronize(device_);   // the window's queued device work belongs to the warm-up
    e.t_steady = Clock::now();
    e.images_steady0 = e.em.images;
  }
  if (!stepped) return true;
  const int64_t step = opt_->step_count();
  if (hooks_.on_step) hooks_.on_step(step);
  eta_->stepped(step, seconds_since(t_loop_), session_images_);
  if (!c_.quiet && ((c_.progress_every > 0 && step % c_.progress_every == 0) ||
                    (c_.progress_seconds > 0 && seconds_since(t_line_) >= c_.progress_seconds)))
    progress_line(e, step);
  if (agreed(stop_requested())) {
    r_.status = "interrupted";
    r_.note = std::string(stop_signal_name()) + " at step " + std::to_string(step);
    stop_ = e.cut = true;
    return false;
  }
  if (c_.max_steps > 0 && step >= c_.max_steps) {
    stop_ = e.cut = true;
    return false;
  }
  return true;
}

// Every --progress-every steps and every --progress-seconds; the ETA counts the evaluations to come
// and leaves the first step's warm-up out of the rate (eta.h).
void Run::progress_line(const Epoch& e, int64_t step) {
  t_line_ = Clock::now();
  const double dt = seconds_since(e.t0);
  const auto ms = memory_stats(device_);
  char line[320];
  std::snprintf(line, sizeof(line),
                "epoch %lld step %lld/%lld  loss %.4f  acc %.2f%%  %.1f img/s  data wait %.1f%%  "
                "mem %s allocated, %s peak  ETA %s",
                static_cast<long long>(e.number), static_cast<long long>(step), static_cast<long long>(total_steps_),
                e.loss_sum / static_cast<double>(e.em.images),
                100.0 * static_cast<double>(e.correct) / static_cast<double>(e.em.images),
                // rank 0's shard's loss and accuracy; images/s of all ranks (equal shards)
                static_cast<double>(e.em.images * c_.world_size) / dt,
                100.0 * (data_.train->wait_seconds() - e.wait0) / dt,
                format_bytes(static_cast<size_t>(ms.allocated_bytes)).c_str(),
                format_bytes(static_cast<size_t>(ms.peak_allocated_bytes)).c_str(),
                format_duration(eta_->seconds_left(step, e.number)).c_str());
  log(line + phase_note_);
}

void Run::end_epoch(Epoch& e) {
  EpochMetrics& em = e.em;
  const bool complete = !e.cut || e.i == plan_.size();
  // Device kernels are asynchronous: the last step's backward and update may still be queued.
  synchronize(device_);
  em.train_seconds = seconds_since(e.t0) + e.trial_seconds;   // a phase's trials are its cost
  if (e.t_steady && em.images > e.images_steady0) {
    const double steady_s = seconds_since(*e.t_steady);
    em.steady_images = em.images - e.images_steady0;
    em.steady_seconds = steady_s;
    em.images_per_second_steady = steady_s > 0 ? static_cast<double>(em.steady_images) / steady_s : 0.0;
  }
  if (group_) {
    // The epoch's figures over all ranks: images (padding included), loss and accuracy of the union
    // of the shards; the times are this rank's.
    double images = static_cast<double>(em.images), steady = static_cast<double>(em.steady_images),
           right = static_cast<double>(e.correct);
    sum_over_ranks(group_, {&images, &steady, &e.loss_sum, &right});
    em.images = static_cast<int64_t>(images);
    em.steady_images = static_cast<int64_t>(steady);
    e.correct = static_cast<int64_t>(right);
    if (em.steady_seconds > 0) em.images_per_second_steady = steady / em.steady_seconds;
  }
  em.gpu_busy = e.gpu->stop(em.train_seconds) / 100.0;
  em.gpu_busy_source = e.gpu->source();
  train_seconds_ += em.train_seconds;
  rp_.progress.epoch = e.number;
  rp_.progress.micro_batches = complete ? 0 : static_cast<int64_t>(e.i);
  em.steps = opt_->step_count();
  em.lr = opt_->lr(0);
  em.train_loss = em.images > 0 ? e.loss_sum / static_cast<double>(em.images) : 0.0;
  em.train_acc = em.images > 0 ? static_cast<double>(e.correct) / static_cast<double>(em.images) : 0.0;
  em.images_per_second = em.train_seconds > 0 ? static_cast<double>(em.images) / em.train_seconds : 0.0;
  em.data_wait_fraction = em.train_seconds > 0 ? (data_.train->wait_seconds() - e.wait0) / em.train_seconds : 0.0;
  em.cpu_utilization = em.train_seconds > 0 ? (cpu_seconds() - e.cpu0) / em.train_seconds /
                                                  std::max(1u, std::thread::hardware_concurrency())
                                            : 0.0;
  const auto ms = memory_stats(device_);
  em.peak_allocated = ms.peak_allocated_bytes;
  em.peak_reserved = ms.peak_reserved_bytes;
  r_.peak_allocated = std::max(r_.peak_allocated, em.peak_allocated);
  r_.peak_reserved = std::max(r_.peak_reserved, em.peak_reserved);
  evaluate_epoch(e, complete);
  settle_skips();
  if (em.images > 0) {
    r_.epochs.push_back(em);
    log(epoch_done_line(em, e.number, c_.epochs, complete ? "" : epoch_cut_reason(r_, c_, opt_->step_count())));
    if (hooks_.on_epoch) hooks_.on_epoch(em);
  }
}

void Run::evaluate_epoch(Epoch& e, bool complete) {
  if (r_.status != "ok" && r_.status != "interrupted") {
    e.em.val_loss = e.em.val_acc = std::numeric_limits<double>::quiet_NaN();
    return;
  }
  const auto t_eval = Clock::now();
  const EvalResult v = evaluate(m_, data_.val.get(), group_);
  eta_->evaluated(seconds_since(t_eval), data_.val ? data_.val->size() : 0);
  e.em.val_loss = v.loss;
  e.em.val_acc = v.acc;
  if (std::isfinite(v.acc) && !(v.acc <= r_.best_val_acc)) r_.best_val_acc = v.acc, r_.best_epoch = e.number;
  if (c_.target_accuracy > 0 && r_.time_to_target < 0 && v.acc >= c_.target_accuracy) r_.time_to_target = train_seconds_;
  if (complete) {
    rp_.progress.best_val_acc = r_.best_val_acc;
    rp_.progress.best_epoch = r_.best_epoch;
    rp_.progress.time_to_target = r_.time_to_target;
  }
}

// The test set, once, and --save-weights.
void Run::finish() {
  if (graphed_)
    log("--cuda-graphs: " + std::to_string(graphed_->replays()) + " steps replayed from " +
        std::to_string(graphed_->captures()) + " capture(s); the others ran eagerly (warm-up, a new batch shape, "
        "partial batches)");
  r_.steps = opt_->step_count();
  r_.train_seconds = train_seconds_;
  const bool evaluates = r_.status == "ok" || r_.status == "interrupted";
  const EvalResult t = evaluates ? evaluate(m_, data_.test.get(), group_) : EvalResult{};
  settle_skips();
  r_.test_acc = t.acc;
  r_.test_loss = t.loss;
  if (!c_.save_weights.empty() && r_.status != "oom") {
    Progress& prog = rp_.progress;
    prog.train_seconds = train_seconds_;
    prog.rng_seed = default_generator().seed();
    prog.rng_offset = default_generator().offset();
    prog.world_size = c_.world_size;
    save_state(c_.save_weights, m_, *opt_, *scaler_, prog, group_);
    log("saved weights to " + c_.save_weights + " (optimizer state: " + optimizer_state_path(c_.save_weights) + ")");
  }
  r_.total_seconds = seconds_since(t_start_);
}

RunResult Run::execute() {
  load_model();
  apply_budget();
  load_data();
  plan_steps();
  build_optimizer();
  resume();
  log_head();
  diverge_loss_ = c_.resolved_diverge_loss();
  t_loop_ = t_line_ = Clock::now();
  eta_.emplace(total_steps_, c_.epochs, data_.val ? data_.val->size() : 0, data_.test ? data_.test->size() : 0);
  for (int64_t epoch = rp_.first_epoch; epoch <= c_.epochs && !stop_; ++epoch) {
    if (epoch > rp_.first_epoch && agreed(stop_requested())) {  // SIGINT during the last evaluation
      r_.status = "interrupted";
      r_.note = std::string(stop_signal_name()) + " before epoch " + std::to_string(epoch);
      break;
    }
    Epoch e;
    e.number = epoch;
    if (!start_phase(e)) break;
    train_epoch(e);
    end_epoch(e);
  }
  finish();
  return r_;
}

}  // namespace

RunResult run_training(const TrainConfig& c, const RunHooks& hooks) { return Run(c, hooks).execute(); }

}  // namespace minidl::harness
