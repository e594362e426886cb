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

RunResult run_training(const TrainConfig& c, const RunHooks& hooks) {
  validate(c);
  // Several ranks (mpirun -np N): each trains on its shard, gradients are averaged by DataParallel,
  // every decision that ends a loop is agreed, and rank 0 alone logs and writes files.
  distributed::ProcessGroup* group = c.world_size > 1 ? &distributed::world() : nullptr;
  if (group && group->world_size() != c.world_size)
    throw UsageError("the configuration says " + std::to_string(c.world_size) + " ranks but this process is " +
                     group->describe());
  const bool lead = group == nullptr || group->rank() == 0;
  const auto agreed = [&](bool flag) { return group ? group->any(flag) : flag; };
  const auto log = [&](const std::string& s) {
    if (!lead) return;
    if (hooks.log) hooks.log(s);
    else if (!c.quiet) std::printf("%s\n", s.c_str()), std::fflush(stdout);
  };
  const auto t_start = Clock::now();
  const Device device = resolve_device(c.device);
  apply_backend_switches(c, device);
  // The previous run of a sweep (same process) leaves its blocks cached on a caching allocator:
  // released here, so this run's reserved and peak-reserved figures, and the optimal plan's room
  // under the budget (reserved counts), are its own.
  empty_cache(device);
  reset_peak_stats(device);
  RunResult r;
  r.device_name = device_description(device);

  Model m = make_model(c, c.seed * 4 + 3);
  // A file of another model or not safetensors at all is a usage error (exit 2). Only the resumed
  // file's metadata is kept: its tensors would count against --memory-budget for the whole run.
  std::map<std::string, std::string> resumed_meta;
  if (!c.init_weights.empty())
    load_weights(m, "--init-weights", c.init_weights, read_weights_file("--init-weights", c.init_weights));
  if (!c.resume.empty()) {
    nn::SafetensorsFile f = read_weights_file("--resume", c.resume);
    load_weights(m, "--resume", c.resume, f);
    resumed_meta = std::move(f.metadata);
  }
  if (!c.save_initial_weights.empty() && lead) {
    nn::save_safetensors(c.save_initial_weights, m.module->state_dict(), {{"model", c.model}, {"steps", "0"}});
    log("saved the initial weights to " + c.save_initial_weights);
  }
  m.module->to(device);
  m.module->train();
  r.parameters = m.module->num_parameters();
  // The replicas start from rank 0's parameters and buffers; the gradients of every stepping
  // micro-batch are averaged in buckets during backward (the trainer's .sync below).
  std::unique_ptr<distributed::DataParallel> dp;
  if (group) dp = std::make_unique<distributed::DataParallel>(*m.module, *group);

  // A budget that cannot even hold the weights, their gradients and the optimizer state is a
  // configuration error, not an out-of-memory result.
  BudgetReset budget_reset{device};
  if (!c.memory_budget.empty()) {
    const int64_t budget = static_cast<int64_t>(parse_bytes(c.memory_budget));
    // allocated: the weights (and anything else already on the device); then gradients and state.
    const int64_t fixed = memory_stats(device).allocated_bytes +
                          static_cast<int64_t>(m.module->parameter_bytes() * (1.0 + optimizer_state_factor(c)));
    if (fixed > budget)
      throw UsageError("--memory-budget " + c.memory_budget + " is smaller than the model itself: " + c.model +
                       " needs " + format_bytes(static_cast<size_t>(fixed)) +
                       " for weights, gradients and optimizer state");
    set_memory_budget(device, static_cast<size_t>(budget));
    budget_reset.armed = true;
  }

  // Every rank reads the same split; rank 0 first when it writes the --manifest the others read.
  const Shard shard{group ? group->rank() : 0, group ? group->world_size() : 1};
  if (group && !c.manifest.empty() && !lead) group->barrier();
  RunData data = make_run_data(c, device, m.image_size, shard);
  if (group && !c.manifest.empty() && lead) group->barrier();
  // The optimal plan's limit, when derived by the Recomputer at the first forward, cannot know
  // that the optimizer's state is allocated only at the first step: leave room for it here. The
  // room is taken now, before the state exists; a batch schedule changes only the input's share.
  const bool optimal_under_budget =
      m.recomputer && m.checkpoint.kind == CheckpointSpec::Kind::Optimal && !c.memory_budget.empty();
  double optimal_room = 0.0;
  if (optimal_under_budget) {
    const auto ms = memory_stats(device);
    const double state = static_cast<double>(m.module->parameter_bytes()) * optimizer_state_factor(c) * (c.amp ? 1.5 : 1.0);
    optimal_room = 0.9 * (static_cast<double>(ms.budget_bytes - ms.reserved_bytes) - state);
  }
  const auto set_optimal_limit = [&](int64_t micro) {
    const double limit = optimal_room + static_cast<double>(micro * 3 * m.image_size * m.image_size * 4);
    if (optimal_under_budget && limit > 0) m.recomputer->set_memory_limit(static_cast<int64_t>(limit));
  };
  set_optimal_limit(c.batch_size);
  if (!data.split_note.empty()) log(data.split_note);
  if (!data.validation_report.empty()) log(data.validation_report);
  r.data_description = data.description;
  r.split = data.split;
  r.val_images = (data.val ? data.val->size() : 0) * c.world_size;
  r.test_images = (data.test ? data.test->size() : 0) * c.world_size;
  // Unreadable files found while loading are counted out after each pass; one that empties a
  // class's part ends the run (UsageError) on every rank at once.
  const auto settle_skips = [&] {
    if (data.account)
      r.skipped_files = settle_late_skips(*data.account, {data.train.get(), data.val.get(), data.test.get()}, group);
  };
  settle_skips();
  TrainConfig fitted = c;   // the batch of a bound (batch_up_to_data) down to the training set
  if (c.batch_up_to_data && c.batch_schedule.empty() && c.batch_size > data.train->size()) {
    fitted.batch_size = data.train->size();
    log("batch " + std::to_string(c.batch_size) + " is larger than the training set: training at batch " +
        std::to_string(fitted.batch_size) + ", the whole set");
  }
  const EpochBatches batches(fitted, data.train->size());   // --batch-schedule (a fixed batch without it)
  check_batch_fits_data(fitted, batches, data.train->size());
  int64_t total_steps = batches.total_steps();
  if (c.max_steps > 0) total_steps = std::min(total_steps, c.max_steps);
  const auto epoch_start_step = [&](double completed) { return batches.epoch_start_step(completed); };
  r.warmup_steps = c.warmup_epochs > 0 ? static_cast<int64_t>(std::llround(epoch_start_step(c.warmup_epochs)))
                                       : c.warmup_steps;
  const std::string spec = (r.warmup_steps > 0 ? "warmup:" + std::to_string(r.warmup_steps) + "+" : "") +
                           resolve_epoch_units(c.schedule, epoch_start_step, c.epochs, r.warmup_steps);
  const auto schedule = optim::parse_schedule(spec, total_steps);
  // --lr-scaling scales --lr from --base-batch to the first epoch's effective batch, once;
  // --batch-schedule-lr then scales it from the first epoch's batch to each later one.
  TrainConfig first_epoch_config = c;
  first_epoch_config.batch_size = batches.scheduled(1);
  r.lr = first_epoch_config.scaled_lr();
  auto opt = make_optimizer(c, *m.module, r.lr);
  optim::AccumulationOptions ao;
  ao.max_grad_norm = c.max_grad_norm;
  // Mixed precision: dynamic loss scaling (PyTorch's defaults unless --amp-init-scale /
  // --amp-growth-interval), once per effective batch.
  optim::GradScalerOptions so;
  so.enabled = c.amp;
  so.init_scale = c.amp_init_scale;
  so.growth_interval = c.amp_growth_interval;
  optim::GradScaler scaler(so);
  if (c.amp) ao.scaler = &scaler;
  ao.sync = dp.get();
  // Built before the saved optimizer state is loaded: the trainer keeps the configured learning
  // rates as the schedule's base, while the saved ones are already scheduled (warmup, decay).
  optim::AccumulatingTrainer trainer(*opt, ao);
  // --cuda-graphs: full batches replay a captured step once the warm-up has stepped eagerly.
  std::unique_ptr<GraphedStep> graphed;
  if (c.cuda_graphs) graphed = std::make_unique<GraphedStep>(m, trainer, *opt, scaler, device);
  ResumePoint rp;   // where this session starts: epoch 1, or where the --resume file stopped
  if (!c.resume.empty()) {
    rp = resume_point(c, resumed_meta, batches, *opt, scaler, log);
    r.best_val_acc = rp.progress.best_val_acc;
    r.best_epoch = rp.progress.best_epoch;
    r.time_to_target = rp.progress.time_to_target;
  }
  Progress& prog = rp.progress;
  const int64_t first_epoch = rp.first_epoch, skip_micro = rp.skip_micro;
  const std::optional<EpochBatch>& resumed_batch = rp.batch;
  const std::string& resumed_from = rp.line;
  r.first_epoch = first_epoch;

  // A scheduled batch is tried before its phase where memory is limited (a budget, or a device's
  // own memory); on the CPU without a budget every batch fits.
  const bool trials = batches.schedule().active() && (!c.memory_budget.empty() || !device.is_cpu());
  const std::string limit_name = c.memory_budget.empty() ? "the device memory" : "--memory-budget " + c.memory_budget;
  EpochBatch eb;                          // the current phase's batch
  std::vector<optim::MicroBatch> plan;    // its micro-batches' accumulation windows
  std::string phase_note;                 // the progress lines' suffix

  std::ostringstream head;
  head << c.model << " (" << r.parameters << " parameters) on " << r.device_name << "; " << data.description;
  if (group)
    head << "; " << group->world_size() << " ranks x batch " << batches.scheduled(1) << " per device x "
         << c.accumulation_steps << " accumulation = effective batch "
         << group->world_size() * batches.scheduled(1) * c.accumulation_steps;
  else
    head << "; batch " << batches.scheduled(1) << " x " << c.accumulation_steps << " accumulation = "
         << batches.scheduled(1) * c.accumulation_steps;
  if (batches.schedule().active())
    head << " (--batch-schedule " << c.batch_schedule << ", lr " << c.batch_schedule_lr << ")";
  head << ", " << c.optimizer << " lr " << r.lr << " (" << c.lr_scaling << " scaling), schedule " << spec << ", "
       << total_steps << " optimizer steps";
  log(head.str());
  if (!resumed_from.empty()) log(resumed_from);

  double train_seconds = prog.train_seconds;
  const double diverge_loss = c.resolved_diverge_loss();
  // The progress lines: every --progress-every steps and every --progress-seconds; their ETA
  // counts the evaluations to come and leaves the first step's warm-up out of the rate (eta.h).
  const auto t_loop = Clock::now();
  auto t_line = t_loop;
  int64_t session_images = 0;
  RunEta eta(total_steps, c.epochs, data.val ? data.val->size() : 0, data.test ? data.test->size() : 0);
  bool stop = false;
  for (int64_t epoch = first_epoch; epoch <= c.epochs && !stop; ++epoch) {
    if (epoch > first_epoch && agreed(stop_requested())) {  // SIGINT during the last evaluation
      r.status = "interrupted";
      r.note = std::string(stop_signal_name()) + " before epoch " + std::to_string(epoch);
      break;
    }
    double trial_seconds = 0.0;
    if (epoch == first_epoch || batches.phase_starts(epoch)) {
      const auto t_trial = Clock::now();
      const int64_t want = batches.scheduled(epoch);
      if (epoch == first_epoch && resumed_batch) {
        eb = *resumed_batch;
      } else if (!trials) {
        eb = {want, want, c.accumulation_steps};
      } else {
        eb = fit_scheduled_batch(want, c.accumulation_steps, [&](int64_t micro) {
          set_optimal_limit(micro);
          // Without communication (an OOM must not leave another rank in a collective); then the
          // ranks agree: the batch fits when it fits on every one.
          std::optional<distributed::DataParallel::NoSyncGuard> local;
          if (dp) local.emplace(*dp);
          const bool fits = trial_step_fits(m, *opt, c, device, micro, micro < want || c.accumulation_steps > 1);
          return !agreed(!fits);
        });
        trial_seconds = seconds_since(t_trial);
      }
      if (eb.micro == 0) {
        r.status = "oom";
        r.note = "--batch-schedule: not even a micro-batch of 1 fits " + limit_name + " at epoch " +
                 std::to_string(epoch);
        break;
      }
      if (graphed && eb.accumulation > 1)
        throw UsageError("--cuda-graphs replays whole optimizer steps of one micro-batch, but --batch-schedule's batch " +
                         std::to_string(eb.scheduled) + " at epoch " + std::to_string(epoch) + " fits " + limit_name +
                         " only as " + std::to_string(eb.accumulation) + " accumulated micro-batches (use a smaller "
                         "scheduled batch, or run without --cuda-graphs)");
      set_optimal_limit(eb.micro);
      data.train->set_batch_size(eb.micro);
      plan = optim::plan_accumulation(batches.micro_sizes(eb), eb.accumulation);
      for (const std::string& line : batches.phase_lines(epoch, eb, limit_name)) log(line);
      phase_note = batches.progress_note(eb);
    }
    const double batch_lr = batches.lr_factor(epoch);
    prog.batch_size = eb.micro;
    prog.accumulation_steps = eb.accumulation;
    prog.scheduled_batch = eb.scheduled;
    EpochMetrics em;
    em.epoch = epoch;
    em.batch_size = eb.micro;
    em.accumulation_steps = eb.accumulation;
    reset_peak_stats(device);
    data.train->start_epoch(epoch);
    size_t i = 0;
    // A resumed partial epoch: the order is a function of (seed, epoch), so skipping the
    // micro-batches already trained lands exactly where the saved run stopped.
    if (epoch == first_epoch)
      while (i < static_cast<size_t>(skip_micro) && i < plan.size() && data.train->next()) ++i;
    const double wait0 = data.train->wait_seconds();
    const double cpu0 = cpu_seconds();
    GpuBusyMeter gpu(device);
    const auto t0 = Clock::now();
    // The steady rate starts once the epoch's first accumulation window is done: that window pays
    // the warm-up (cuDNN autotuning and handle creation for new shapes, first-touch allocations).
    std::optional<Clock::time_point> t_steady;
    int64_t images_steady0 = 0;
    double loss_sum = 0.0;
    int64_t correct = 0;
    bool cut = false;   // left the epoch early (divergence, SIGINT, --max-steps, OOM)
    try {
      for (;;) {
        auto b = data.train->next();
        // A file found unreadable while loading can leave one rank a batch short: all ranks end
        // the epoch together rather than wait for it in the next allreduce.
        if (group ? group->any(!b) : !b) break;
        if (i == plan.size()) break;  // the loader delivered more than planned: never step twice
        if (i % static_cast<size_t>(eb.accumulation) == 0) {
          const double f = schedule->factor(opt->step_count()) * batch_lr;
          for (size_t g = 0; g < opt->num_groups(); ++g) opt->set_lr(g, trainer.base_lrs()[g] * f);
        }
        gpu.step_begin();
        if (dp) dp->sync_buffers();
        const int64_t n = b->labels.size(0);
        optim::MicroBatch mb = plan[i];
        if (mb.samples != n) mb.loss_weight = std::min(1.0, mb.loss_weight * static_cast<double>(n) / mb.samples);
        // A replay has updated the weights when it returns: its loss is checked after the update.
        const bool replay = graphed && graphed->replayable(b->images, mb, eb.micro);
        Tensor logits, loss, labels = b->labels;
        bool stepped = false;
        if (replay) {
          const GraphedStep::Output out = graphed->step(b->images, b->labels);
          logits = out.logits, loss = out.loss, labels = out.labels, stepped = out.stepped;
        } else {
          logits = m.forward(b->images);
          loss = m.loss(logits, b->labels);
        }
        const double lv = loss.item();
        loss_sum += lv * static_cast<double>(n);
        correct += m.correct(logits, labels);
        em.images += n;
        session_images += n;
        if (agreed(!std::isfinite(lv) || lv > diverge_loss)) {   // every rank stops at the same micro-batch
          r.status = "diverged";
          r.note = group && std::isfinite(lv) && lv <= diverge_loss
                       ? "another rank's training loss was NaN or above --diverge-loss at step " +
                             std::to_string(opt->step_count())
                       : diverged_note(lv, opt->step_count(), diverge_loss);
          stop = cut = true;
          break;
        }
        if (!replay) stepped = graphed ? graphed->eager_step(loss, mb, b->images) : trainer.micro_batch(loss, mb);
        gpu.step_end();
        ++i;
        if (!t_steady && i % static_cast<size_t>(eb.accumulation) == 0) {
          synchronize(device);   // the window's queued device work belongs to the warm-up
          t_steady = Clock::now();
          images_steady0 = em.images;
        }
        if (!stepped) continue;
        const int64_t step = opt->step_count();
        if (hooks.on_step) hooks.on_step(step);
        eta.stepped(step, seconds_since(t_loop), session_images);
        if (!c.quiet && ((c.progress_every > 0 && step % c.progress_every == 0) ||
                         (c.progress_seconds > 0 && seconds_since(t_line) >= c.progress_seconds))) {
          t_line = Clock::now();
          const double dt = seconds_since(t0);
          const auto ms = memory_stats(device);
          char line[320];
          std::snprintf(line, sizeof(line),
                        "epoch %lld step %lld/%lld  loss %.4f  acc %.2f%%  %.1f img/s  data wait %.1f%%  "
                        "mem %s allocated, %s peak  ETA %s",
                        static_cast<long long>(epoch), static_cast<long long>(step),
                        static_cast<long long>(total_steps),
                        loss_sum / static_cast<double>(em.images),
                        100.0 * static_cast<double>(correct) / static_cast<double>(em.images),
                        // rank 0's shard's loss and accuracy; images/s of all ranks (equal shards)
                        static_cast<double>(em.images * c.world_size) / dt,
                        100.0 * (data.train->wait_seconds() - wait0) / dt,
                        format_bytes(static_cast<size_t>(ms.allocated_bytes)).c_str(),
                        format_bytes(static_cast<size_t>(ms.peak_allocated_bytes)).c_str(),
                        format_duration(eta.seconds_left(step, epoch)).c_str());
          log(line + phase_note);
        }
        if (agreed(stop_requested())) {
          r.status = "interrupted";
          r.note = std::string(stop_signal_name()) + " at step " + std::to_string(step);
          stop = cut = true;
          break;
        }
        if (c.max_steps > 0 && step >= c.max_steps) {
          stop = cut = true;
          break;
        }
      }
    } catch (const OutOfMemoryError& e) {
      if (group) throw;   // the other ranks may wait in a collective: the job ends (run_or_abort)
      r.status = "oom";
      r.note = e.what();
      stop = cut = true;
      opt->zero_grad();
    }
    const bool complete = !cut || i == plan.size();
    // Device kernels are asynchronous: the last step's backward and update may still be queued.
    synchronize(device);
    em.train_seconds = seconds_since(t0) + trial_seconds;   // a phase's trials are its cost
    if (t_steady && em.images > images_steady0) {
      const double steady_s = seconds_since(*t_steady);
      em.steady_images = em.images - images_steady0;
      em.steady_seconds = steady_s;
      em.images_per_second_steady = steady_s > 0 ? static_cast<double>(em.steady_images) / steady_s : 0.0;
    }
    if (group) {
      // The epoch's figures over all ranks: images (padding included), loss and accuracy of the union
      // of the shards; the times are this rank's.
      double images = static_cast<double>(em.images), steady = static_cast<double>(em.steady_images),
             right = static_cast<double>(correct);
      sum_over_ranks(group, {&images, &steady, &loss_sum, &right});
      em.images = static_cast<int64_t>(images);
      em.steady_images = static_cast<int64_t>(steady);
      correct = static_cast<int64_t>(right);
      if (em.steady_seconds > 0) em.images_per_second_steady = steady / em.steady_seconds;
    }
    em.gpu_busy = gpu.stop(em.train_seconds) / 100.0;
    em.gpu_busy_source = gpu.source();
    train_seconds += em.train_seconds;
    prog.epoch = epoch;
    prog.micro_batches = complete ? 0 : static_cast<int64_t>(i);
    em.steps = opt->step_count();
    em.lr = opt->lr(0);
    em.train_loss = em.images > 0 ? loss_sum / static_cast<double>(em.images) : 0.0;
    em.train_acc = em.images > 0 ? static_cast<double>(correct) / static_cast<double>(em.images) : 0.0;
    em.images_per_second = em.train_seconds > 0 ? static_cast<double>(em.images) / em.train_seconds : 0.0;
    em.data_wait_fraction = em.train_seconds > 0 ? (data.train->wait_seconds() - wait0) / em.train_seconds : 0.0;
    em.cpu_utilization = em.train_seconds > 0 ? (cpu_seconds() - cpu0) / em.train_seconds /
                                                    std::max(1u, std::thread::hardware_concurrency())
                                              : 0.0;
    const auto ms = memory_stats(device);
    em.peak_allocated = ms.peak_allocated_bytes;
    em.peak_reserved = ms.peak_reserved_bytes;
    r.peak_allocated = std::max(r.peak_allocated, em.peak_allocated);
    r.peak_reserved = std::max(r.peak_reserved, em.peak_reserved);
    if (r.status == "ok" || r.status == "interrupted") {
      const auto t_eval = Clock::now();
      const EvalResult v = evaluate(m, data.val.get(), group);
      eta.evaluated(seconds_since(t_eval), data.val ? data.val->size() : 0);
      em.val_loss = v.loss;
      em.val_acc = v.acc;
      if (std::isfinite(v.acc) && !(v.acc <= r.best_val_acc)) r.best_val_acc = v.acc, r.best_epoch = epoch;
      if (c.target_accuracy > 0 && r.time_to_target < 0 && v.acc >= c.target_accuracy) r.time_to_target = train_seconds;
      if (complete) {
        prog.best_val_acc = r.best_val_acc;
        prog.best_epoch = r.best_epoch;
        prog.time_to_target = r.time_to_target;
      }
    } else {
      em.val_loss = em.val_acc = std::numeric_limits<double>::quiet_NaN();
    }
    settle_skips();
    if (em.images > 0) {
      r.epochs.push_back(em);
      log(epoch_done_line(em, epoch, c.epochs, complete ? "" : epoch_cut_reason(r, c, opt->step_count())));
      if (hooks.on_epoch) hooks.on_epoch(em);
    }
  }
  if (graphed)
    log("--cuda-graphs: " + std::to_string(graphed->replays()) + " steps replayed from " +
        std::to_string(graphed->captures()) + " capture(s); the others ran eagerly (warm-up, a new batch shape, "
        "partial batches)");
  r.steps = opt->step_count();
  r.train_seconds = train_seconds;
  const EvalResult t = (r.status == "ok" || r.status == "interrupted") ? evaluate(m, data.test.get(), group) : EvalResult{};
  settle_skips();
  r.test_acc = t.acc;
  r.test_loss = t.loss;
  if (!c.save_weights.empty() && r.status != "oom") {
    prog.train_seconds = train_seconds;
    prog.rng_seed = default_generator().seed();
    prog.rng_offset = default_generator().offset();
    prog.world_size = c.world_size;
    save_state(c.save_weights, m, *opt, scaler, prog, group);
    log("saved weights to " + c.save_weights + " (optimizer state: " + optimizer_state_path(c.save_weights) + ")");
  }
  r.total_seconds = seconds_since(t_start);
  return r;
}

}  // namespace minidl::harness
