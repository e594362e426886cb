// The training loop of run.h: a run's set-up and its order of parts (run_parts.h); the
// epochs themselves are run_epoch.cpp's. Evaluation, divergence checks and the SIGINT stop all
// happen at optimizer-step boundaries, so an interrupted run's weights and metrics are always
// consistent.
#include "train/run.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <sstream>

#include "core/backend.h"
#include "train/run_footprint.h"
#include "train/run_parts.h"
#include "nn/safetensors.h"

namespace minidl::train {
namespace detail {
namespace {

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
  // under the budget (reserved counts), are its own. The libraries' workspaces come first, as in
  // every trial of minidl-maxbatch: held from here on, as they are by every later run of the process.
  empty_cache(device_);
  draw_library_workspaces(device_);
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
  // The optimal plan's limit comes from the configuration (optimal_recompute_limit), as in the
  // trials of minidl-maxbatch: the same plan at the same micro-batch, whatever the allocator holds.
  optimal_under_budget_ =
      m_.recomputer && m_.checkpoint.kind == CheckpointSpec::Kind::Optimal && !c_.memory_budget.empty();
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
  if (!optimal_under_budget_) return;
  m_.recomputer->set_memory_limit(optimal_recompute_limit(c_, static_cast<int64_t>(parse_bytes(c_.memory_budget)),
                                                          m_.module->parameter_bytes(),
                                                          run_footprint(c_, device_, m_.image_size), micro));
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
  so.enabled = c_.uses_grad_scaler();   // bf16 autocast needs none
  so.init_scale = c_.amp_init_scale;
  so.growth_interval = c_.amp_growth_interval;
  scaler_ = std::make_unique<optim::GradScaler>(so);
  ao.sync = dp_.get();
  // Built before the saved optimizer state is loaded: the trainer keeps the configured learning
  // rates as the schedule's base, while the saved ones are already scheduled (warmup, decay).
  // CUDA graphs (the default on CUDA): full batches replay a captured step once the warm-up has
  // stepped eagerly; a run that cannot replay says why and runs eagerly, and so does a batch shape
  // whose capture does not fit (unless --cuda-graphs requires graphs).
  std::string why;
  const bool graphs = c_.resolved_cuda_graphs(&why);
  if (!why.empty()) log("CUDA graphs: off for this run: " + why);
  step_ = std::make_unique<Step>(m_, *opt_, *scaler_, ao, graphs, device_);
  if (GraphedStep* g = step_->graphed(); g != nullptr && c_.cuda_graphs_fall_back())
    g->fall_back_when_a_capture_fails([this](const std::string& s) { log(s); });
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

RunResult Run::execute() {
  const ConvStatsCounts conv_stats_before = conv_stats_counts();
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
  const ConvStatsCounts now = conv_stats_counts();
  r_.conv_stats = {now.fused_forward - conv_stats_before.fused_forward,
                   now.composed_forward - conv_stats_before.composed_forward,
                   now.fused_backward - conv_stats_before.fused_backward,
                   now.composed_backward - conv_stats_before.composed_backward};
  if (c_.conv_bn_chain) {
    const ConvStatsCounts& k = r_.conv_stats;
    log("conv-bn chain: " + std::to_string(k.fused_forward) + " of " +
        std::to_string(k.fused_forward + k.composed_forward) + " forward and " + std::to_string(k.fused_backward) +
        " of " + std::to_string(k.fused_backward + k.composed_backward) +
        " backward convolution calls ran as the backend's fused graphs, the others composed (docs/conv_bn.md)");
  }
  return r_;
}

}  // namespace detail

RunResult run_training(const TrainConfig& c, const RunHooks& hooks) { return detail::Run(c, hooks).execute(); }

}  // namespace minidl::train
