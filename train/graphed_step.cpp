// The captured training step of graphed_step.h: what --cuda-graphs refuses, when a step is
// captured again (a new batch shape, never a new rate), the host's bookkeeping of steps that only
// the device ran, the captured evaluation forward, and the fallback of a capture that does not fit.
#include "train/graphed_step.h"

#include <algorithm>
#include <cstdio>
#include <string>
#include <utility>

#include "core/allocator.h"
#include "core/autocast.h"
#include "core/autograd.h"
#include "core/generator.h"
#include "core/ops.h"
#include "core/scoped_flag.h"

namespace minidl::train {
namespace {

[[noreturn]] void refuse(const std::string& what, const std::string& fix) {
  throw UsageError("--cuda-graphs " + what + " (" + fix + ")");
}

}  // namespace

void check_cuda_graphs(const TrainConfig& c) {
  Device d;
  try {
    d = Device::parse(c.device);
  } catch (const Error&) {
    return;   // resolve_device names the bad --device
  }
  if (!d.is_cuda())
    refuse("needs a CUDA device, got --device " + c.device + ": a graph replays work captured on a CUDA stream",
           "use --device cuda, or run without --cuda-graphs");
}

GraphedStep::GraphedStep(Model& model, optim::AccumulatingTrainer& trainer, optim::Optimizer& opt,
                         optim::GradScaler& scaler, Device device)
    : model_(model), trainer_(trainer), opt_(opt), scaler_(scaler), device_(device) {
  // meta:cuda too: the dry run of a graphed run captures on the model of the GPU (its private pool).
  MINIDL_CHECK(device.target() == DeviceType::CUDA, "GraphedStep: CUDA graphs need a CUDA device, got ",
               device.str());
}

void GraphedStep::drop(Shaped& s) {
  // The outputs live in the graphs' pool: dropped first, so releasing the pool frees its segments.
  for (Captured& g : s.graphs) g.loss = g.logits = Tensor();
  s.eval.loss = s.eval.logits = s.eval_correct = Tensor();
  for (Captured& g : s.graphs) g.graph.reset();
  s.eval.graph.reset();
}

void GraphedStep::drop_graphs() {
  // The pool goes with its graphs: nothing is lent any more (an evaluation batch's lending too,
  // when make_room drops them in the middle of it; nothing when none is open).
  if (const Backend::Graph* g = any_graph()) g->end_lending();
  lending_ = window_lent_ = false;
  for (Shaped& s : shapes_) drop(s);
  shapes_.clear();   // and the captured inputs
}

void GraphedStep::release() {
  drop_graphs();
  if (accumulation_ > 1 && !trainer_.window_open()) {
    // The gradients kept between windows go too: the next eager window makes them at its batch,
    // as a run makes them at its own, and they fall where the run's do.
    for (const optim::ParamGroup& g : opt_.param_groups())
      for (Tensor p : g.params) p.zero_grad();
    grads_kept_ = false;
  }
  warm_.clear();
  eval_warm_.clear();
  no_graph_.clear();
  no_eval_graph_.clear();
  eager_only_ = false;
  window_replayed_ = false;
}

GraphedStep::Shaped* GraphedStep::find(const Layout& images, const Layout& labels) {
  for (Shaped& s : shapes_)
    if (s.images == images && s.labels == labels) return &s;
  return nullptr;
}

const GraphedStep::Shaped* GraphedStep::find(const Layout& images) const {
  for (const Shaped& s : shapes_)
    if (s.images == images) return &s;
  return nullptr;
}

const Backend::Graph* GraphedStep::any_graph() const {
  for (const Shaped& s : shapes_) {
    for (const Captured& g : s.graphs)
      if (g.graph) return g.graph.get();
    if (s.eval.graph) return s.eval.graph.get();
  }
  return nullptr;
}

void GraphedStep::check_labels(const Tensor& labels) {
  // The fused losses read their target-range verdict on the host, except while capturing: a label
  // outside [0, 2) would otherwise index past the logits in every replay, unchecked.
  const Tensor host_labels = labels.to(Device::cpu()).contiguous();
  MINIDL_CHECK(host_labels.dtype() == DType::i64, "--cuda-graphs: labels must be i64, got ", host_labels.meta());
  const int64_t* l = host_labels.data<int64_t>();
  for (int64_t i = 0; i < host_labels.numel(); ++i)
    MINIDL_CHECK(l[i] == 0 || l[i] == 1, "--cuda-graphs: label ", l[i], " of sample ", i,
                 " is outside [0, 2) (the models here have two classes); the batch was not copied in");
}

GraphedStep::Shaped& GraphedStep::shape_for(const Tensor& images, const Tensor& labels) {
  check_labels(labels);
  ++uses_;
  if (Shaped* s = find(layout(images), layout(labels))) {
    NoGradGuard no_grad;
    s->x.copy_(images);
    s->y.copy_(labels);
    s->used = uses_;
    return *s;
  }
  if (shapes_.size() >= kMaxShapes) {   // the least recently used layout goes, graphs and inputs
    auto lru = std::min_element(shapes_.begin(), shapes_.end(),
                                [](const Shaped& a, const Shaped& b) { return a.used < b.used; });
    drop(*lru);
    shapes_.erase(lru);
  }
  // A new layout is captured next, which releases the eager cache (CachingAllocator::
  // begin_private_pool): released first, so that its inputs take segments of their own, which go
  // back whole when it falls back, as in the eager run it then is.
  empty_cache(device_);
  Shaped& s = shapes_.emplace_back();
  s.images = layout(images);
  s.labels = layout(labels);
  s.x = images.clone();   // clone keeps the memory format (channels-last batches stay so)
  s.y = labels.clone();
  s.used = uses_;
  return s;
}

GraphedStep::~GraphedStep() {
  if (oom_handler_ != 0) remove_out_of_memory_handler(device_, oom_handler_);
  drop_graphs();
}

void GraphedStep::give_up_captures() {
  drop_graphs();
  eager_only_ = true;
}

void GraphedStep::set_accumulation(int64_t k) {
  MINIDL_CHECK(k >= 1, "GraphedStep: accumulation over ", k, " micro-batches; it needs at least 1");
  if (k == accumulation_) return;
  MINIDL_CHECK(!trainer_.window_open(), "GraphedStep: the accumulation changed inside an open window (from ",
               accumulation_, " to ", k, " micro-batches); change it between windows");
  drop_graphs();
  accumulation_ = k;
  window_replayed_ = false;
  // One micro-batch a window: the capture's backward makes the gradients in the graph's pool, as
  // the eager step does, so none may exist when it starts. More: the gradients are kept, and an
  // eager window makes them before the first capture.
  opt_.set_grads_to_none(k == 1);
  if (k == 1) opt_.zero_grad();
  grads_kept_ = k == 1;
}

bool GraphedStep::replayable(const Tensor& images, const optim::MicroBatch& mb, int64_t micro) const {
  if (!ready_ || !grads_kept_) return false;
  if (eager_only_ || std::find(no_graph_.begin(), no_graph_.end(), layout(images)) != no_graph_.end()) return false;
  if (accumulation_ > 1 && images.size(0) != micro) return false;   // a replayed window's micro-batches are full
  if (mb.loss_weight != 1.0 / static_cast<double>(accumulation_) || (accumulation_ == 1 && !mb.steps)) return false;
  if (trainer_.window_open() && !window_replayed_) return false;   // a window begun eagerly ends eagerly
  const Layout l = layout(images);
  const Shaped* s = find(l);
  if (s != nullptr && s->graphs[mb.steps ? 1 : 0].graph) return true;   // a replay of the layout's graph
  // A capture runs the step's host code: only at a layout whose host code ran recently, so that
  // cuDNN's algorithm choice and --checkpoint optimal's profile and plan of the shape exist.
  return std::find(warm_.begin(), warm_.end(), l) != warm_.end();
}

bool GraphedStep::skipped_on_device() const {
  if (device_.is_meta()) return false;   // a dry run has no values: its steps count as taken
  return scaler_.is_enabled() && scaler_.device_state() && scaler_.device_found_inf().item() != 0.0;
}

void GraphedStep::warmed(const Layout& l) {
  std::erase(warm_, l);
  if (warm_.size() >= kMaxShapes) warm_.erase(warm_.begin());
  warm_.push_back(l);
}

bool GraphedStep::eager_step(const Tensor& loss, const optim::MicroBatch& mb, const Tensor& images) {
  warmed(layout(images));
  window_replayed_ = false;
  // A window closed with the gradients kept (zeroed in place): they exist for the captures.
  const bool keeps = mb.steps && !opt_.grads_to_none();
  if (!ready_) {   // the scaler's host state: the trainer's verdict is the real one
    const bool stepped = trainer_.micro_batch(loss, mb);
    grads_kept_ = grads_kept_ || keeps;
    if (stepped) {
      ready_ = true;
      if (scaler_.is_enabled()) scaler_.to_device_state(device_);
      opt_.to_device_state(device_);   // rates and step counts: a replay reads them on the device
    }
    return stepped;
  }
  const optim::AccumulatingTrainer::Counts before = trainer_.counts();
  const bool closed = trainer_.micro_batch(loss, mb);
  grads_kept_ = grads_kept_ || keeps;
  if (!closed) return false;
  const bool skipped = skipped_on_device();
  trainer_.settle_device_step(before, skipped);
  return !skipped;
}

void GraphedStep::capture(Shaped& s, Captured& g, const optim::MicroBatch& mb) {
  g.loss = g.logits = Tensor();   // the old graph's outputs, then the graph (its pool, unless shared)
  g.graph.reset();
  const optim::MicroBatch captured{.loss_weight = mb.loss_weight, .steps = mb.steps, .samples = s.x.size(0)};
  g.graph = backend(device_).capture_graph(
      device_.index,
      [&] {
        g.logits = model_.forward(s.x);
        g.loss = model_.loss(g.logits, s.y);
        trainer_.micro_batch(g.loss, captured);
      },
      any_graph());
  g.loss = g.loss.detach();
  g.logits = g.logits.detach();
  warmed(s.images);
  ++captures_;
}

void GraphedStep::fall_back_when_a_capture_fails(std::function<void(const std::string&)> log) {
  fallback_log_ = std::move(log);
  falls_back_ = true;
  if (oom_handler_ == 0) {
    owner_ = std::this_thread::get_id();
    oom_handler_ = add_out_of_memory_handler(device_, [this](size_t bytes) { return make_room(bytes); });
  }
}

std::string GraphedStep::give_up_held_layouts() {
  std::string layouts;
  for (const Shaped& s : shapes_) {
    no_graph_.push_back(s.images);
    layouts += (layouts.empty() ? "" : ", ") + shape_text(s.images);
  }
  give_up_captures();
  return layouts;
}

bool GraphedStep::make_room(size_t bytes) {
  if (busy_ || any_graph() == nullptr || std::this_thread::get_id() != owner_) return false;
  ++reclaims_;
  const std::string layouts = give_up_held_layouts();   // a lending in progress ends first (drop_graphs)
  if (fallback_log_)
    fallback_log_("CUDA graphs: every batch runs eagerly from here: " + format_bytes(bytes) +
                  " of eager work did not fit beside the graphs of " + layouts +
                  ", which were dropped to make room; --no-cuda-graphs runs every step eagerly, --cuda-graphs makes "
                  "this an error");
  return true;
}

GraphedStep::HostState GraphedStep::host_state() const {
  HostState h{.counts = trainer_.counts(), .window_open = trainer_.window_open(), .lrs = {},
              .rng_offset = default_generator().offset()};
  for (size_t g = 0; g < opt_.param_groups().size(); ++g) h.lrs.push_back(opt_.lr(g));
  return h;
}

std::string GraphedStep::shape_text(const Layout& l) {
  return std::string(dtype_name(l.dtype)) + shape_str(l.shape);
}

void GraphedStep::fall_back(const Layout& images, const HostState* before, const std::string& what, bool oom) {
  if (before != nullptr) {
    // The capture ran host code only: its counts, rates and random draws go back, and what its
    // device work would have filled (the scaler's stage, autocast's copies, new gradients) holds nothing.
    trainer_.restore(before->counts, before->window_open);
    for (size_t g = 0; g < before->lrs.size(); ++g) opt_.set_lr(g, before->lrs[g]);
    default_generator().set_offset(before->rng_offset);
    scaler_.abandon_step();
    autocast_clear_cache();
    if (opt_.grads_to_none()) opt_.zero_grad();
  }
  no_graph_.push_back(images);
  auto it = std::find_if(shapes_.begin(), shapes_.end(), [&](const Shaped& s) { return s.images == images; });
  if (it != shapes_.end()) {   // its other graph (a window's) goes too: the layout runs eagerly
    drop(*it);
    shapes_.erase(it);
  }
  // Out of memory with no training graph held: the run's steps are at the memory limit, and a
  // graph of another layout (the epoch's partial batch) would hold its pool beside every eager
  // step of this one, whose blocks must then fall around it. Every layout runs eagerly from here.
  const bool all = oom && std::none_of(shapes_.begin(), shapes_.end(), [](const Shaped& s) {
    return s.has_training_graph();
  });
  if (all) give_up_captures();
  // The eager steps from here start from an empty cache, as the run's first step did, not from the
  // segments the abandoned capture carved around the live tensors (an eager run's answer holds).
  empty_cache(device_);
  if (fallback_log_)
    fallback_log_("CUDA graphs: " +
                  (all ? "every batch runs eagerly from here: capturing the step of " + shape_text(images)
                       : "batches of " + shape_text(images) + " run eagerly from here: capturing their step") +
                  (oom ? " ran out of memory (" : " failed (") + what +
                  "); --no-cuda-graphs runs every step eagerly, --cuda-graphs makes this an error");
}

std::optional<GraphedStep::Output> GraphedStep::step(const Tensor& images, const Tensor& labels,
                                                     const optim::MicroBatch& mb) {
  end_eager_lending();   // a window begun eagerly ends eagerly: none is open here
  const ScopedFlag busy(busy_, true);   // a new layout's inputs fall back below, and `sp` stays
  const optim::AccumulatingTrainer::Counts before = trainer_.counts();
  opt_.upload_lrs();   // this step's rates, read by the replay (the capture's host code writes none)
  Shaped* sp = nullptr;
  std::optional<HostState> host;   // taken before a capture only: a replay moves no host state
  try {
    sp = &shape_for(images, labels);   // a new layout's inputs are allocated here
    Captured& c = sp->graphs[mb.steps ? 1 : 0];
    if (!c.graph) {
      host = host_state();
      capture(*sp, c, mb);   // runs the micro-batch's host code (and counts it) without its device work
    }
  } catch (const OutOfMemoryError& e) {
    if (!falls_back_) throw;
    fall_back(layout(images), host ? &*host : nullptr, e.what(), true);
    return std::nullopt;
  } catch (const Error& e) {
    // Any other failure of the capture itself (a library call refused inside it, a convolution
    // with no plan from the warm-up): the same fallback. An error before it (the labels' check)
    // is the run's, as in an eager step.
    if (!falls_back_ || !host) throw;
    fall_back(layout(images), &*host, e.what(), false);
    return std::nullopt;
  }
  Shaped& s = *sp;
  Captured& g = s.graphs[mb.steps ? 1 : 0];
  g.graph->replay();
  ++replays_;
  if (!mb.steps) {   // its gradients are added; the window stays open
    trainer_.settle_device_micro_batch();
    window_replayed_ = true;
    return Output{g.loss, g.logits, s.y, false};
  }
  const bool skipped = skipped_on_device();
  trainer_.settle_device_step(before, skipped);
  window_replayed_ = false;
  return Output{g.loss, g.logits, s.y, !skipped};
}

bool GraphedStep::eval_replayable(const Tensor& images, const Tensor& labels) const {
  if (!ready_) return false;
  const Layout l = layout(images);
  const Shaped* s = find(l);
  return s != nullptr && s->labels == layout(labels) && s->has_training_graph() &&
         std::find(eval_warm_.begin(), eval_warm_.end(), l) != eval_warm_.end() &&
         std::find(no_eval_graph_.begin(), no_eval_graph_.end(), l) == no_eval_graph_.end();
}

void GraphedStep::eval_warmed(const Tensor& images) {
  const Layout l = layout(images);
  if (std::find(eval_warm_.begin(), eval_warm_.end(), l) == eval_warm_.end()) eval_warm_.push_back(l);
}

void GraphedStep::eval_eagerly(const Tensor& images, const std::function<void()>& work) {
  end_eager_lending();
  if (any_graph() == nullptr) {
    work();
    eval_warmed(images);
    return;
  }
  // The graphs may go during the work (make_room), so any_graph() is asked again after it.
  const auto end_lending = [this] {
    const Backend::Graph* g = any_graph();
    return g == nullptr || g->end_lending();
  };
  bool may_replay = true;
  any_graph()->begin_lending(false);
  try {
    work();
    may_replay = end_lending();
  } catch (const OutOfMemoryError& e) {
    end_lending();
    if (!falls_back_ || any_graph() == nullptr) throw;   // the graphs already went: eager work ran out
    ++eval_ooms_;
    const std::string layouts = give_up_held_layouts();
    if (fallback_log_)
      fallback_log_("CUDA graphs: every batch runs eagerly from here: an evaluation batch ran out of memory "
                    "beside the graphs of " + layouts + " (" + e.what() + "); --no-cuda-graphs runs every step "
                    "eagerly, --cuda-graphs makes this an error");
    work();
  } catch (...) {
    end_lending();
    throw;
  }
  if (!may_replay) {   // a tensor of the work is still live in the pool, or the pool gave segments back
    drop_graphs();
    ++evictions_;
  }
  eval_warmed(images);
}

std::shared_ptr<GraphedStep::Lending> GraphedStep::lend_for_eager() {
  const Backend::Graph* g = any_graph();
  if (g == nullptr) return nullptr;
  if (!lending_) {
    g->begin_lending(window_lent_);   // a window run eagerly goes on where its last micro-batch paused
    lending_ = true;
    window_lent_ = false;
  }
  return std::make_shared<Lending>(*this);
}

void GraphedStep::pause_eager_lending() {
  if (!lending_) return;
  lending_ = false;
  if (const Backend::Graph* g = any_graph()) {
    g->end_lending();   // its answer waits for the window's end: the window's tensors are still live
    window_lent_ = true;
  }
}

void GraphedStep::end_eager_lending() {
  if (!lending_ && !window_lent_) return;
  const Backend::Graph* g = any_graph();
  if (g != nullptr && !lending_) g->begin_lending(true);   // a paused window: its answer is the lending's
  lending_ = window_lent_ = false;
  if (g != nullptr && !g->end_lending()) {   // as eval_eagerly: no replay may write over what is left
    drop_graphs();
    ++evictions_;
  }
}

GraphedStep::Lending::~Lending() {
  try {
    if (keep_open) {
      g_.pause_eager_lending();
    } else {
      g_.end_eager_lending();
    }
  } catch (const std::exception& e) {   // a destructor cannot throw: the graphs go, the reason is said
    std::fprintf(stderr, "minidl: CUDA graphs: ending an eager micro-batch's use of their pool failed (%s); "
                         "the graphs are dropped\n", e.what());
    g_.drop_graphs();
  }
}

void GraphedStep::capture_eval(Shaped& s) {
  s.eval.graph = backend(device_).capture_graph(
      device_.index,
      [&] {
        s.eval.logits = model_.forward(s.x);
        s.eval.loss = model_.loss(s.eval.logits, s.y);
        s.eval_correct = model_.correct_count(s.eval.logits, s.y);
      },
      any_graph());
  ++eval_captures_;
}

std::optional<GraphedStep::EvalOutput> GraphedStep::eval_step(const Tensor& images, const Tensor& labels) {
  MINIDL_CHECK(eval_replayable(images, labels), "GraphedStep: an evaluation batch ", images.meta(),
               " cannot replay (ask eval_replayable first)");
  end_eager_lending();
  const ScopedFlag busy(busy_, true);   // `s` stays
  NoGradGuard no_grad;
  Shaped& s = shape_for(images, labels);   // the layout's entry: its inputs take the batch
  if (!s.eval.graph) {
    try {
      capture_eval(s);
    } catch (const Error& e) {   // evaluation changes nothing but its outputs: eager from here
      if (!falls_back_) throw;
      s.eval.loss = s.eval.logits = s.eval_correct = Tensor();
      no_eval_graph_.push_back(s.images);
      const bool oom = dynamic_cast<const OutOfMemoryError*>(&e) != nullptr;
      if (fallback_log_)
        fallback_log_("CUDA graphs: evaluation batches of " + shape_text(s.images) + " run eagerly from here: "
                      "capturing their forward " +
                      (oom ? "ran out of memory beside the training graphs (" : "failed (") + e.what() + ")");
      return std::nullopt;
    }
  }
  s.eval.graph->replay();
  ++eval_replays_;
  return EvalOutput{s.eval.loss, s.eval_correct};
}

}  // namespace minidl::train
