// The specs of train/config.h: each registers its own flags (with their defaults in --help) and
// checks its own values, with one-line errors that name the flag, the value and what is accepted
// (exit status 2 in the programs); TrainConfig registers them in --help's order and checks what
// joins several of them.
#include <CLI/CLI.hpp>
#include <cctype>
#include <cmath>
#include <filesystem>
#include <set>

#include "core/allocator.h"
#include "core/backend.h"
#include "optim/schedule.h"
#include "train/batch_schedule.h"
#include "train/config.h"
#include "train/graphed_step.h"

namespace minidl::train {
namespace {

bool is_resnet(const std::string& m) { return m.rfind("resnet", 0) == 0; }
bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

const std::set<std::string>& known_models() {
  static const std::set<std::string> m{"smallcnn",       "resnet18",       "resnet34",      "resnet50",
                                       "resnet18-small", "resnet34-small", "resnet50-small"};
  return m;
}

std::string join(const std::set<std::string>& s) {
  std::string out;
  for (const auto& x : s) out += (out.empty() ? "" : ", ") + x;
  return out;
}

[[noreturn]] void usage(const std::string& msg) { throw UsageError(msg); }

}  // namespace

// ---- ModelSpec ----------------------------------------------------------------------------------

void ModelSpec::add_flags(CLI::App& app) {
  app.add_option("--model", model, "smallcnn (the Keras study's CNN), resnet18, resnet34, resnet50, or "
                                     "resnet18-small/34-small/50-small (3x3 stem, no max-pool, for 32-96 px)");
  app.add_option("--image-size", image_size, "input height and width; 0: the model's default "
                                               "(smallcnn 200, resnet 224, *-small 32)");
  app.add_flag("--conv-bn-chain", conv_bn_chain,
               "ResNets: the convolutions carry their batch norms (docs/conv_bn.md): on CUDA with channels-last "
               "f16 or f32, cuDNN's fused graphs; elsewhere the same function composed; off by default");
}

void ModelSpec::validate() const {
  if (!known_models().count(model)) usage("--model '" + model + "': expected one of " + join(known_models()));
  if (image_size < 0) usage("--image-size must be > 0 (or 0 for the model's default)");
  if (image_size > 0 && image_size < (is_resnet(model) ? 16 : 4))
    usage("--image-size " + std::to_string(image_size) + " is too small for " + model);
  if (conv_bn_chain && !is_resnet(model))
    usage("--conv-bn-chain: " + model + " has no residual blocks to chain; use a ResNet (--model resnet50) or drop "
          "the flag");
}

int64_t ModelSpec::resolved_image_size() const {
  if (image_size > 0) return image_size;
  if (model == "smallcnn") return 200;
  return ends_with(model, "-small") ? 32 : 224;
}

// ---- DataSpec -----------------------------------------------------------------------------------

void DataSpec::add_flags(CLI::App& app) {
  app.add_option("--data", data, "'synthetic' (built-in two-class images) or a folder: class folders, "
                                   "Kaggle train/ (cat.N.jpg) or PetImages/Cat|Dog");
  app.add_option("--synthetic-size", synthetic_size,
                 "with a fractional --split: synthetic images per class (0: 1000); counts need none");
  app.add_option("--synthetic-difficulty", synthetic_difficulty, "synthetic task difficulty in [0, 1]");
  app.add_option("--split", split, "train,val,test per class: integers are counts (the Keras study's "
                                     "600,200,200), decimals are fractions (0.8,0.1,0.1); unset, a folder with "
                                     "fewer than 1000 usable images in a class gets 0.6,0.2,0.2")
      ->each([this](const std::string&) { split_given = true; });
  app.add_option("--manifest", manifest, "split manifest: read when it exists, else written; empty: none");
  app.add_flag("--validate-data", validate_data, "decode every file of a --data folder before the split (every run "
                                                   "reads their headers), print the report, and leave unreadable files "
                                                   "out; off by default");
  app.add_option("--augment", augment, "none, keras (resize 250, random crop, flip), article (the Keras "
                                         "article's offline copies: train and val sets twice, as loaded and as "
                                         "the top-left crop of a bicubic 250 upscale) or rrc (random resized "
                                         "crop + flip)");
  app.add_option("--resize", resize,
                 "how photos become --image-size squares for evaluation and --augment none: center (shorter side to "
                 "the size, centre crop; torchvision Resize(s) + CenterCrop(s)), imagenet (shorter side to size x "
                 "256/224, centre crop; torchvision's ImageNet evaluation), squash (both sides to the size, "
                 "bilinear; torchvision Resize((s, s))), keras (both sides, nearest; Keras target_size); auto: keras "
                 "for smallcnn, center for the ResNets");
  app.add_option("--normalize", normalize, "pixel scaling of loaded photos: imagenet (ImageNet mean/std) or unit "
                                             "(pixels / 255, the Keras study's rescale); the in-memory synthetic set is "
                                             "already normalised");
  app.add_flag("--no-shuffle", no_shuffle, "keep the dataset order in training; off by default");
  app.add_option("--workers", workers, "data loader threads (0: decode on the training thread)");
  app.add_option("--data-cache", data_cache,
                 "host memory for images as decoded and resized (before augmentation), over the run's train, val "
                 "and test parts: each file is decoded once instead of every epoch, the same batches bit for bit; "
                 "0: off");
}

void DataSpec::validate() const {
  if (workers < 0) usage("--workers must be >= 0");
  try {
    parse_bytes(data_cache);
  } catch (const std::exception&) {
    usage("--data-cache '" + data_cache + "': expected a size such as 4GiB or 512MiB, or 0 for no cache");
  }
  if (normalize != "imagenet" && normalize != "unit") usage("--normalize '" + normalize + "': expected imagenet or unit");
  if (resize != "auto" && resize != "center" && resize != "imagenet" && resize != "squash" && resize != "keras")
    usage("--resize '" + resize + "': expected auto, center, imagenet, squash or keras");
  if (augment != "none" && augment != "keras" && augment != "article" && augment != "rrc")
    usage("--augment '" + augment + "': expected none, keras, article or rrc");
  if (synthetic_size < 0) usage("--synthetic-size must be >= 0");
  if (synthetic_difficulty < 0 || synthetic_difficulty > 1) usage("--synthetic-difficulty must be in [0, 1]");
  parse_split(split);
  if (validate_data && data == "synthetic")
    usage("--validate-data checks the files of a --data folder; the synthetic set has none");
  if (data != "synthetic") {
    std::error_code ec;
    if (std::filesystem::exists(data, ec) && !std::filesystem::is_directory(data, ec))
      usage("--data '" + data + "' is a file; give the folder that holds the class folders (or Kaggle's train/)");
    if (!std::filesystem::is_directory(data, ec)) usage("--data '" + data + "': no such folder");
    if (std::filesystem::is_empty(data, ec)) usage("--data '" + data + "': the folder is empty");
  }
}

// ---- OptimizerSpec ------------------------------------------------------------------------------

void OptimizerSpec::add_flags(CLI::App& app) {
  app.add_option("--batch-size", batch_size, "micro-batch per device: images per forward/backward of each rank "
                                             "(under mpirun -np N the effective batch is N x this x accumulation)");
  app.add_option("--accumulation-steps", accumulation_steps,
                 "micro-batches per optimizer step (effective batch = batch-size x ranks x this)");
  app.add_option("--batch-schedule", batch_schedule,
                 "batch by epoch: B@E,... (32@0,64@5: 32 from the first epoch, 64 after five), xF@every:N or "
                 "xF@E1,E2 (--batch-size times F); a batch that does not fit the budget is accumulated; empty: fixed");
  app.add_option("--batch-schedule-lr", batch_schedule_lr,
                 "lr at each scheduled batch: keep, linear (x batch / first batch) or sqrt (its square root)");
  app.add_option("--optimizer", optimizer, "sgd, adam or adamw");
  app.add_option("--lr", lr, "learning rate for --base-batch; 0: the optimizer's default (sgd 0.01, adam 0.001)");
  app.add_option("--momentum", momentum, "SGD momentum");
  app.add_flag("--nesterov", nesterov, "SGD Nesterov momentum; off by default");
  app.add_option("--weight-decay", weight_decay, "L2 (sgd, adam) or decoupled (adamw) weight decay; "
                                                   "negative: the optimizer's default (0; adamw 0.01)");
  app.add_option("--beta1", beta1, "Adam beta1");
  app.add_option("--beta2", beta2, "Adam beta2");
  app.add_option("--eps", eps, "Adam epsilon");
  app.add_option("--eps-mode", eps_mode, "where Adam adds --eps: torch (to the bias-corrected sqrt(v), "
                                           "PyTorch) or keras (to sqrt(v) before the bias correction, Keras)");
  app.add_option("--max-grad-norm", max_grad_norm, "clip the global gradient norm to this; 0: off");
  app.add_option("--lr-scaling", lr_scaling, "none, linear or sqrt: lr x (effective batch / base batch)^(1 or 1/2)");
  app.add_option("--base-batch", base_batch, "the batch --lr was tuned for (with --lr-scaling)");
  app.add_option("--warmup-steps", warmup_steps, "linear warmup over this many optimizer steps");
  app.add_option("--warmup-epochs", warmup_epochs, "linear warmup over this many epochs (overrides steps)");
  app.add_option("--schedule", schedule, "constant | step:SIZE:GAMMA | multistep:M1,M2:GAMMA | cosine[:MIN]; SIZE and M "
                                       "in optimizer steps, or in epochs as 4e");
}

void OptimizerSpec::validate() const {
  if (batch_size <= 0) usage("--batch-size must be > 0, got " + std::to_string(batch_size));
  if (accumulation_steps <= 0) usage("--accumulation-steps must be >= 1, got " + std::to_string(accumulation_steps));
  if (optimizer != "sgd" && optimizer != "adam" && optimizer != "adamw")
    usage("--optimizer '" + optimizer + "': expected sgd, adam or adamw");
  if (lr < 0 || !std::isfinite(lr)) usage("--lr must be a finite number >= 0");
  if (momentum < 0 || momentum >= 1) usage("--momentum must be in [0, 1)");
  if (nesterov && momentum <= 0) usage("--nesterov needs --momentum > 0");
  try {
    optim::parse_lr_scaling(lr_scaling);
  } catch (const Error&) {
    usage("--lr-scaling '" + lr_scaling + "': expected none, linear or sqrt");
  }
  if (base_batch <= 0) usage("--base-batch must be > 0");
  if (warmup_steps < 0 || warmup_epochs < 0) usage("--warmup-steps and --warmup-epochs must be >= 0");
  if (batch_schedule_lr != "keep" && batch_schedule_lr != "linear" && batch_schedule_lr != "sqrt")
    usage("--batch-schedule-lr '" + batch_schedule_lr + "': expected keep, linear or sqrt");
  if (max_grad_norm < 0) usage("--max-grad-norm must be >= 0");
  if (eps_mode != "torch" && eps_mode != "keras") usage("--eps-mode '" + eps_mode + "': expected torch or keras");
}

// ---- MemorySpec ---------------------------------------------------------------------------------

DType MemorySpec::resolved_amp_dtype() const { return amp_dtype == "bf16" ? DType::bf16 : DType::f16; }

void MemorySpec::add_flags(CLI::App& app) {
  // An optional value: "--amp" is f16; in a config file "amp = true" and "amp = false" still work.
  app.add_option_function<std::string>(
         "--amp",
         [this](const std::string& v) {
           std::string low;
           for (const char ch : v) low += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
           amp = !(low == "false" || low == "0" || low == "off" || low == "no");
           const bool f16 = low.empty() || low == "f16" || low == "true" || low == "1" || low == "on" || low == "yes";
           amp_dtype = f16 || !amp ? "f16" : low;   // anything else is validate()'s to refuse
         },
         "mixed precision: f16 autocast + gradient scaler (--amp or --amp f16), or bf16 autocast without a scaler "
         "(--amp bf16); off by default")
      ->expected(0, 1);
  app.add_option("--amp-init-scale", amp_init_scale, "with --amp (f16): the gradient scaler's initial loss scale");
  app.add_option("--amp-growth-interval", amp_growth_interval,
                 "with --amp (f16): consecutive clean steps before the loss scale doubles");
  app.add_option("--checkpoint", checkpoint, "activation recomputation: none, stages, sequential:N or optimal "
                                               "(ResNet models)");
  app.add_option("--memory-budget", memory_budget, "cap on reserved device memory, e.g. 11GiB; empty: none");
  app.add_flag("--expandable-segments", expandable_segments,
               "CUDA devices: the caching allocator maps the device's memory page by page into one growing address "
               "range instead of reserving fixed segments (PyTorch's expandable_segments), so memory freed between "
               "live blocks goes back to the device; minidl-memest and minidl-maxbatch model it; off by default");
}

void MemorySpec::validate() const {
  if (amp && amp_dtype != "f16" && amp_dtype != "bf16")
    usage("--amp '" + amp_dtype + "': expected f16 or bf16 (--amp alone is f16)");
  if (!(amp_init_scale > 0) || !std::isfinite(amp_init_scale)) usage("--amp-init-scale must be > 0");
  if (amp_growth_interval < 1) usage("--amp-growth-interval must be >= 1");
  parse_checkpoint(checkpoint);
  if (!memory_budget.empty()) {
    try {
      if (parse_bytes(memory_budget) == 0) usage("--memory-budget must be > 0");
    } catch (const UsageError&) {
      throw;
    } catch (const Error&) {
      usage("--memory-budget '" + memory_budget + "': expected a size such as 11GiB, 512MiB or 1.5GB");
    }
  }
}

// ---- DeviceSpec ---------------------------------------------------------------------------------

void DeviceSpec::add_flags(CLI::App& app) {
  app.add_option("--cudnn-benchmark", cudnn_benchmark,
                 "cuDNN convolution algorithms: on (autotune, as torch.backends.cudnn.benchmark) or off (heuristic)");
  // Flag functions, so that a config file's "channels-last = false" (a negative count) says NCHW too.
  app.add_flag_function(
      "--channels-last", [this](int64_t n) { channels_last = n > 0; },
      "weights and input batches in channels-last (NHWC) memory, kept end to end; the default with --device cuda "
      "and --amp, off otherwise");
  app.add_flag_function(
         "--no-channels-last", [this](int64_t n) { channels_last = n <= 0; },
         "NCHW weights and batches, also with --device cuda and --amp")
      ->excludes("--channels-last");
  app.add_flag_function(
      "--cuda-graphs", [this](int64_t n) { cuda_graphs = n > 0; },
      "require CUDA graphs: a capture that runs out of memory ends the run as an OOM. By default, with --device "
      "cuda, the training step is captured into a CUDA graph after the warm-up and replayed for every full batch "
      "(any optimizer, schedule, --max-grad-norm and accumulation; data-parallel ranks run eagerly and say so), "
      "and so is the evaluation's forward; a capture that does not fit, or fails otherwise, "
      "falls back to eager steps for its batch shape, with one line saying why");
  app.add_flag_function(
         "--no-cuda-graphs", [this](int64_t n) { cuda_graphs = n <= 0; }, "every step eagerly")
      ->excludes("--cuda-graphs");
  app.add_option("--device", device, "cpu, cuda or cuda:N");
}

void DeviceSpec::validate() const {
  if (cudnn_benchmark != "on" && cudnn_benchmark != "off")
    usage("--cudnn-benchmark '" + cudnn_benchmark + "': expected on or off");
  if (gpu.empty()) {
    resolve_device(device);
  } else if (!cuda_built()) {   // a plan for a GPU needs the CUDA backend's kernels' answers, not a GPU
    usage("--gpu " + gpu + ": this build has no CUDA backend (rebuild with -DMINIDL_CUDA=ON)");
  }
}

// ---- RunSpec ------------------------------------------------------------------------------------

void RunSpec::add_flags(CLI::App& app) {
  app.add_option("--epochs", epochs, "training epochs");
  app.add_option("--max-steps", max_steps, "stop after this many optimizer steps; 0: no limit (not 'no steps': "
                                             "--save-initial-weights saves the untrained model)");
  app.add_option("--seed", seed, "seed of data split, initialisation, shuffling and augmentation");
  app.add_option("--init-weights", init_weights,
                 "load model weights (safetensors, torchvision names); empty: random initialisation");
  app.add_option("--save-weights", save_weights, "at the end (or on SIGINT) save the model here and optimizer + "
                                                   "gradient-scaler state and progress beside it (safetensors); "
                                                   "empty: none");
  app.add_option("--save-initial-weights", save_initial_weights,
                 "save the model as initialised (random, or --init-weights), before the first step (safetensors); "
                 "empty: none");
  app.add_option("--resume", resume, "continue a --save-weights file exactly where it stopped (weights, optimizer, "
                                       "scaler, epoch and micro-batch, RNG); empty: start fresh");
  app.add_flag("--summary", summary,
               "print the model table (layers, shapes, parameters, memory) and exit; off by default");
  app.add_option("--out", out, "folder for metrics.csv and results.json; empty: print only");
  app.add_option("--diverge-loss", diverge_loss, "a training loss above this (or NaN) stops the run as diverged; "
                                                   "0: the optimizer's default (sgd 50, adam/adamw 10000)");
  app.add_option("--target-accuracy", target_accuracy,
                 "record the training time to reach this validation accuracy (0-1); 0: off");
  app.add_option("--progress-every", progress_every, "steps between progress lines; 0: one line per epoch");
  app.add_option("--progress-seconds", progress_seconds,
                 "also a progress line when this many seconds passed since the last one (the first within it); 0: off");
  app.add_flag("--quiet", quiet, "no progress lines; off by default");
  app.add_flag("--verbose", verbose, "error lines keep the source location (file:line) of the failed check; "
                                       "off by default");
}

void RunSpec::validate() const {
  if (epochs <= 0) usage("--epochs must be >= 1");
  if (max_steps < 0) usage("--max-steps must be >= 0");
  if (target_accuracy < 0 || target_accuracy > 1) usage("--target-accuracy must be in [0, 1]");
  if (!(diverge_loss >= 0)) usage("--diverge-loss must be > 0 (or 0 for the optimizer's default)");
  if (progress_every < 0) usage("--progress-every must be >= 0");
  if (progress_seconds < 0) usage("--progress-seconds must be >= 0");
  if (!save_initial_weights.empty() && !resume.empty())
    usage("--save-initial-weights with --resume: a resumed run has no initial weights (they are in the --resume "
          "file's history); drop one of the two");
  for (const auto* f : {&init_weights, &resume}) {
    if (!f->empty() && !std::filesystem::is_regular_file(*f))
      usage("'" + *f + "': no such file (--init-weights / --resume)");
  }
}

// ---- TrainConfig: the specs joined --------------------------------------------------------------

void TrainConfig::add_flags(CLI::App& app) {
  app.option_defaults()->always_capture_default();
  ModelSpec::add_flags(app);
  DataSpec::add_flags(app);
  OptimizerSpec::add_flags(app);
  MemorySpec::add_flags(app);
  DeviceSpec::add_flags(app);
  RunSpec::add_flags(app);
}

void TrainConfig::validate() const {
  ModelSpec::validate();
  DataSpec::validate();
  OptimizerSpec::validate();
  MemorySpec::validate();
  RunSpec::validate();
  if (world_size < 1) usage("the world size must be >= 1, got " + std::to_string(world_size));
  const BatchSchedule batches = BatchSchedule::parse(batch_schedule, batch_size);
  for (int64_t e = 0; e < epochs; ++e) batches.batch_at(e);   // throws past 2^31
  try {
    // Epoch units ("multistep:4e,8e:0.5") checked with 100 steps per epoch.
    optim::parse_schedule(resolve_epoch_units(schedule, [](double e) { return 100.0 * e; }, epochs, 0), 1000);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    usage("--schedule '" + schedule + "' is invalid: expected constant, step:SIZE:GAMMA, multistep:M1,M2:GAMMA "
          "or cosine[:MIN] (milestones and sizes in steps, or in epochs as 4e)");
  }
  if (cuda_graphs.value_or(false)) check_cuda_graphs(*this);
  if (parse_checkpoint(checkpoint).kind != CheckpointSpec::Kind::None && !is_resnet(model))
    usage("--checkpoint " + checkpoint + " needs a ResNet model (the small CNN has no stages to recompute)");
  DeviceSpec::validate();   // last: it asks the CUDA runtime
}

void add_train_flags(CLI::App& app, TrainConfig& c) { c.add_flags(app); }
void validate(const TrainConfig& c) { c.validate(); }

}  // namespace minidl::train
