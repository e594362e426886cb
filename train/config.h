// The configuration of one training run, shared by every experiment program and by programs that
// embed the trainer: specs that each register their flags (CLI11, also readable from --config FILE)
// and validate them, so minidl-train, minidl-maxbatch, minidl-sweep and minidl-memest accept the
// same spelling (train/specs.cpp).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/dtype.h"
#include "core/error.h"

namespace CLI {
class App;
}

namespace minidl::train {

// Bad user input: the programs print its message on one line and exit with status 2.
class UsageError : public Error {
 public:
  explicit UsageError(const std::string& msg) : Error(msg) {}
};

// Bad input that concerns one run, not the whole command (an --init-weights or --resume file of
// another model, or not safetensors): status 2 in minidl-train, an `error` row in a sweep (whose
// other runs may not use that file), where any other UsageError ends the sweep.
class RunInputError : public UsageError {
 public:
  explicit RunInputError(const std::string& msg) : UsageError(msg) {}
};

// The default --split: the Keras study's counts per class, and the same proportions as fractions,
// which the default falls back to on a folder with fewer than 1,000 usable images in a class.
inline constexpr const char* kDefaultSplit = "600,200,200";
inline constexpr const char* kDefaultSplitFractions = "0.6,0.2,0.2";
// The default --diverge-loss of each optimizer. Adam's first steps through the small CNN's
// 320,000-wide dense layer reach losses of 34-123 on the photos and recover within the first
// epoch (the keras-batch study, docs/experiments.md), so its limit only catches a loss that has
// left any recoverable range; SGD's losses stay far below 50 unless the run is lost.
inline constexpr double kSgdDivergeLoss = 50.0;
inline constexpr double kAdamDivergeLoss = 1e4;

// The configuration is composed of specs, one per concern. Each owns its fields (with their
// defaults), registers its flags and validates what it can check alone; TrainConfig joins them and
// checks what concerns several (a checkpoint mode needs a ResNet, CUDA graphs need SGD on a GPU).
// The fields stay reachable by name on a TrainConfig (c.batch_size), as the programs' flags are.

// What is trained: --model, --image-size.
struct ModelSpec {
  std::string model = "smallcnn";  // smallcnn | resnet18 | resnet34 | resnet50 | resnet18-small | ...
  int64_t image_size = 0;          // 0: the model's default (smallcnn 200, resnet 224, *-small 32)
  // A ResNet's convolutions carry its batch norms (ResNetOptions::conv_bn_chain, docs/conv_bn.md).
  bool conv_bn_chain = false;

  void add_flags(CLI::App& app);
  void validate() const;
  int64_t resolved_image_size() const;
};

// What it is trained on: --data, the split, decoding, augmentation and the loader.
struct DataSpec {
  std::string data = "synthetic";  // "synthetic" or a folder (class folders, Kaggle train/, PetImages)
  int64_t synthetic_size = 0;      // synthetic images per class in total; 0: what the split needs
  double synthetic_difficulty = 0.6;
  std::string split = kDefaultSplit;  // train,val,test per class (integers) or fractions (0.8,0.1,0.1)
  // --split was given (on the command line or in --config): a split that does not fit the folder is
  // refused. Unset, the default counts fall back to kDefaultSplitFractions on a folder too small for them.
  bool split_given = false;
  std::string manifest;               // write (or, when it exists, read) the split here
  bool validate_data = false;         // decode every file before the split; leave unreadable ones out
  std::string augment = "none";       // none | keras | article | rrc
  std::string resize = "auto";        // auto | center | imagenet | squash | keras (docs/data.md, "Resizing")
  std::string normalize = "imagenet"; // imagenet (mean/std) | unit (pixels / 255, as Keras rescale)
  bool no_shuffle = false;
  int workers = 2;
  // The loaders keep each image as decoded and resized (before augmentation's random draws) in
  // host memory, up to this many bytes over the run's parts: a file is decoded once, not every
  // epoch. The batches are the same bit for bit. "0": off.
  std::string data_cache = "4GiB";

  void add_flags(CLI::App& app);
  void validate() const;
};

// How it is optimised: the batch (and its schedule), the optimizer, learning rate and schedule.
struct OptimizerSpec {
  int64_t batch_size = 32;
  int64_t accumulation_steps = 1;
  std::string batch_schedule;      // "32@0,64@5" or "x2@every:5" (batch_schedule.h); empty: a fixed batch
  std::string batch_schedule_lr = "keep";  // keep | linear | sqrt: the lr at each scheduled batch change
  std::string optimizer = "sgd";   // sgd | adam | adamw
  double lr = 0.0;                 // 0: the optimizer's default (sgd 0.01, adam/adamw 0.001)
  double momentum = 0.0;
  bool nesterov = false;
  double weight_decay = -1.0;      // < 0: the optimizer's default (0; adamw 0.01)
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  std::string eps_mode = "torch";  // torch | keras: where Adam adds eps (optim/adam.h, keras_eps)
  double max_grad_norm = 0.0;
  std::string lr_scaling = "none";  // none | linear | sqrt
  int64_t base_batch = 32;
  int64_t warmup_steps = 0;
  double warmup_epochs = 0.0;
  std::string schedule = "constant";

  void add_flags(CLI::App& app);
  void validate() const;
  double resolved_lr() const;            // before batch scaling
  double resolved_weight_decay() const;
};

// What the memory a step needs is traded for: mixed precision, recomputation, the budget.
struct MemorySpec {
  bool amp = false;
  // With --amp: the autocast dtype, "f16" (dynamic loss scaling) or "bf16" (no scaler: f32's range).
  std::string amp_dtype = "f16";
  double amp_init_scale = 65536.0;  // the gradient scaler's first scale (PyTorch's default 2^16)
  int64_t amp_growth_interval = 2000;  // clean steps before the scale doubles (PyTorch's default)
  std::string checkpoint = "none";  // none | stages | sequential:N | optimal
  std::string memory_budget;        // "11GiB"; empty: none
  // The CUDA caching allocator grows one address range page by page (kernels/caching_allocator.h).
  bool expandable_segments = false;

  void add_flags(CLI::App& app);
  void validate() const;
  DType resolved_amp_dtype() const;   // f16 or bf16 (meaningful with amp)
  bool uses_grad_scaler() const { return amp && amp_dtype == "f16"; }
};

// Where it runs and with which device switches.
struct DeviceSpec {
  std::string device = "cpu";
  std::string cudnn_benchmark = "on";
  // Weights and batches in channels-last memory (NHWC): --channels-last / --no-channels-last; unset,
  // on for CUDA + AMP (TrainConfig::resolved_channels_last()).
  std::optional<bool> channels_last;
  // Replay each step from a CUDA graph (graphed_step.h): --cuda-graphs (graphs required) /
  // --no-cuda-graphs; unset, graphs where they fit on a CUDA device (TrainConfig::resolved_cuda_graphs()).
  std::optional<bool> cuda_graphs;
  // minidl-memest and minidl-maxbatch only: plan for this GPU (gpu_plan.h) with the dry run alone,
  // on any machine; empty: the configured device itself.
  std::string gpu;

  void add_flags(CLI::App& app);
  void validate() const;
};

// How long it runs, what it reads and writes, and what it prints.
struct RunSpec {
  int64_t epochs = 5;
  int64_t max_steps = 0;           // optimizer steps; 0: no limit
  uint64_t seed = 0;
  std::string init_weights;
  std::string save_weights;
  std::string save_initial_weights; // the model as initialised (after --init-weights), before any step
  std::string resume;               // a file written by --save-weights (model + optimizer)
  bool summary = false;
  std::string out;                  // folder for metrics.csv and results.json; empty: none
  double diverge_loss = 0.0;        // a training loss above this (or NaN) marks the run diverged; 0: the
                                    // optimizer's default (TrainConfig::resolved_diverge_loss)
  double target_accuracy = 0.0;     // > 0: record the time to reach this validation accuracy
  int64_t progress_every = 20;      // steps between progress lines; 0: per epoch only
  double progress_seconds = 15.0;   // also a line when this long passed since the last one; 0: off
  bool quiet = false;
  bool verbose = false;             // error lines keep the source location of the failed check

  void add_flags(CLI::App& app);
  void validate() const;
};

struct TrainConfig : ModelSpec, DataSpec, OptimizerSpec, MemorySpec, DeviceSpec, RunSpec {
  // Not a flag: the batch is a memory bound rather than a request (minidl-sweep's runs at the max-batch
  // finder's recommendation), so one larger than the training set trains on the whole set instead of
  // being refused.
  bool batch_up_to_data = false;
  // Not a flag: the processes training together (mpirun -np N, or MINIDL_WORLD_SIZE), set by the
  // programs from distributed::world(); each trains batch_size images per micro-batch on its own shard.
  int64_t world_size = 1;

  // Every spec's flags, in the order --help lists them.
  void add_flags(CLI::App& app);
  // Every spec's checks, then those that join several; throws UsageError naming the flag.
  void validate() const;

  // Resolved values (after validate()).
  // diverge_loss when set, else the optimizer's: sgd kSgdDivergeLoss, adam/adamw kAdamDivergeLoss.
  double resolved_diverge_loss() const;
  // channels_last when set, else the default: on for a CUDA device with --amp (cuDNN's f16 convolutions
  // run channels-last; docs/experiments.md says what was measured), off otherwise.
  bool resolved_channels_last() const;
  // Whether the steps replay CUDA graphs: on a CUDA device unless --no-cuda-graphs (off on any other
  // device); off, with the reason in `why` (when given), for a run that would replay but cannot:
  // data-parallel ranks (their gradient allreduce and agreed decisions run on the host).
  bool resolved_cuda_graphs(std::string* why = nullptr) const;
  // Unset (the default): a capture that runs out of memory, or fails otherwise, falls back to eager
  // steps for its batch shape (GraphedStep::fall_back_when_a_capture_fails), so graphs never lower the
  // largest batch that trains. --cuda-graphs: graphs are required, and a capture out of memory is
  // the run's OOM (any other capture error ends the run too).
  bool cuda_graphs_fall_back() const { return !cuda_graphs.has_value(); }
  // Images per optimizer step over all ranks: per-device batch x world size x accumulation.
  int64_t effective_batch() const { return batch_size * world_size * accumulation_steps; }
  double scaled_lr() const;              // resolved_lr with --lr-scaling applied
};

// Registers every TrainConfig flag on `app` with its default in the help text (c.add_flags).
void add_train_flags(CLI::App& app, TrainConfig& c);
// Adds --config FILE (TOML or INI; flags given on the command line win) and the usual help.
void add_config_flag(CLI::App& app);

// Throws UsageError naming the flag, the value and what is accepted (c.validate()).
void validate(const TrainConfig& c);
// The device after validation: throws UsageError for cuda without a GPU or without CUDA support.
Device resolve_device(const std::string& spec);
// Applies the backend switches of a configuration (--cudnn-benchmark, --expandable-segments) for its
// device, a GPU or meta:cuda; on the CPU, refuses --expandable-segments (UsageError).
void apply_backend_switches(const TrainConfig& c, Device d);

struct SplitSpec {
  bool counts = true;               // per-class counts, else fractions
  std::vector<double> parts;        // train, val, test
};
SplitSpec parse_split(const std::string& s);

struct CheckpointSpec {
  enum class Kind { None, Stages, Sequential, Optimal } kind = Kind::None;
  int segments = 0;                 // sequential:N
};
CheckpointSpec parse_checkpoint(const std::string& s);

std::vector<int64_t> parse_int_list(const std::string& flag, const std::string& s);
std::vector<std::string> parse_word_list(const std::string& s);

// An error's message for a user's line: without `verbose`, the " [data/split.cpp:49]" source
// locations that MINIDL_CHECK appends are removed (kept with --verbose, for a bug report).
std::string user_message(const std::exception& e, bool verbose);

// Parses argv into `app`. Returns -1 to go on, 0 after printing --help, 2 after printing one line
// "<program>: error: ..." for a parse error.
int parse_command_line(CLI::App& app, int argc, const char* const* argv, const std::string& program);

}  // namespace minidl::train
