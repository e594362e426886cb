// CUDA graphs (docs/cuda/graphs.md; the default on a CUDA device, where they fit): minidl-train's
// step of one micro-batch captured into a CUDA graph once and replayed for every full batch, which
// cuts the host's launch cost of a small-batch step to one cudaGraphLaunch. The training loop
// (run.cpp) keeps everything that reads the host (loss, accuracy, divergence, progress) outside
// the replay.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/backend.h"
#include "core/tensor.h"
#include "train/config.h"
#include "train/model.h"
#include "optim/accumulation.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"

namespace minidl::train {

// Throws UsageError, naming --cuda-graphs and the fix, for --cuda-graphs on a non-CUDA device. Every
// optimizer, schedule, --max-grad-norm and accumulation replays (their values live on the device);
// what still cannot (data-parallel ranks) runs eagerly with a line saying why
// (TrainConfig::resolved_cuda_graphs). Called by validate().
void check_cuda_graphs(const TrainConfig& c);

// The captured step and its captured inputs and outputs. The loop asks replayable() per
// micro-batch; a replayable one goes through step() (its update, when it closes its window, is done
// when it returns), any other runs its forward eagerly and its update through eager_step(), which
// is also the warm-up: nothing is captured until an eager step has really stepped the optimizer
// (its momentum buffers exist; AMP's skipped first steps do not count) and until the batch's shape
// has run eagerly once (cuDNN's algorithm choice, workspaces and --checkpoint optimal's profile
// happen outside the capture). That first real step moves the optimizer (learning rates, Adam's
// step counts) and the gradient scaler to their device states, so a replay needs no host value and
// one graph serves every rate.
//
// Graphs are kept per batch layout, all in one memory pool (none replays while another does): the
// full batch's and the epoch's partial batch's, which recurs at the same shape every epoch. A
// partial batch runs eagerly the first time (that warms it), is captured the next time it comes,
// and replays from then on; so does an epoch of one full batch and one partial one. With
// accumulation (k > 1) every micro-batch of a replayed window is a full one.
//
// Accumulation over k micro-batches (set_accumulation) captures two graphs of one micro-batch at
// weight 1/k, one that only adds its gradients and one that closes the window with the update,
// sharing one memory pool (they never replay at the same time). The gradients then keep their
// memory from window to window (Optimizer::set_grads_to_none(false)), so that both graphs add into
// the addresses they captured. A window replays whole or not at all: an uneven or trailing window
// (other weights) and a window begun eagerly run eagerly to their end, so that AMP's f16 weight
// copies, made by the window's first micro-batch, are the graphs' own.
class GraphedStep {
 public:
  GraphedStep(Model& model, optim::AccumulatingTrainer& trainer, optim::Optimizer& opt, optim::GradScaler& scaler,
              Device device);
  ~GraphedStep();
  GraphedStep(const GraphedStep&) = delete;
  GraphedStep& operator=(const GraphedStep&) = delete;

  // The accumulation of the windows to come (1: every micro-batch steps). A new value drops the
  // graphs; k > 1 keeps the gradients' memory (above) and waits for an eager window to make them.
  void set_accumulation(int64_t k);

  // Whether this micro-batch can be a replay: after the warm-up, a micro-batch at weight 1/k (a
  // trailing window of other weights runs eagerly; with k > 1 a full one of `micro` samples) in a
  // window that has replayed so far, and either a layout with a graph for it, or (a capture inside
  // step()) a layout whose host code ran recently (warm_), eager or captured. Otherwise the
  // micro-batch runs eagerly and warms its layout.
  bool replayable(const Tensor& images, const optim::MicroBatch& mb, int64_t micro) const;

  // What a replay wrote: the loss (0-dim f32), the logits and the labels it used, all on the device,
  // valid until the next replay; `stepped`: false when the micro-batch does not close its window,
  // or when the gradient scaler skipped the step on the device.
  struct Output {
    Tensor loss, logits, labels;
    bool stepped = true;
  };
  // Checks the labels on the host (the fused losses skip their own host check during a capture),
  // copies the batch into its layout's captured inputs, writes the current learning rates to the
  // device, captures when the layout has no graph yet, replays, and counts the micro-batch in the trainer and
  // the optimizer as the eager loop would (a step the scaler skipped on the device is not one: its
  // flag is read after the replay). Empty when the capture failed (out of memory, or otherwise) and
  // falling back is allowed (fall_back_when_a_capture_fails): nothing of the micro-batch has run then,
  // and the caller runs it eagerly.
  std::optional<Output> step(const Tensor& images, const Tensor& labels, const optim::MicroBatch& mb);
  std::optional<Output> step(const Tensor& images, const Tensor& labels) {
    return step(images, labels, optim::MicroBatch{.loss_weight = 1.0, .steps = true, .samples = images.size(0)});
  }

  // Graphs when they fit (the default of --device cuda): a capture that runs out of memory (no
  // memory is released while a stream captures: the eager cache goes back to the device before
  // it, and the private pool grows into what the eager steps held) is abandoned, with the host
  // state of the micro-batch restored, and batches of that layout (or that layout's evaluation)
  // run eagerly from then on, which is what an eager run at that batch needs. A capture that
  // fails otherwise (a call refused inside it, a convolution with no plan from the warm-up) falls
  // back the same way. `log` gets one line per layout that falls back. Without this
  // (--cuda-graphs), the capture's error ends the step as any other.
  // It also lets eager work beside held graphs make room: a request outside their pool (the
  // loader's next batch, an evaluation batch's inputs) that does not fit even with the eager cache
  // released drops them (the allocator's out-of-memory handler, core/allocator.h), with one line
  // through `log`, and every batch runs eagerly from then on, as an eager run at the batch does,
  // instead of the request failing beside memory that only the graphs hold.
  void fall_back_when_a_capture_fails(std::function<void(const std::string&)> log);
  // Layouts whose capture fell back (training and evaluation), since the last release().
  int64_t fallbacks() const { return static_cast<int64_t>(no_graph_.size() + no_eval_graph_.size()); }
  // When a capture runs out of memory with no other layout's training graph held, or an
  // evaluation batch does not fit beside the graphs (eval_eagerly), no layout is captured again:
  // every step is eager from then on (an eager run's memory, which its answer is for).
  bool eager_only() const { return eager_only_; }

  // The eager update of a micro-batch the loop ran forward itself (trainer.micro_batch), counted
  // as step() counts; returns whether the optimizer stepped. Its shape is then warm; the first time
  // the optimizer really stepped, the gradient scaler moves to its device state.
  bool eager_step(const Tensor& loss, const optim::MicroBatch& mb, const Tensor& images);

  // Evaluation (evaluate.h). A batch of a layout with a training graph replays a captured forward
  // once an eager evaluation batch of that layout has run (eval_warmed: its host code, and so
  // cuDNN's choices for its shapes, ran in evaluation mode; once is enough): the evaluation graph is captured into the training graphs' pool, since the
  // two never run at the same time. It computes what the eager evaluation does, with the same
  // kernels at the same shapes: the logits, the mean loss and the count of correct predictions.
  // Any other batch runs eagerly. The caller puts the model in evaluation mode; the labels are
  // checked on the host first, as step().
  bool eval_replayable(const Tensor& images, const Tensor& labels) const;
  // An evaluation batch that does not replay. Beside held graphs `work` (its forward, read on the
  // host before it returns) runs in their pool (Backend::Graph::begin_lending): the eager cache was
  // released before their capture, and between replays the pool's blocks are free for it. When
  // it runs out of memory there and falling back is allowed, the graphs go, every layout of them
  // trains eagerly from then on (one line says so), and `work` runs again: it must leave its
  // results only once it has completed. The batch's layout is then warm for its capture.
  void eval_eagerly(const Tensor& images, const std::function<void()>& work);
  // A training micro-batch that runs eagerly beside held graphs (a layout's first batch, the
  // epoch's partial batch, an uneven or trailing window, a layout that fell back) runs in their
  // pool too: the capture released the eager cache it would otherwise use. Step::forward holds the
  // Lending in its Forward, declared before the micro-batch's tensors, so that it ends after them.
  // A window run eagerly makes tensors that outlive its micro-batches (AMP's f16 weight copies):
  // Step::update sets keep_open on the micro-batches that do not close it, whose Lending then only
  // pauses, so that what the host does between them (the loader's next batch) stays out of the
  // pool, and the window's last micro-batch ends it. When the lending ends with a tensor still in
  // the pool, or after the pool gave segments back for the work, the graphs go (evictions()):
  // their layouts stay warm and are captured again at their next batch. Null without graphs.
  class Lending {
   public:
    explicit Lending(GraphedStep& g) : g_(g) {}
    ~Lending();
    Lending(const Lending&) = delete;
    Lending& operator=(const Lending&) = delete;
    bool keep_open = false;   // the micro-batch left its window open: the next one goes on in the pool

   private:
    GraphedStep& g_;
  };
  std::shared_ptr<Lending> lend_for_eager();
  // Ends the lending (the last Lending of a window, the next replay or evaluation), dropping the
  // graphs when they may not replay again; nothing when none is open. pause_eager_lending: the
  // eager pools are current again until the window's next micro-batch (lend_for_eager) resumes it.
  void end_eager_lending();
  void pause_eager_lending();
  // Graphs dropped because eager work beside them left a tensor in their pool or made it give
  // segments back (above), and evaluation batches that did not fit beside them even so (eval_eagerly).
  int64_t evictions() const { return evictions_; }
  int64_t eval_ooms() const { return eval_ooms_; }
  // Requests outside the graphs' pool that dropped them to fit (fall_back_when_a_capture_fails).
  int64_t reclaims() const { return reclaims_; }
  struct EvalOutput {
    Tensor loss, correct;   // 0-dim on the device: the f32 mean loss, the f64 count; valid until the next replay
  };
  // Empty when the evaluation's capture ran out of memory and falling back is allowed: the caller
  // runs the batch eagerly (it changes nothing but the outputs).
  std::optional<EvalOutput> eval_step(const Tensor& images, const Tensor& labels);
  void eval_warmed(const Tensor& images);

  // Drops the graphs, their pool and their captured inputs and outputs, forgets the warm layout
  // and the layouts that fell back, and with accumulation the gradients kept between windows, so
  // that the next step runs eagerly before a capture (the maximum-batch trials: one graph per
  // trial, nothing left from the one before).
  void release();

  int64_t captures() const { return captures_; }
  int64_t replays() const { return replays_; }
  int64_t eval_captures() const { return eval_captures_; }
  // The reserved bytes of the pool every graph shares (0 before the first capture).
  size_t pool_bytes() const { return any_graph() != nullptr ? any_graph()->pool_bytes() : 0; }
  int64_t eval_replays() const { return eval_replays_; }

 private:
  // A batch's shape, strides and dtype: what a graph's captured input must match.
  struct Layout {
    Shape shape, strides;
    DType dtype = DType::f32;
    bool operator==(const Layout&) const = default;
  };
  static Layout layout(const Tensor& t) { return {t.shape(), t.strides(), t.dtype()}; }
  // One captured micro-batch and its outputs (in the graphs' pool).
  struct Captured {
    std::unique_ptr<Backend::Graph> graph;
    Tensor loss, logits;
  };
  // The graphs of one batch layout: its captured inputs (a clone of the first batch of the layout;
  // each batch is copied into them), [0] a micro-batch that only adds its gradients, [1] one that
  // steps, and the evaluation forward with its count of correct predictions.
  struct Shaped {
    Layout images, labels;
    Tensor x, y;
    Captured graphs[2];
    Captured eval;
    Tensor eval_correct;
    int64_t used = 0;   // the step counter at its last use (the least recent goes first)
    bool has_training_graph() const { return graphs[0].graph || graphs[1].graph; }
  };
  // At most this many layouts keep graphs: the full batch and the epoch's partial one (a batch
  // schedule's next phase replaces the least recently used).
  static constexpr size_t kMaxShapes = 2;
  static_assert(kMaxShapes <= nn::Recomputer::kPlannedShapes,
                "a warm layout's --checkpoint optimal plan must still be kept: no profile inside a capture");
  Shaped* find(const Layout& images, const Layout& labels);
  const Shaped* find(const Layout& images) const;
  // The layout's entry, made (its inputs cloned) when new; copies the batch into its inputs when not.
  Shaped& shape_for(const Tensor& images, const Tensor& labels);
  // Any graph, whose pool a new capture shares (every graph shares one pool: none runs while another does).
  const Backend::Graph* any_graph() const;
  void capture(Shaped& s, Captured& g, const optim::MicroBatch& mb);
  void capture_eval(Shaped& s);
  // After a capture of `images` ran out of memory (and falling back is allowed): puts the host
  // state back (`before`; null when it ran out before the capture, in the new layout's inputs),
  // drops the layout's entry (its inputs and any other graph of it), and says so.
  struct HostState {
    optim::AccumulatingTrainer::Counts counts;
    bool window_open = false;
    std::vector<double> lrs;
    uint64_t rng_offset = 0;
  };
  HostState host_state() const;
  // `oom`: the capture ran out of memory; otherwise it failed for `what`.
  void fall_back(const Layout& images, const HostState* before, const std::string& what, bool oom);
  void warmed(const Layout& l);   // its host code ran: it goes last in warm_
  static std::string shape_text(const Layout& l);
  static void drop(Shaped& s);
  void drop_graphs();
  void give_up_captures();   // drop_graphs, and no capture from here (eager_only)
  // Every held layout goes eager and no capture follows (eager_only); returns them as text.
  std::string give_up_held_layouts();
  // The allocator's out-of-memory handler: a request of `bytes` outside the pool that did not fit.
  // Drops the graphs and returns true, unless none is held, the request comes from another thread
  // or from inside this class (busy_: a capture's inputs, which fall back on their own).
  bool make_room(size_t bytes);

  // Checks a batch's labels on the host: i64, each 0 or 1.
  static void check_labels(const Tensor& labels);
  // Whether the step that just ran was skipped by the scaler's device state (a host read).
  bool skipped_on_device() const;

  Model& model_;
  optim::AccumulatingTrainer& trainer_;
  optim::Optimizer& opt_;
  optim::GradScaler& scaler_;
  Device device_;
  int64_t accumulation_ = 1;
  bool ready_ = false;        // the optimizer has really stepped eagerly
  bool grads_kept_ = true;    // with accumulation: an eager window has made the gradients that are kept
  bool window_replayed_ = false;   // the open window's micro-batches so far were replays
  bool lending_ = false;           // the graphs' pool is lent to an eager training micro-batch
  bool window_lent_ = false;       // paused between the micro-batches of a window run eagerly
  // The layouts of the last kMaxShapes micro-batches whose host code ran (eager or captured), the
  // most recent last: a capture needs one of them. Their host-side choices are all still held:
  // cuDNN's per-shape plans, and --checkpoint optimal's plans (nn::Recomputer keeps more shapes).
  std::vector<Layout> warm_;
  std::vector<Layout> eval_warm_;   // the layouts of the eager evaluation batches so far
  std::function<void(const std::string&)> fallback_log_;   // set: a capture out of memory falls back
  bool falls_back_ = false;
  std::vector<Layout> no_graph_, no_eval_graph_;   // layouts whose capture fell back: eager from then on
  bool eager_only_ = false;                        // no layout is captured any more (eager_only)
  std::vector<Shaped> shapes_;
  int64_t uses_ = 0;
  int64_t captures_ = 0;
  int64_t replays_ = 0;
  int64_t eval_captures_ = 0;
  int64_t eval_replays_ = 0;
  int64_t evictions_ = 0;
  int64_t eval_ooms_ = 0;
  int64_t reclaims_ = 0;
  int oom_handler_ = 0;        // its id with the device's allocator (0: none)
  std::thread::id owner_;      // the thread that set it: only its requests may drop the graphs
  bool busy_ = false;          // set (a ScopedFlag) where make_room must leave the graphs alone
};

}  // namespace minidl::train
