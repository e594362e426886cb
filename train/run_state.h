// The state --save-weights writes and --resume reads beside the tensors: where the optimizer file
// goes, and the run's progress as safetensors metadata (strings), so a resumed run continues
// exactly where the saved one stopped. Internal to the trainer (run.cpp).
#pragma once
#include <cstdint>
#include <functional>
#include <limits>
#include <map>
#include <optional>
#include <string>

#include "distributed/process_group.h"
#include "train/batch_schedule.h"
#include "train/config.h"
#include "train/model.h"
#include "nn/safetensors.h"
#include "optim/grad_scaler.h"
#include "optim/optimizer.h"

namespace minidl::train {

// What --resume needs beyond the tensors, kept as safetensors metadata (strings) in both files.
struct Progress {
  int64_t epoch = 0;            // the last epoch trained, fully or partly
  int64_t micro_batches = 0;    // micro-batches of `epoch` done; 0: the epoch is complete
  int64_t batch_size = 0;       // the plan of a partial epoch depends on these two (the micro-batch
  int64_t accumulation_steps = 0;  //   and accumulation used, after a batch schedule's fallback)
  int64_t scheduled_batch = 0;  // the batch the schedule asked for in `epoch` (0: batch_size)
  // The best validation accuracy (NaN: none yet) and its epoch, over complete epochs only (a
  // partial epoch's evaluation is not one the uninterrupted run would have made).
  double best_val_acc = std::numeric_limits<double>::quiet_NaN();
  int64_t best_epoch = 0;
  double time_to_target = -1.0;
  double train_seconds = 0.0;   // training time of every session so far
  uint64_t rng_seed = 0;        // the default generator (dropout draws), as checkpoint() replays it
  uint64_t rng_offset = 0;
  bool has_rng = false;
  int64_t world_size = 1;       // the ranks that trained it (a partial epoch's shards depend on it)
};

// The optimizer + gradient-scaler file saved beside the weights file.
std::string optimizer_state_path(const std::string& weights);

// The metadata both files carry, and its reading back (older files carry only "epoch" and
// "steps"); a malformed value is a UsageError naming the file.
std::map<std::string, std::string> progress_metadata(const std::string& model, const Progress& p, int64_t steps);
Progress progress_from(const std::map<std::string, std::string>& meta, const std::string& path);

// The tensors and metadata of the weights file given to `flag` (--resume, --init-weights): a file
// that is missing or not safetensors (random bytes, truncated) is a UsageError naming both.
nn::SafetensorsFile read_weights_file(const std::string& flag, const std::string& path);
// Loads `file` into m. A file of another model or with other shapes is a UsageError of one short
// line: the counts of missing, unexpected and mismatched tensors with the first three of each.
void load_weights(Model& m, const std::string& flag, const std::string& path, const nn::SafetensorsFile& file);

// The optimizer and gradient-scaler state saved beside the --resume file (whose metadata is
// `weights_meta`), loaded into opt and scaler when that file exists. A file of another --optimizer, or from another save than the
// weights (their progress metadata differ: a save cut short between the two files), is a
// UsageError; a file without scaler state for an --amp run starts the scaler afresh (said in `log`).
void load_optimizer_state(const TrainConfig& c, const std::map<std::string, std::string>& weights_meta,
                          optim::Optimizer& opt,
                          optim::GradScaler& scaler, const std::function<void(const std::string&)>& log);
// Where a resumed run continues. From the --resume file's metadata: the optimizer and scaler
// state loaded beside it, the default generator restored, and the checks that the saved partial
// epoch can be continued (same ranks; same batch-schedule phase, micro-batch and accumulation),
// each a UsageError naming the flags to change.
struct ResumePoint {
  Progress progress;         // epoch, micro-batches and the best-so-far figures of the saved run
  int64_t first_epoch = 1;   // the first epoch this session trains
  int64_t skip_micro = 0;    // micro-batches of first_epoch done before the resume
  // The saved epoch's micro-batch and accumulation, for the resumed epoch when it continues the
  // same phase of the batch schedule (the uninterrupted run would not have tried it again).
  std::optional<EpochBatch> batch;
  std::string line;          // the log's line on where the run continues (resume_line)
};
ResumePoint resume_point(const TrainConfig& c, const std::map<std::string, std::string>& weights_meta,
                         const EpochBatches& batches, optim::Optimizer& opt, optim::GradScaler& scaler,
                         const std::function<void(const std::string&)>& log);

// The log's line on where a resumed run continues: "resumed from FILE: inside epoch 2 after
// micro-batch 2, optimizer step 6; continuing at epoch 2" (or "... nothing left to train ...").
std::string resume_line(const TrainConfig& c, const Progress& saved, int64_t steps, int64_t first_epoch);

// Writes the model's weights (torchvision's names) to path and the optimizer and scaler state
// beside it, both with the progress metadata. With a group, rank 0 writes and the ranks then agree
// whether it did: the files are complete when any rank goes on (a sweep's next run, a resume), and
// a failed write (a full disk) throws on every rank instead of leaving the others waiting.
void save_state(const std::string& path, Model& m, const optim::Optimizer& opt, const optim::GradScaler& scaler,
                const Progress& p, distributed::ProcessGroup* group = nullptr);

}  // namespace minidl::train
