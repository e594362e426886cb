// The predefined studies of DESIGN.md with their published settings, their --quick versions (sized
// for minutes on 2 CPU cores with the synthetic set), and generic grids. The batch-schedule study,
// with outputs of its own, lives in batch_schedule_study.cpp.
#include <set>

#include "experiments/harness/sweep.h"

namespace minidl::harness {
namespace {

std::string b_id(int64_t b) { return "b" + std::to_string(b); }

std::vector<int64_t> powers(int64_t from, int64_t to) {
  std::vector<int64_t> v;
  for (int64_t b = from; b <= to; b *= 2) v.push_back(b);
  return v;
}

// The article's protocol: (1) SGD against Adam on the standard data, batch 16-128; (2) Adam on the
// standard against the augmented data (its offline copies, --augment article), batch 16-256; each
// optimizer with Keras' defaults; three seeds per cell.
Study keras_batch(bool quick, const TrainConfig& base) {
  Study s;
  s.name = "keras-batch";
  s.title = "Accuracy vs batch size as the Keras article ran it: SGD vs Adam, and Adam with its augmentation "
            "(small CNN)";
  s.seeds = 3;
  s.summary_columns = {"run_id", "batch_size", "test_acc", "best_val_acc", "best_epoch", "images_per_s",
                       "peak_allocated_mib", "status"};
  s.published_setup = "Keras, 200x200 cats vs dogs photos, 600/200/200 per class, 5 epochs, one GPU";
  s.published = {{"sgd, augment none", 16, 0.62},
                 {"adam, augment none", 64, 0.67},
                 {"adam, augment article", 128, 0.58},
                 {"adam, augment article", 256, 0.575}};
  s.notes = "Published (the article, as issue 33 quotes it; Keras, 200x200 cats vs dogs, 600/200/200 per class, 5 "
            "epochs): SGD about 62% at batch 16, falling fast above it; Adam still about 67% at 64; Adam with the "
            "augmentation 58% at 128 and 57.5% at 256. The article passes validation_data=train_it to fit(), so what "
            "it calls validation accuracy is measured on its training images; minidl validates on the validation "
            "split (best_val_acc) and reports test_acc on the untouched test split, which is what the plot and the "
            "published column put side by side. One run is 400 test images: about +-2.4 points of binomial noise.";
  struct Line {
    std::string optimizer, augment;
    int64_t max_batch;
  };
  const std::vector<Line> lines{{"sgd", "none", 128}, {"adam", "none", 256}, {"adam", "article", 256}};
  const StudyScale scale =
      quick ? StudyScale{"smallcnn", 32, "200,100,100", 3} : StudyScale{"smallcnn", 200, "600,200,200", 5};
  // Seeds outermost: a sweep stopped between sittings has whole seeds of every line.
  for (int k = 0; k < s.seeds; ++k) {
    for (const Line& line : lines) {
      for (int64_t b : powers(16, line.max_batch)) {
        SweepRun& r = add_study_run(s, base, scale);
        TrainConfig& c = r.config;
        c.optimizer = line.optimizer;
        // Keras 2's defaults: SGD(learning_rate=0.01, momentum=0.0, nesterov=False); Adam(learning_rate=0.001,
        // beta_1=0.9, beta_2=0.999, epsilon=1e-7), eps added to sqrt(v) before the bias correction.
        c.lr = line.optimizer == "sgd" ? 0.01 : 0.001;
        c.momentum = 0.0;
        c.nesterov = false;
        c.weight_decay = 0.0;
        c.beta1 = 0.9;
        c.beta2 = 0.999;
        c.eps = 1e-7;
        c.eps_mode = "keras";
        c.batch_size = b;
        c.augment = line.augment;
        c.seed = base.seed + static_cast<uint64_t>(k);
        // Photos: the article's ImageDataGenerator(rescale=1/255). The synthetic set keeps its
        // zero-mean scale, so its augmented runs (through the loader) see the same input scale as
        // its in-memory unaugmented ones.
        c.normalize = c.data == "synthetic" ? "imagenet" : "unit";
        // Keras has no divergence stop, and its loss is not bounded either: tf-keras'
        // binary_crossentropy takes the logits back from a sigmoid output (_get_logits). Adam at
        // lr 0.001 through the 320,000-wide dense layer runs the first steps' loss up to 34-123 on
        // the photos, above the default --diverge-loss 50, and recovers within the first epoch
        // (the run with all 42: 18 of the 30 Adam runs stopped at step 1-2 under the default).
        // So this study stops only where the loss has left any recoverable range.
        c.diverge_loss = kKerasBatchDivergeLoss;
        if (quick && c.data == "synthetic") c.synthetic_difficulty = 0.3;
        r.id = b_id(b) + "-" + line.optimizer + "-" + line.augment + "-s" + std::to_string(c.seed);
        r.group = line.optimizer + ", augment " + line.augment;
      }
    }
  }
  return s;
}

Study utilization(bool quick, const TrainConfig& base) {
  Study s;
  s.name = "utilization";
  s.title = "Throughput, device utilisation and memory vs batch size";
  // The steady rate leaves out each run's first step, which pays the warm-up (cuDNN autotuning for
  // the batch's new shapes, handle creation); images_per_s keeps it, for comparison.
  s.plot_y = "images_per_s_steady";
  s.plot_ylabel = "images / s (after the first step)";
  s.summary_columns = {"batch_size", "images_per_s_steady", "images_per_s", "cpu_util_pct", "gpu_busy_pct",
                       "gpu_busy_source", "peak_allocated_mib", "peak_reserved_mib", "status"};
  s.published_setup = "GPU measurements of the same article, batch 4 to 1024";
  s.notes = "Published (Ohio State measurements in the same article): GPU busy % and memory grow with the batch "
            "until the device saturates; images/s flattens beyond that point.";
  // --amp: the row to read beside PyTorch's --best (bench/pytorch_utilization.py), in a folder of
  // its own so that it never mixes with the fp32 rows (same run ids).
  // --amp bf16 is a folder and a table of its own too, beside f16's.
  const bool bf16 = base.amp && base.resolved_amp_dtype() == DType::bf16;
  if (base.amp) {
    s.variant = bf16 ? "amp-bf16" : "amp";
    s.title += bf16 ? " (bf16 mixed precision)" : " (mixed precision)";
    s.notes += bf16 ? " This table runs with --amp bf16 (bf16 autocast, no loss scaling), the precision of "
                      "PyTorch's --best --amp-dtype bf16"
                    : " This table runs with --amp (f16 autocast, dynamic loss scaling), the precision of PyTorch's "
                      "--best";
    s.notes += "; --best also uses channels_last, which minidl runs with --channels-last (" +
               std::string(base.resolved_channels_last() ? "on here" : "off here") + ").";
  }
  const int64_t steps = quick ? 3 : 20;
  for (int64_t b : powers(4, quick ? 512 : 1024)) {
    // Exactly enough training images for `steps` batches; no evaluation.
    const std::string split = std::to_string((b * steps + 1) / 2) + ",0,0";
    SweepRun& r =
        add_study_run(s, base, quick ? StudyScale{"smallcnn", 64, split, 1} : StudyScale{"resnet50", 224, split, 1});
    TrainConfig& c = r.config;
    c.optimizer = "sgd";
    c.momentum = 0.9;
    c.lr = 0.001;
    c.batch_size = b;
    c.max_steps = steps;
    c.progress_every = 0;
    r.id = b_id(b);
    r.group = c.device + (!c.amp ? "" : bf16 ? ", amp bf16" : ", amp");
    r.throughput_only = true;
  }
  return s;
}

Study techniques(bool quick, const TrainConfig& base) {
  Study s;
  s.name = "techniques";
  s.title = "Maximum batch under memory-saving techniques (ResNet, fixed memory budget)";
  s.plot_y = "max_batch";
  s.plot_ylabel = "maximum (effective) batch";
  s.summary_columns = {"technique", "max_batch", "dry_run_max_batch", "peak_allocated_mib", "epoch_seconds",
                       "best_val_acc", "best_epoch", "status", "note"};
  s.published_setup = "ResNet-50, 224x224 photos, 15 epochs, an 11 GiB RTX 2080 Ti";
  s.notes = "Published (ResNet-50, 224x224, RTX 2080 Ti 11 GiB): baseline 102, cuDNN autotune off 111, AMP about "
            "2x (f16; the amp-bf16 row is bf16 autocast without loss scaling, which the article predates), optimal "
            "checkpointing more than 2x, all combined 960; best accuracy and speed at batch 199. Each row trains at "
            "its recommended batch (10% below its maximum); max_batch counts the effective batch. The -expandable "
            "rows repeat a row with --expandable-segments (PyTorch's expandable_segments, which the article "
            "predates): memory freed between live blocks goes back to the device. On the CPU backend there is no "
            "cuDNN, so the autotune-off row equals the baseline, and no segments to expand.";
  s.maxbatch.steps = quick ? 2 : 3;
  s.maxbatch.confirm_next = true;   // the dry run's answer checked both ways on the device
  s.maxbatch.probe_small = quick ? 2 : 4;
  s.maxbatch.probe_large = quick ? 6 : 16;
  struct Row {
    std::string name, checkpoint;
    bool amp = false, autotune_off = false;
    int64_t accumulation = 1;
    std::string amp_dtype = "f16";
    bool expandable = false;
  };
  const std::vector<Row> rows{{"baseline", "none"},
                              {"cudnn-autotune-off", "none", false, true},
                              {"amp", "none", true},
                              {"amp-bf16", "none", true, false, 1, "bf16"},
                              {"recompute-stages", "stages"},
                              {"recompute-sequential", "sequential:4"},
                              {"recompute-optimal", "optimal"},
                              {"accumulation-x4", "none", false, false, 4},
                              {"combined", "optimal", true, false, 4},
                              {"recompute-optimal-expandable", "optimal", false, false, 1, "f16", true},
                              {"combined-expandable", "optimal", true, false, 4, "f16", true}};
  const bool cuda = base.device.rfind("cuda", 0) == 0;
  const StudyScale scale =
      quick ? StudyScale{"resnet18-small", 16, "100,50,0", 1} : StudyScale{"resnet50", 224, "600,200,200", 15};
  for (const Row& row : rows) {
    SweepRun& r = add_study_run(s, base, scale);
    TrainConfig& c = r.config;
    use_article_sgd(c);
    c.memory_budget = quick ? "256MiB" : "11GiB";
    c.checkpoint = row.checkpoint;
    c.cudnn_benchmark = row.autotune_off ? "off" : "on";
    c.accumulation_steps = row.accumulation;
    c.amp = row.amp;
    c.amp_dtype = row.amp_dtype;
    c.expandable_segments = row.expandable;
    c.progress_every = 0;
    if (row.expandable && !cuda) r.unavailable = "--expandable-segments: the CPU's allocator has no segments to expand";
    r.id = row.name;
    r.technique = row.name;
    r.group = "techniques";
    r.find_max_batch = true;
  }
  return s;
}

Study lr_scaling(bool quick, const TrainConfig& base) {
  Study s;
  s.name = "lr-scaling";
  s.title = "Linear learning-rate scaling and warmup vs batch size";
  s.plot_y = "best_val_acc";
  s.plot_ylabel = "best validation accuracy";
  s.summary_columns = {"group", "batch_size", "lr", "warmup_steps", "best_val_acc", "time_to_target_s",
                       "images_per_s", "status", "note"};
  s.published_setup = "the guide's batch 32 to 1024 (here in full: ResNet-18, 224 px photos, 10 epochs)";
  s.notes = "Published (\"Batch size and memory tradeoffs\"): without scaling large batches under-train; linear "
            "scaling alone can diverge at the largest batches; linear scaling with warmup recovers them. The batch "
            "with the shortest time to the target accuracy is not the largest one.";
  const int64_t base_batch = quick ? 16 : 32;
  const StudyScale scale =
      quick ? StudyScale{"smallcnn", 32, "256,100,0", 4} : StudyScale{"resnet18", 224, "600,200,200", 10};
  for (const std::string variant : {"none", "linear", "linear-warmup"}) {
    for (int64_t b : powers(base_batch, quick ? 256 : 1024)) {
      SweepRun& r = add_study_run(s, base, scale);
      TrainConfig& c = r.config;
      c.optimizer = "sgd";
      c.momentum = 0.9;
      c.weight_decay = quick ? 0.0 : 1e-4;
      c.lr = quick ? 0.02 : 0.0125;
      c.base_batch = base_batch;
      c.batch_size = b;
      c.lr_scaling = variant == "none" ? "none" : "linear";
      c.warmup_epochs = variant == "linear-warmup" ? (quick ? 1.0 : 2.0) : 0.0;
      c.target_accuracy = quick ? 0.9 : 0.8;
      c.diverge_loss = 20.0;
      c.progress_every = 0;
      if (quick && c.data == "synthetic") c.synthetic_difficulty = 0.2;
      r.id = b_id(b) + "-" + variant;
      r.group = variant == "none" ? "no scaling" : (variant == "linear" ? "linear" : "linear + warmup");
    }
  }
  return s;
}

}  // namespace

void use_article_sgd(TrainConfig& c) {
  c.optimizer = "sgd";
  c.momentum = 0.9;
  c.lr = 0.001;
  c.weight_decay = 1e-4;
}

SweepRun& add_study_run(Study& s, const TrainConfig& base, const StudyScale& scale) {
  SweepRun& r = s.runs.emplace_back();
  r.config = base;
  r.config.model = scale.model;
  r.config.image_size = scale.image_size;
  r.config.split = scale.split;
  r.config.epochs = scale.epochs;
  return r;
}

const std::vector<std::string>& study_names() {
  static const std::vector<std::string> n{"keras-batch", "utilization",    "techniques",
                                          "lr-scaling",  "batch-schedule", "conv-bn-chain"};
  return n;
}

Study make_study(const std::string& name, bool quick, const TrainConfig& base) {
  Study s;
  if (name == "keras-batch") s = keras_batch(quick, base);
  else if (name == "utilization") s = utilization(quick, base);
  else if (name == "techniques") s = techniques(quick, base);
  else if (name == "lr-scaling") s = lr_scaling(quick, base);
  else if (name == "batch-schedule") s = batch_schedule_study(quick, base);
  else if (name == "conv-bn-chain") s = conv_bn_chain_study(quick, base);
  else throw UsageError("--study '" + name + "': expected keras-batch, utilization, techniques, lr-scaling, "
                        "batch-schedule or conv-bn-chain");
  s.quick = quick;
  for (auto& r : s.runs) {
    r.config.out.clear();
    r.config.save_weights.clear();
    r.config.save_initial_weights.clear();
    r.config.resume.clear();
    r.config.summary = false;
  }
  return s;
}

std::string study_folder(const Study& st, const std::string& device_kind) {
  return st.name + (st.variant.empty() ? "" : "-" + st.variant) + (st.quick ? "-quick-" + device_kind : "");
}

Study make_grid(const TrainConfig& base, const std::vector<int64_t>& batches, const std::vector<std::string>& optimizers,
                const std::vector<std::string>& augments, const std::vector<std::string>& checkpoints) {
  Study s;
  s.name = "grid";
  s.title = "Grid over batch sizes, optimizers, augmentation and recomputation";
  s.summary_columns = {"group", "batch_size", "test_acc", "best_val_acc", "images_per_s", "peak_allocated_mib",
                       "status"};
  const std::vector<int64_t> bs = batches.empty() ? std::vector<int64_t>{base.batch_size} : batches;
  const auto ops = optimizers.empty() ? std::vector<std::string>{base.optimizer} : optimizers;
  const auto augs = augments.empty() ? std::vector<std::string>{base.augment} : augments;
  const auto cks = checkpoints.empty() ? std::vector<std::string>{base.checkpoint} : checkpoints;
  std::set<std::string> ids;
  for (const auto& ck : cks)
    for (const auto& op : ops)
      for (const auto& aug : augs)
        for (int64_t b : bs) {
          SweepRun r;
          r.config = base;
          r.config.batch_size = b;
          r.config.optimizer = op;
          r.config.augment = aug;
          r.config.checkpoint = ck;
          r.config.out.clear();
          r.config.save_weights.clear();
          r.config.save_initial_weights.clear();
          r.id = b_id(b) + "-" + op + "-" + aug + "-" + ck;
          r.group = op + ", augment " + aug + (cks.size() > 1 ? ", checkpoint " + ck : "");
          if (!ids.insert(r.id).second) throw UsageError("the grid lists " + r.id + " twice");
          s.runs.push_back(r);
        }
  return s;
}

}  // namespace minidl::harness
