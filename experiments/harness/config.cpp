// Flag registration and validation for TrainConfig: every program gets the same flags, the same
// defaults in --help and the same one-line errors for bad values (exit status 2 in the mains).
#include "experiments/harness/config.h"

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <set>
#include <sstream>

#include "core/allocator.h"
#include "core/backend.h"
#include "experiments/harness/batch_schedule.h"
#include "experiments/harness/graphed_step.h"
#include "optim/schedule.h"
#ifdef MINIDL_WITH_CUDA
#include "kernels/cuda/runtime.h"
#endif

namespace minidl::harness {
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

int64_t TrainConfig::resolved_image_size() const {
  if (image_size > 0) return image_size;
  if (model == "smallcnn") return 200;
  return ends_with(model, "-small") ? 32 : 224;
}

double TrainConfig::resolved_lr() const {
  if (lr > 0) return lr;
  return optimizer == "sgd" ? 0.01 : 0.001;
}

double TrainConfig::resolved_diverge_loss() const {
  if (diverge_loss > 0) return diverge_loss;
  return optimizer == "sgd" ? kSgdDivergeLoss : kAdamDivergeLoss;
}

double TrainConfig::resolved_weight_decay() const {
  if (weight_decay >= 0) return weight_decay;
  return optimizer == "adamw" ? 0.01 : 0.0;
}

bool TrainConfig::resolved_channels_last() const {
  if (channels_last) return *channels_last;
  const bool cuda = device == "cuda" || device.rfind("cuda:", 0) == 0;
  return cuda && amp;
}

double TrainConfig::scaled_lr() const {
  return optim::scaled_lr(resolved_lr(), effective_batch(), base_batch, optim::parse_lr_scaling(lr_scaling));
}

void add_config_flag(CLI::App& app) {
  app.set_config("--config", "", "read flags from a TOML/INI file (key = value); command-line flags win");
  app.allow_config_extras(CLI::config_extras_mode::error);
  app.option_defaults()->always_capture_default();
}

void add_train_flags(CLI::App& app, TrainConfig& c) {
  app.option_defaults()->always_capture_default();
  app.add_option("--model", c.model, "smallcnn (the Keras study's CNN), resnet18, resnet34, resnet50, or "
                                     "resnet18-small/34-small/50-small (3x3 stem, no max-pool, for 32-96 px)");
  app.add_option("--image-size", c.image_size, "input height and width; 0: the model's default "
                                               "(smallcnn 200, resnet 224, *-small 32)");
  app.add_option("--data", c.data, "'synthetic' (built-in two-class images) or a folder: class folders, "
                                   "Kaggle train/ (cat.N.jpg) or PetImages/Cat|Dog");
  app.add_option("--synthetic-size", c.synthetic_size,
                 "with a fractional --split: synthetic images per class (0: 1000); counts need none");
  app.add_option("--synthetic-difficulty", c.synthetic_difficulty, "synthetic task difficulty in [0, 1]");
  app.add_option("--split", c.split, "train,val,test per class: integers are counts (the Keras study's "
                                     "600,200,200), decimals are fractions (0.8,0.1,0.1); unset, a folder with "
                                     "fewer than 1000 usable images in a class gets 0.6,0.2,0.2")
      ->each([&c](const std::string&) { c.split_given = true; });
  app.add_option("--manifest", c.manifest, "split manifest: read when it exists, else written; empty: none");
  app.add_flag("--validate-data", c.validate_data, "decode every file of a --data folder before the split (every run "
                                                   "reads their headers), print the report, and leave unreadable files "
                                                   "out; off by default");
  app.add_option("--augment", c.augment, "none, keras (resize 250, random crop, flip), article (the Keras "
                                         "article's offline copies: train and val sets twice, as loaded and as "
                                         "the top-left crop of a bicubic 250 upscale) or rrc (random resized "
                                         "crop + flip)");
  app.add_option("--resize", c.resize,
                 "how photos become --image-size squares for evaluation and --augment none: center (shorter side to "
                 "the size, centre crop; torchvision Resize(s) + CenterCrop(s)), imagenet (shorter side to size x "
                 "256/224, centre crop; torchvision's ImageNet evaluation), squash (both sides to the size, "
                 "bilinear; torchvision Resize((s, s))), keras (both sides, nearest; Keras target_size); auto: keras "
                 "for smallcnn, center for the ResNets");
  app.add_option("--normalize", c.normalize, "pixel scaling of loaded photos: imagenet (ImageNet mean/std) or unit "
                                             "(pixels / 255, the Keras study's rescale); the in-memory synthetic set is "
                                             "already normalised");
  app.add_flag("--no-shuffle", c.no_shuffle, "keep the dataset order in training; off by default");
  app.add_option("--workers", c.workers, "data loader threads (0: decode on the training thread)");
  app.add_option("--batch-size", c.batch_size, "micro-batch per device: images per forward/backward of each rank "
                                             "(under mpirun -np N the effective batch is N x this x accumulation)");
  app.add_option("--accumulation-steps", c.accumulation_steps,
                 "micro-batches per optimizer step (effective batch = batch-size x ranks x this)");
  app.add_option("--batch-schedule", c.batch_schedule,
                 "batch by epoch: B@E,... (32@0,64@5: 32 from the first epoch, 64 after five), xF@every:N or "
                 "xF@E1,E2 (--batch-size times F); a batch that does not fit the budget is accumulated; empty: fixed");
  app.add_option("--batch-schedule-lr", c.batch_schedule_lr,
                 "lr at each scheduled batch: keep, linear (x batch / first batch) or sqrt (its square root)");
  app.add_option("--optimizer", c.optimizer, "sgd, adam or adamw");
  app.add_option("--lr", c.lr, "learning rate for --base-batch; 0: the optimizer's default (sgd 0.01, adam 0.001)");
  app.add_option("--momentum", c.momentum, "SGD momentum");
  app.add_flag("--nesterov", c.nesterov, "SGD Nesterov momentum; off by default");
  app.add_option("--weight-decay", c.weight_decay, "L2 (sgd, adam) or decoupled (adamw) weight decay; "
                                                   "negative: the optimizer's default (0; adamw 0.01)");
  app.add_option("--beta1", c.beta1, "Adam beta1");
  app.add_option("--beta2", c.beta2, "Adam beta2");
  app.add_option("--eps", c.eps, "Adam epsilon");
  app.add_option("--eps-mode", c.eps_mode, "where Adam adds --eps: torch (to the bias-corrected sqrt(v), "
                                           "PyTorch) or keras (to sqrt(v) before the bias correction, Keras)");
  app.add_option("--max-grad-norm", c.max_grad_norm, "clip the global gradient norm to this; 0: off");
  app.add_option("--lr-scaling", c.lr_scaling, "none, linear or sqrt: lr x (effective batch / base batch)^(1 or 1/2)");
  app.add_option("--base-batch", c.base_batch, "the batch --lr was tuned for (with --lr-scaling)");
  app.add_option("--warmup-steps", c.warmup_steps, "linear warmup over this many optimizer steps");
  app.add_option("--warmup-epochs", c.warmup_epochs, "linear warmup over this many epochs (overrides steps)");
  app.add_option("--schedule", c.schedule, "constant | step:SIZE:GAMMA | multistep:M1,M2:GAMMA | cosine[:MIN]; SIZE and M "
                                       "in optimizer steps, or in epochs as 4e");
  app.add_option("--epochs", c.epochs, "training epochs");
  app.add_option("--max-steps", c.max_steps, "stop after this many optimizer steps; 0: no limit (not 'no steps': "
                                             "--save-initial-weights saves the untrained model)");
  app.add_flag("--amp", c.amp, "mixed precision (f16 autocast + gradient scaler); off by default");
  app.add_option("--amp-init-scale", c.amp_init_scale, "with --amp: the gradient scaler's initial loss scale");
  app.add_option("--amp-growth-interval", c.amp_growth_interval,
                 "with --amp: consecutive clean steps before the loss scale doubles");
  app.add_option("--checkpoint", c.checkpoint, "activation recomputation: none, stages, sequential:N or optimal "
                                               "(ResNet models)");
  app.add_option("--cudnn-benchmark", c.cudnn_benchmark,
                 "cuDNN convolution algorithms: on (autotune, as torch.backends.cudnn.benchmark) or off (heuristic)");
  // Flag functions, so that a config file's "channels-last = false" (a negative count) says NCHW too.
  app.add_flag_function(
      "--channels-last", [&c](int64_t n) { c.channels_last = n > 0; },
      "weights and input batches in channels-last (NHWC) memory, kept end to end; the default with --device cuda "
      "and --amp, off otherwise");
  app.add_flag_function(
         "--no-channels-last", [&c](int64_t n) { c.channels_last = n <= 0; },
         "NCHW weights and batches, also with --device cuda and --amp")
      ->excludes("--channels-last");
  app.add_flag("--cuda-graphs", c.cuda_graphs,
               "capture the training step into a CUDA graph after the warm-up and replay it for every full "
               "batch (CUDA device, SGD, no accumulation, clipping or ranks; the divergence check follows the "
               "update); off by default");
  app.add_option("--memory-budget", c.memory_budget, "cap on reserved device memory, e.g. 11GiB; empty: none");
  app.add_option("--device", c.device, "cpu, cuda or cuda:N");
  app.add_option("--seed", c.seed, "seed of data split, initialisation, shuffling and augmentation");
  app.add_option("--init-weights", c.init_weights,
                 "load model weights (safetensors, torchvision names); empty: random initialisation");
  app.add_option("--save-weights", c.save_weights, "at the end (or on SIGINT) save the model here and optimizer + "
                                                   "gradient-scaler state and progress beside it (safetensors); "
                                                   "empty: none");
  app.add_option("--save-initial-weights", c.save_initial_weights,
                 "save the model as initialised (random, or --init-weights), before the first step (safetensors); "
                 "empty: none");
  app.add_option("--resume", c.resume, "continue a --save-weights file exactly where it stopped (weights, optimizer, "
                                       "scaler, epoch and micro-batch, RNG); empty: start fresh");
  app.add_flag("--summary", c.summary,
               "print the model table (layers, shapes, parameters, memory) and exit; off by default");
  app.add_option("--out", c.out, "folder for metrics.csv and results.json; empty: print only");
  app.add_option("--diverge-loss", c.diverge_loss, "a training loss above this (or NaN) stops the run as diverged; "
                                                   "0: the optimizer's default (sgd 50, adam/adamw 10000)");
  app.add_option("--target-accuracy", c.target_accuracy,
                 "record the training time to reach this validation accuracy (0-1); 0: off");
  app.add_option("--progress-every", c.progress_every, "steps between progress lines; 0: one line per epoch");
  app.add_option("--progress-seconds", c.progress_seconds,
                 "also a progress line when this many seconds passed since the last one (the first within it); 0: off");
  app.add_flag("--quiet", c.quiet, "no progress lines; off by default");
  app.add_flag("--verbose", c.verbose, "error lines keep the source location (file:line) of the failed check; "
                                       "off by default");
}

SplitSpec parse_split(const std::string& s) {
  SplitSpec spec;
  spec.counts = s.find('.') == std::string::npos;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      const double v = std::stod(item, &used);
      if (used != item.size() || v < 0) throw std::invalid_argument(item);
      spec.parts.push_back(v);
    } catch (const std::exception&) {
      usage("--split '" + s + "': '" + item + "' is not a non-negative number; expected TRAIN,VAL,TEST");
    }
  }
  if (spec.parts.size() != 3) usage("--split '" + s + "': expected three parts TRAIN,VAL,TEST");
  if (spec.parts[0] <= 0) usage("--split '" + s + "': the training part must be > 0");
  if (!spec.counts && spec.parts[0] + spec.parts[1] + spec.parts[2] > 1.0 + 1e-9)
    usage("--split '" + s + "': fractions must add up to at most 1");
  return spec;
}

CheckpointSpec parse_checkpoint(const std::string& s) {
  CheckpointSpec c;
  if (s == "none") return c;
  if (s == "stages") {
    c.kind = CheckpointSpec::Kind::Stages;
  } else if (s == "optimal") {
    c.kind = CheckpointSpec::Kind::Optimal;
  } else if (s.rfind("sequential:", 0) == 0) {
    c.kind = CheckpointSpec::Kind::Sequential;
    const std::string n = s.substr(11);
    try {
      size_t used = 0;
      c.segments = std::stoi(n, &used);
      if (used != n.size() || c.segments < 1) throw std::invalid_argument(n);
    } catch (const std::exception&) {
      usage("--checkpoint '" + s + "': N in sequential:N must be a positive integer");
    }
  } else {
    usage("--checkpoint '" + s + "': expected none, stages, sequential:N or optimal");
  }
  return c;
}

std::vector<int64_t> parse_int_list(const std::string& flag, const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      const long long v = std::stoll(item, &used);
      if (used != item.size() || v <= 0) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (const std::exception&) {
      usage(flag + " '" + s + "': '" + item + "' is not a positive integer");
    }
  }
  if (out.empty()) usage(flag + " is empty: give a comma-separated list of positive integers");
  return out;
}

std::vector<std::string> parse_word_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) if (!item.empty()) out.push_back(item);
  return out;
}

Device resolve_device(const std::string& spec) {
  Device d;
  try {
    d = Device::parse(spec);
  } catch (const Error&) {
    usage("--device '" + spec + "': expected cpu, cuda or cuda:N");
  }
  if (d.is_meta())
    usage("--device " + spec + ": the shape-only device computes nothing; minidl-memest and minidl-maxbatch dry-run "
          "on it by themselves (use cpu or cuda)");
  if (d.is_cuda()) {
    if (!cuda_built()) usage("--device " + spec + ": this build has no CUDA backend (rebuild with -DMINIDL_CUDA=ON)");
    const int n = cuda_device_count();
    if (n == 0) usage("--device " + spec + ": no CUDA device is visible (use --device cpu)");
    if (d.index >= n) usage("--device " + spec + ": only " + std::to_string(n) + " CUDA device(s) visible");
  }
  return d;
}

void apply_backend_switches(const TrainConfig& c, Device d) {
#ifdef MINIDL_WITH_CUDA
  if (d.target() == DeviceType::CUDA) cuda::set_cudnn_benchmark(c.cudnn_benchmark == "on");   // meta:cuda too
#else
  (void)c;
  (void)d;
#endif
}

void validate(const TrainConfig& c) {
  if (!known_models().count(c.model)) usage("--model '" + c.model + "': expected one of " + join(known_models()));
  if (c.image_size < 0) usage("--image-size must be > 0 (or 0 for the model's default)");
  if (c.image_size > 0 && c.image_size < (is_resnet(c.model) ? 16 : 4))
    usage("--image-size " + std::to_string(c.image_size) + " is too small for " + c.model);
  if (c.batch_size <= 0) usage("--batch-size must be > 0, got " + std::to_string(c.batch_size));
  if (c.world_size < 1) usage("the world size must be >= 1, got " + std::to_string(c.world_size));
  if (c.accumulation_steps <= 0) usage("--accumulation-steps must be >= 1, got " + std::to_string(c.accumulation_steps));
  if (c.optimizer != "sgd" && c.optimizer != "adam" && c.optimizer != "adamw")
    usage("--optimizer '" + c.optimizer + "': expected sgd, adam or adamw");
  if (c.lr < 0 || !std::isfinite(c.lr)) usage("--lr must be a finite number >= 0");
  if (c.momentum < 0 || c.momentum >= 1) usage("--momentum must be in [0, 1)");
  if (c.nesterov && c.momentum <= 0) usage("--nesterov needs --momentum > 0");
  try {
    optim::parse_lr_scaling(c.lr_scaling);
  } catch (const Error&) {
    usage("--lr-scaling '" + c.lr_scaling + "': expected none, linear or sqrt");
  }
  if (c.base_batch <= 0) usage("--base-batch must be > 0");
  if (c.warmup_steps < 0 || c.warmup_epochs < 0) usage("--warmup-steps and --warmup-epochs must be >= 0");
  if (c.batch_schedule_lr != "keep" && c.batch_schedule_lr != "linear" && c.batch_schedule_lr != "sqrt")
    usage("--batch-schedule-lr '" + c.batch_schedule_lr + "': expected keep, linear or sqrt");
  const BatchSchedule batches = BatchSchedule::parse(c.batch_schedule, c.batch_size);
  for (int64_t e = 0; e < c.epochs; ++e) batches.batch_at(e);   // throws past 2^31
  try {
    // Epoch units ("multistep:4e,8e:0.5") checked with 100 steps per epoch.
    optim::parse_schedule(resolve_epoch_units(c.schedule, [](double e) { return 100.0 * e; }, c.epochs, 0), 1000);
  } catch (const UsageError&) {
    throw;
  } catch (const Error& e) {
    usage("--schedule '" + c.schedule + "' is invalid: expected constant, step:SIZE:GAMMA, multistep:M1,M2:GAMMA "
          "or cosine[:MIN] (milestones and sizes in steps, or in epochs as 4e)");
  }
  if (c.epochs <= 0) usage("--epochs must be >= 1");
  if (c.max_steps < 0) usage("--max-steps must be >= 0");
  if (c.max_grad_norm < 0) usage("--max-grad-norm must be >= 0");
  if (!(c.amp_init_scale > 0) || !std::isfinite(c.amp_init_scale)) usage("--amp-init-scale must be > 0");
  if (c.amp_growth_interval < 1) usage("--amp-growth-interval must be >= 1");
  if (c.workers < 0) usage("--workers must be >= 0");
  if (c.normalize != "imagenet" && c.normalize != "unit")
    usage("--normalize '" + c.normalize + "': expected imagenet or unit");
  if (c.resize != "auto" && c.resize != "center" && c.resize != "imagenet" && c.resize != "squash" &&
      c.resize != "keras")
    usage("--resize '" + c.resize + "': expected auto, center, imagenet, squash or keras");
  if (c.augment != "none" && c.augment != "keras" && c.augment != "article" && c.augment != "rrc")
    usage("--augment '" + c.augment + "': expected none, keras, article or rrc");
  if (c.eps_mode != "torch" && c.eps_mode != "keras") usage("--eps-mode '" + c.eps_mode + "': expected torch or keras");
  if (c.cudnn_benchmark != "on" && c.cudnn_benchmark != "off")
    usage("--cudnn-benchmark '" + c.cudnn_benchmark + "': expected on or off");
  if (c.synthetic_size < 0) usage("--synthetic-size must be >= 0");
  if (c.synthetic_difficulty < 0 || c.synthetic_difficulty > 1) usage("--synthetic-difficulty must be in [0, 1]");
  if (c.target_accuracy < 0 || c.target_accuracy > 1) usage("--target-accuracy must be in [0, 1]");
  if (!(c.diverge_loss >= 0)) usage("--diverge-loss must be > 0 (or 0 for the optimizer's default)");
  if (c.progress_every < 0) usage("--progress-every must be >= 0");
  if (c.progress_seconds < 0) usage("--progress-seconds must be >= 0");
  parse_split(c.split);
  if (c.cuda_graphs) check_cuda_graphs(c);
  const CheckpointSpec ck = parse_checkpoint(c.checkpoint);
  if (ck.kind != CheckpointSpec::Kind::None && !is_resnet(c.model))
    usage("--checkpoint " + c.checkpoint + " needs a ResNet model (the small CNN has no stages to recompute)");
  if (!c.memory_budget.empty()) {
    try {
      if (parse_bytes(c.memory_budget) == 0) usage("--memory-budget must be > 0");
    } catch (const UsageError&) {
      throw;
    } catch (const Error&) {
      usage("--memory-budget '" + c.memory_budget + "': expected a size such as 11GiB, 512MiB or 1.5GB");
    }
  }
  if (c.validate_data && c.data == "synthetic")
    usage("--validate-data checks the files of a --data folder; the synthetic set has none");
  if (c.data != "synthetic") {
    std::error_code ec;
    if (std::filesystem::exists(c.data, ec) && !std::filesystem::is_directory(c.data, ec))
      usage("--data '" + c.data + "' is a file; give the folder that holds the class folders (or Kaggle's train/)");
    if (!std::filesystem::is_directory(c.data, ec)) usage("--data '" + c.data + "': no such folder");
    if (std::filesystem::is_empty(c.data, ec)) usage("--data '" + c.data + "': the folder is empty");
  }
  if (!c.save_initial_weights.empty() && !c.resume.empty())
    usage("--save-initial-weights with --resume: a resumed run has no initial weights (they are in the --resume "
          "file's history); drop one of the two");
  for (const auto* f : {&c.init_weights, &c.resume}) {
    if (!f->empty() && !std::filesystem::is_regular_file(*f))
      usage("'" + *f + "': no such file (--init-weights / --resume)");
  }
  if (c.gpu.empty()) {
    resolve_device(c.device);
  } else if (!cuda_built()) {   // a plan for a GPU needs the CUDA backend's kernels' answers, not a GPU
    usage("--gpu " + c.gpu + ": this build has no CUDA backend (rebuild with -DMINIDL_CUDA=ON)");
  }
}

std::string user_message(const std::exception& e, bool verbose) {
  const std::string msg = e.what();
  if (verbose) return msg;
  static const std::regex location(R"( \[[A-Za-z0-9_./+-]+\.(cpp|h|cu|cuh):[0-9]+\])");
  return std::regex_replace(msg, location, "");
}

int parse_command_line(CLI::App& app, int argc, const char* const* argv, const std::string& program) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::printf("%s", app.help("", CLI::AppFormatMode::All).c_str());
    return 0;
  } catch (const CLI::ConfigError& e) {
    // CLI11 says "INI was not able to parse KEY": name the key and the file instead.
    std::string file;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--config" && i + 1 < argc) file = argv[i + 1];
      else if (a.rfind("--config=", 0) == 0) file = a.substr(9);
    }
    std::string msg = e.what();
    const std::string prefix = "INI was not able to parse ";
    if (msg.rfind(prefix, 0) == 0)
      msg = "unknown key '" + msg.substr(prefix.size()) + "'; keys are the flags' long names without the dashes "
            "(batch-size = 64), see --help";
    std::fprintf(stderr, "%s: error: --config %s: %s\n", program.c_str(), file.c_str(), msg.c_str());
    return 2;
  } catch (const CLI::ParseError& e) {
    std::string msg = e.what();
    for (char& ch : msg) if (ch == '\n') ch = ' ';
    std::fprintf(stderr, "%s: error: %s (see --help)\n", program.c_str(), msg.c_str());
    return 2;
  }
  return -1;
}

}  // namespace minidl::harness
