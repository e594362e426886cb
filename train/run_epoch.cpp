// The epochs of a training run (run_parts.h): the batch of each phase of the batch schedule,
// the micro-batches with their progress lines and stops, the epoch's metrics and evaluation, and
// the end of the run (the test set, --save-weights).
#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <thread>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/generator.h"
#include "train/evaluate.h"
#include "train/run_parts.h"

namespace minidl::train::detail {
namespace {

double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

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

}  // namespace

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
  step_->set_accumulation(eb_.accumulation);
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
    log_new_plans();     // the plan of the batch that ran out, if its forward planned one
    if (group_) throw;   // the other ranks may wait in a collective: the job ends (run_or_abort)
    r_.status = "oom";
    r_.note = x.what();
    stop_ = e.cut = true;
    opt_->zero_grad();
  }
}

// --checkpoint optimal: the plan of each batch shape, printed once, when its first forward made it.
void Run::log_new_plans() {
  if (!m_.recomputer || m_.recomputer->profiles() <= plans_logged_) return;
  plans_logged_ = m_.recomputer->profiles();
  std::string plan = m_.recomputer->describe();
  if (!plan.empty() && plan.back() == '\n') plan.pop_back();
  log(plan);
}

bool Run::micro_batch(Epoch& e, const TensorBatch& b) {
  if (e.i % static_cast<size_t>(eb_.accumulation) == 0) {
    const double f = schedule_->factor(opt_->step_count()) * e.batch_lr;
    for (size_t g = 0; g < opt_->num_groups(); ++g) opt_->set_lr(g, step_->trainer().base_lrs()[g] * f);
  }
  e.gpu->step_begin();
  if (dp_) dp_->sync_buffers();
  const int64_t n = b.labels.size(0);
  optim::MicroBatch mb = plan_[e.i];
  if (mb.samples != n) mb.loss_weight = std::min(1.0, mb.loss_weight * static_cast<double>(n) / mb.samples);
  // A replay has updated the weights when it returns: its loss is checked after the update.
  const Step::Forward f = step_->forward(b.images, b.labels, mb, eb_.micro);
  log_new_plans();
  const auto t_read = Clock::now();   // the reads wait for the step's device work
  const double lv = f.loss.item();
  e.loss_sum += lv * static_cast<double>(n);
  e.correct += m_.correct(f.logits, f.labels);
  e.device_wait += seconds_since(t_read);
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
  const bool stepped = step_->update(f);
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
  const auto t_sync = Clock::now();
  synchronize(device_);
  e.device_wait += seconds_since(t_sync);
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
  em.device_wait_fraction = em.train_seconds > 0 ? e.device_wait / em.train_seconds : 0.0;
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
  const EvalResult v =
      evaluate_or_stop(data_.val.get(), "the validation pass after epoch " + std::to_string(e.number));
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

EvalResult Run::evaluate_or_stop(BatchSource* src, const std::string& pass) {
  try {
    return evaluate(m_, src, group_, step_->graphed());
  } catch (const OutOfMemoryError& x) {
    if (group_) throw;   // the other ranks may wait in the evaluation's reduction (run_or_abort)
    r_.status = "oom";
    r_.note = "out of memory in " + pass + ": " + x.what();
    stop_ = evaluation_oom_ = true;
    return {};
  }
}

// The test set, once, and --save-weights.
void Run::finish() {
  r_.steps = opt_->step_count();
  r_.train_seconds = train_seconds_;
  const bool evaluates = r_.status == "ok" || r_.status == "interrupted";
  const EvalResult t = evaluates ? evaluate_or_stop(data_.test.get(), "the test pass") : EvalResult{};
  settle_skips();
  for (const BatchSource* s : {data_.train.get(), data_.val.get(), data_.test.get()}) {
    if (s == nullptr) continue;
    r_.data_cached_images += s->cached_images();
    r_.data_cached_bytes += s->cached_bytes();
  }
  if (r_.data_cached_images > 0)
    log("data cache: " + std::to_string(r_.data_cached_images) + " images kept decoded in " +
        format_bytes(static_cast<size_t>(r_.data_cached_bytes)) + " of host memory (--data-cache " + c_.data_cache +
        "): decoded once, not every epoch");
  r_.test_acc = t.acc;
  r_.test_loss = t.loss;
  if (!c_.save_weights.empty() && (r_.status != "oom" || evaluation_oom_)) {
    Progress& prog = rp_.progress;
    prog.train_seconds = train_seconds_;
    prog.rng_seed = default_generator().seed();
    prog.rng_offset = default_generator().offset();
    prog.world_size = c_.world_size;
    save_state(c_.save_weights, m_, *opt_, *scaler_, prog, group_);
    log("saved weights to " + c_.save_weights + " (optimizer state: " + optimizer_state_path(c_.save_weights) + ")");
  }
  report_graphs();   // after the save, whose copies may drop the graphs too
  r_.total_seconds = seconds_since(t_start_);
}

void Run::report_graphs() {
  const GraphedStep* g = step_->graphed();
  if (g == nullptr) return;
  r_.graph_replays = g->replays();
  r_.graph_fallbacks = g->fallbacks();
  log("CUDA graphs: " + std::to_string(g->replays()) + " micro-batches replayed from " +
      std::to_string(g->captures()) + " capture(s); the others ran eagerly (warm-up, the first of a batch "
      "shape, trailing windows); " + std::to_string(g->eval_replays()) + " evaluation batches replayed from " +
      std::to_string(g->eval_captures()) + " capture(s), the others eager (the first of a shape, partial batches" +
      (g->fallbacks() > 0 ? ", shapes whose capture did not fit" : "") + ")" +
      (g->evictions() > 0 ? "; graphs dropped " + std::to_string(g->evictions()) +
                                " time(s) for eager work that left tensors in their pool, and captured again"
                          : "") +
      (g->reclaims() > 0 ? "; graphs dropped to make room for eager work that did not fit beside them, every "
                           "batch eager from then on"
                         : ""));
}

}  // namespace minidl::train::detail
