// Trials for the maximum-batch finder (see step_runner.h).
#include "experiments/harness/step_runner.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <numeric>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops.h"
#include "optim/accumulation.h"

namespace minidl::harness {

Device dry_run_device(const TrainConfig& c) {
  // A plan for a named GPU stands for a GPU that this machine need not have.
  return c.gpu.empty() ? Device::meta(resolve_device(c.device).type) : Device::meta(DeviceType::CUDA);
}

namespace {

// The device with its allocator's cache released, before the model is made: blocks cached by the
// runs and trials before this one (a sweep, a test suite) could otherwise serve the weights from
// larger blocks, which a fresh minidl-train would not (core/allocator.h), and the answer would
// depend on what ran before it.
Device released(Device d) {
  empty_cache(d);
  return d;
}

}  // namespace

StepRunner::StepRunner(const TrainConfig& c, int64_t budget_bytes, std::optional<Device> device)
    : c_(c), device_(released(device ? *device : resolve_device(c.device))), model_(make_model(c, c.seed * 4 + 3)),
      scaler_(optim::GradScalerOptions{.init_scale = c.amp_init_scale, .enabled = c.uses_grad_scaler()}), budget_(budget_bytes) {
  apply_backend_switches(c_, device_);
  draw_library_workspaces(device_);   // before the model, as train::Run draws them
  model_.module->to(device_);
  model_.module->train();
  // A tiny learning rate: the trials measure memory and time, and must not drive the weights to NaN.
  opt_ = make_optimizer(c_, *model_.module, 1e-6);
  // What the batch needs: on a GPU the caching allocator's reserved bytes (its fragmentation is
  // real: a block freed in the wrong place does not serve the next request); on the CPU the live
  // blocks alone, since the host allocator's cache of freed large blocks (core/allocator.h) is
  // released before a request can fail, so it grows with the steps run, not with the batch (fitted
  // on reserved, the first prediction of resnet18-small under 160 MiB was 36% low). A dry run on
  // meta:cpu follows the CPU's rule, so its trials fit as the real ones do.
  optim::AccumulationOptions ao;
  ao.after_backward = [this] {
    const auto ph = memory_stats(device_);
    backward_peak_ = device_.target() == DeviceType::CPU ? ph.peak_allocated_bytes : ph.peak_reserved_bytes;
  };
  // CUDA graphs: each trial's steps are captured and replayed as the run's are (an eager step at
  // the batch, then the capture), so the graph's private pool counts in its peak and the budget.
  // By default a capture that does not fit falls back to eager steps, in the trial as in the run.
  step_ = std::make_unique<Step>(model_, *opt_, scaler_, ao, c_.resolved_cuda_graphs(), device_);
  if (train::GraphedStep* g = step_->graphed(); g != nullptr && c_.cuda_graphs_fall_back())
    g->fall_back_when_a_capture_fails(nullptr);
  step_->set_accumulation(accumulated());
  // allocated: the weights (and anything else already on the device); then gradients and state.
  const int64_t fixed = memory_stats(device_).allocated_bytes +
                        static_cast<int64_t>(static_cast<double>(parameter_bytes()) * (1.0 + optimizer_state_factor(c_)));
  if (budget_ > 0 && fixed > budget_)
    throw UsageError("--memory-budget " + format_bytes(static_cast<size_t>(budget_)) +
                     " is smaller than the model itself: " + c.model + " needs " +
                     format_bytes(static_cast<size_t>(fixed)) + " for weights, gradients and optimizer state");
  if (budget_ > 0) set_memory_budget(device_, static_cast<size_t>(budget_));
  footprint_ = run_footprint(c_, device_, model_.image_size);
  if (footprint_.resident_bytes > 0) {
    try {
      resident_ = empty({footprint_.resident_bytes}, {DType::u8, device_, false});
    } catch (const OutOfMemoryError&) {
      if (budget_ > 0) set_memory_budget(device_, 0);   // no destructor runs for a constructor that throws
      throw UsageError("--memory-budget " + format_bytes(static_cast<size_t>(budget_)) + " cannot hold the run's " +
                       "in-memory data set (" + format_bytes(static_cast<size_t>(footprint_.resident_bytes)) +
                       ") beside " + c.model + "'s weights: give a larger budget, or a smaller --split");
    }
  }
  // The trials must measure the steady state, where the optimizer state exists. With AMP the
  // first steps are usually skipped (the scaler starts at 65536 and halves on every overflow) and
  // a skipped step creates no state, so step at batch 1 until one update has really run (the
  // scale reaches 1 after 16 halvings; a model that still overflows then trains on NaN anyway).
  const auto warm_up = [this] {
    Feed feed(*this, Epoch{accumulated(), 1, 0}, accumulated());
    step(feed, full_window(1), 1);
  };
  warm_up();
  for (int i = 0; i < 40 && !last_stepped_; ++i) warm_up();
  baseline_ = memory_stats(device_).allocated_bytes - footprint_.resident_bytes;
  // Each trial starts as a run does: with accumulation and graphs, its first window makes the kept
  // gradients at its batch (GraphedStep::release drops them after each trial too).
  step_->release_graph();
}

StepRunner::~StepRunner() {
  if (budget_ > 0) set_memory_budget(device_, 0);
}

int64_t StepRunner::parameter_bytes() const { return model_.module->parameter_bytes(); }

void StepRunner::limit_recomputation(int64_t batch) {
  const bool optimal = model_.recomputer && model_.checkpoint.kind == CheckpointSpec::Kind::Optimal;
  if (!optimal || budget_ <= 0 || batch == limited_batch_) return;
  model_.recomputer->set_memory_limit(
      optimal_recompute_limit(c_, budget_, parameter_bytes(), footprint_, batch));
  limited_batch_ = batch;
}

StepRunner::Feed::Feed(const StepRunner& r, Epoch epoch, int64_t leading, bool and_last)
    : r_(r), epoch_(epoch), ahead_(std::max(0, r.footprint_.batches_held - 1)) {
  MINIDL_CHECK(leading >= 1 && leading <= epoch.full, "StepRunner: a trial takes ", leading, " of an epoch's ",
               epoch.full, " full batches");
  // The leading batches stand for the epoch's first ones, except the last of them, which stands
  // for the epoch's last full batch when there are two or more (its step holds only what is left
  // of the epoch ahead, the smaller last batch on a GPU). With the epoch's size unknown, every
  // batch ahead is a full one.
  const bool known = epoch.full != INT64_MAX;
  for (int64_t p = 0; p < leading; ++p) take_.push_back(known && leading > 1 && p + 1 == leading ? epoch.full - 1 : p);
  if (and_last && epoch.last > 0) take_.push_back(epoch.full);
}

int64_t StepRunner::Feed::size_at(int64_t position) const {
  return position < epoch_.full ? epoch_.size : epoch_.last;
}

void StepRunner::Feed::make(int64_t n) {
  // Random images (a trial's weights must not meet a degenerate input) and class-0 labels: one
  // tensor each, as the loader's staging makes them.
  ready_.push_back({n, randn(r_.model_.input_shape(n), {DType::f32, r_.device_, false}),
                    zeros({n}, {DType::i64, r_.device_, false})});
}

std::pair<Tensor, Tensor> StepRunner::Feed::next() {
  MINIDL_CHECK(handed_ < take_.size(), "StepRunner: a trial's pass of ", take_.size(), " batches is over");
  const int64_t p = take_[handed_++];
  // What the run's loader holds when it hands out the batch at p: that batch, then the epoch's
  // next ones up to its queue. Batches made ahead that the run would hold too (by size) are kept;
  // the others were the run's steps between the trial's, which the trial skips, and go.
  std::vector<int64_t> want{size_at(p)};
  const int64_t positions = epoch_.full == INT64_MAX ? INT64_MAX : epoch_.full + (epoch_.last > 0 ? 1 : 0);
  for (int64_t q = p + 1; q < positions && static_cast<int64_t>(want.size()) <= ahead_; ++q) want.push_back(size_at(q));
  size_t keep = 0;
  while (keep < ready_.size() && keep < want.size() && ready_[keep].images_in == want[keep]) ++keep;
  ready_.resize(keep);
  // As data::DeviceStaging::next: the batch handed out (made now when it was not made ahead), then
  // the next ones' tensors; a loader with a deeper queue (the CPU's) holds more ahead.
  if (ready_.empty()) make(want[0]);
  Made out = std::move(ready_.front());
  ready_.pop_front();
  for (size_t i = ready_.size() + 1; i < want.size(); ++i) make(want[i]);
  return {std::move(out.images), std::move(out.labels)};
}

StepRunner::Epoch StepRunner::training_epoch(int64_t batch, int64_t leading) const {
  return {std::max(footprint_.training_full(batch), leading), batch, footprint_.training_partial(batch)};
}

std::vector<int64_t> StepRunner::full_window(int64_t batch) const {
  return std::vector<int64_t>(static_cast<size_t>(accumulated()), batch);
}

StepRunner::Windows StepRunner::training_windows(int64_t batch, int steps) const {
  const int64_t k = std::max<int64_t>(1, c_.accumulation_steps);
  const int64_t full = footprint_.training_full(batch);
  const int64_t partial = footprint_.training_partial(batch);
  Windows w;
  // The run's windows (optim::plan_accumulation): the epoch's full windows of k micro-batches,
  // then a trailing one of what is left, full micro-batches and the smaller last batch, stepped
  // with weights of their own and never replayed. One full micro-batch stands for the trailing
  // window's (its second would weigh 1/2, the trial's full windows' weight, and replay there).
  const int64_t left = full == INT64_MAX ? 0 : full % k;
  w.trailing_full = left > 0;
  if (left > 0) w.trailing.push_back(batch);
  if (partial > 0) w.trailing.push_back(partial);
  // An epoch of fewer than k full micro-batches has no full window at all (the combined techniques
  // row: 1,200 images at 661 with k = 4), so neither has its trial: full windows that no epoch
  // makes, captured as CUDA graphs, answered a smaller batch than the run's. An epoch with no
  // micro-batch (a batch above the set's size) keeps full ones: they stand for its single batch.
  if (full > 0 && full < k) return w;
  // A pass makes at least two full windows where the run's epoch has two: the run's second step
  // starts from what its first left in the allocator, and a loader's staging holds the next full
  // batch during the first (one step answered a batch whose run ran out in its second step).
  w.again = std::clamp<int64_t>(full / k, 1, 2);
  w.first = std::max<int64_t>(steps, w.again);
  return w;
}

int64_t StepRunner::step(Feed& feed, const std::vector<int64_t>& window, int64_t micro) {
  // The run's limit for its micro-batch holds for the epoch's smaller last batch too (train::Run
  // sets it once an epoch).
  limit_recomputation(micro);
  // The overall peak is kept in `outer` while the phases are measured one at a time.
  const auto outer = memory_stats(device_);
  reset_peak_stats(device_);
  const std::vector<optim::MicroBatch> plan = optim::plan_accumulation(window, static_cast<int64_t>(window.size()));
  for (const optim::MicroBatch& mb : plan) {
    // Inputs come as the run's loader hands them out; their bytes count in the peak.
    const auto [x, labels] = feed.next();
    MINIDL_CHECK(x.size(0) == mb.samples, "StepRunner: the feed handed ", x.size(0), " images for a micro-batch of ",
                 mb.samples);
    Step::Forward f = step_->forward(x, labels, mb, micro);   // a smaller batch never replays a window
    last_stepped_ = step_->update(f);   // the last backward's peak: backward_peak_
  }
  const int64_t phase = backward_peak_;
  peak_allocated_ = std::max({peak_allocated_, outer.peak_allocated_bytes, memory_stats(device_).peak_allocated_bytes});
  peak_reserved_ = std::max({peak_reserved_, outer.peak_reserved_bytes, phase});
  const auto after = memory_stats(device_);
  peak_allocated_ = std::max(peak_allocated_, after.peak_allocated_bytes);
  peak_reserved_ = std::max(peak_reserved_, after.peak_reserved_bytes);
  return phase;
}

bool StepRunner::evaluate(int64_t batch, int64_t full_batches) {
  // Back to training mode however the pass ends (an OOM is the trial's answer, not the runner's end).
  struct TrainAgain {
    nn::Module& m;
    ~TrainAgain() { m.train(); }
  } again{*model_.module};
  const NoGradGuard no_grad;
  model_.module->eval();
  const int64_t e = footprint_.evaluation_batch(batch);
  const int64_t images = footprint_.evaluation_images;
  const Epoch epoch{images < 0 ? INT64_MAX : images / e, e, footprint_.evaluation_partial(e)};
  const int64_t leading = std::min(full_batches, epoch.full);
  Feed feed(*this, epoch, leading, /*and_last=*/true);
  // train::evaluate's loop: a batch replays the forward captured into the training graphs' pool
  // once an eager batch of its layout has run (GraphedStep::eval_step); any other runs eagerly,
  // beside the graphs in their pool (GraphedStep::eval_eagerly), its loss and count read on the host.
  for (int64_t i = 0; i < leading + (epoch.last > 0 ? 1 : 0); ++i) {
    const auto [x, labels] = feed.next();
    train::GraphedStep* g = step_->graphed();
    if (g != nullptr && g->eval_replayable(x, labels) && g->eval_step(x, labels)) continue;
    const auto work = [&] {
      const Tensor logits = model_.forward(x);
      (void)model_.loss(logits, labels).item();
      (void)model_.correct(logits, labels);
    };
    if (g != nullptr) g->eval_eagerly(x, work);
    else work();
  }
  return epoch.last > 0;
}

Trial StepRunner::run(int64_t batch, int steps) {
  Trial t;
  empty_cache(device_);
  reset_peak_stats(device_);
  const int64_t before = memory_stats(device_).allocated_bytes;
  peak_allocated_ = peak_reserved_ = 0;
  double timed = 0.0;
  const int64_t replays_before = step_->graphed() != nullptr ? step_->graphed()->replays() : 0;
  const int64_t eval_ooms_before = step_->graphed() != nullptr ? step_->graphed()->eval_ooms() : 0;
  const int64_t reclaims_before = step_->graphed() != nullptr ? step_->graphed()->reclaims() : 0;
  // A trial stands for a run at `batch`, whose first step plans its recomputation afresh (no
  // smaller batch borrows the plan of a larger one another trial made).
  if (model_.recomputer) model_.recomputer->forget_plans();
  // The run's epochs as far as they differ (RunFootprint): the first with `steps` full windows, its
  // trailing window and the evaluation pass with its own smaller last batch; then, where there are
  // smaller batches or graphs, the next epoch's first windows and end, where the run captures what
  // it ran eagerly once.
  const Windows w = training_windows(batch, steps);
  const int64_t k = accumulated();
  int64_t timed_images = 0;
  const auto time_since = [&](std::chrono::steady_clock::time_point t0, int64_t images) {
    synchronize(device_);   // a GPU step returns before its kernels finish: time them too
    timed += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    timed_images += images;
  };
  // The full windows are timed in the first pass after its first (which warms them); an epoch
  // without one steps in its trailing window alone, timed in the second pass.
  const auto pass = [&](int64_t windows, bool first_pass) {
    const int64_t leading = windows * k + (w.trailing_full ? 1 : 0);
    Feed feed(*this, training_epoch(batch, leading), leading, /*and_last=*/true);
    for (int64_t s = 0; s < windows; ++s) {
      const auto t0 = std::chrono::steady_clock::now();
      t.activation_phase_reserved = std::max(t.activation_phase_reserved, step(feed, full_window(batch), batch));
      if (first_pass && (s > 0 || windows == 1)) time_since(t0, k * batch);
      else synchronize(device_);
    }
    if (w.trailing.empty()) return;
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t phase = step(feed, w.trailing, batch);
    if (windows > 0) return;
    t.activation_phase_reserved = std::max(t.activation_phase_reserved, phase);
    if (!first_pass) time_since(t0, std::accumulate(w.trailing.begin(), w.trailing.end(), int64_t{0}));
  };
  try {
    pass(w.first, /*first_pass=*/true);
    const bool eval_partial = footprint_.evaluation() && evaluate(batch, 2);
    if (!w.trailing.empty() || eval_partial || step_->graphed() != nullptr) {
      pass(w.again, /*first_pass=*/false);
      if (footprint_.evaluation()) evaluate(batch, 1);
    }
    t.ok = true;
    // The time of `batch` images' forward, backward and update, whatever the windows held.
    t.step_seconds = timed_images > 0 ? timed * static_cast<double>(batch) / static_cast<double>(timed_images) : 0.0;
  } catch (const OutOfMemoryError&) {
    // The step's tensors were locals of step(): unwinding freed them. Gradients live on the
    // parameters, so drop them too, then check nothing else stayed behind. The window the OOM broke
    // closes without a step: left open, it kept the gradients that CUDA graphs keep between windows
    // past the trial (GraphedStep::release drops them only between windows), and the next trials
    // answered low beside them.
    opt_->zero_grad();
    step_->trainer().restore(step_->trainer().counts(), /*window_open=*/false);
    t.ok = false;
  }
  // The trial's graph (CUDA graphs), its pool and captured tensors go with the trial, whether it
  // fit or not, so the statistics can return to where they were.
  t.graphed = step_->graphed() != nullptr && step_->graphed()->replays() > replays_before &&
              step_->graphed()->eval_ooms() == eval_ooms_before && !step_->graphed()->eager_only();
  t.graphs_dropped = step_->graphed() != nullptr && step_->graphed()->reclaims() > reclaims_before;
  t.windowless = w.first == 0;
  step_->release_graph();
  // After an OOM the phase bookkeeping stopped mid-step: the allocator's peak covers the rest.
  const auto ms = memory_stats(device_);
  t.peak_allocated = std::max(peak_allocated_, ms.peak_allocated_bytes);
  t.peak_reserved = std::max(peak_reserved_, ms.peak_reserved_bytes);
  if (!t.ok) t.activation_phase_reserved = 0;
  t.recovered = ms.allocated_bytes == before;
  return t;
}

}  // namespace minidl::harness
