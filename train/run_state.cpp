// Saving and reading back a run's progress for --save-weights / --resume (see run_state.h).
#include "train/run_state.h"

#include <algorithm>
#include <cstdio>
#include <exception>
#include <filesystem>

#include "core/generator.h"
#include "train/config.h"
#include "nn/safetensors.h"

namespace minidl::train {

namespace {

std::string exact(double v) {
  char b[40];
  std::snprintf(b, sizeof(b), "%.17g", v);
  return b;
}

}  // namespace

std::string optimizer_state_path(const std::string& weights) { return weights + ".optimizer.safetensors"; }

std::map<std::string, std::string> progress_metadata(const std::string& model, const Progress& p, int64_t steps) {
  return {{"model", model},
          {"epoch", std::to_string(p.epoch)},
          {"micro_batches", std::to_string(p.micro_batches)},
          {"batch_size", std::to_string(p.batch_size)},
          {"accumulation_steps", std::to_string(p.accumulation_steps)},
          {"scheduled_batch", std::to_string(p.scheduled_batch)},
          {"steps", std::to_string(steps)},
          {"best_val_acc", exact(p.best_val_acc)},
          {"best_epoch", std::to_string(p.best_epoch)},
          {"time_to_target", exact(p.time_to_target)},
          {"train_seconds", exact(p.train_seconds)},
          {"rng_seed", std::to_string(p.rng_seed)},
          {"rng_offset", std::to_string(p.rng_offset)},
          {"world_size", std::to_string(p.world_size)}};
}

// Files saved before these keys existed carry only "epoch" (and "steps"): a complete epoch.
Progress progress_from(const std::map<std::string, std::string>& meta, const std::string& path) {
  Progress p;
  const auto get = [&](const char* k) -> const std::string* {
    auto it = meta.find(k);
    return it == meta.end() ? nullptr : &it->second;
  };
  try {
    if (auto v = get("epoch")) p.epoch = std::stoll(*v);
    if (auto v = get("micro_batches")) p.micro_batches = std::stoll(*v);
    if (auto v = get("batch_size")) p.batch_size = std::stoll(*v);
    if (auto v = get("accumulation_steps")) p.accumulation_steps = std::stoll(*v);
    p.scheduled_batch = p.batch_size;
    if (auto v = get("scheduled_batch")) p.scheduled_batch = std::stoll(*v);
    if (auto v = get("best_val_acc")) p.best_val_acc = std::stod(*v);
    if (auto v = get("best_epoch")) p.best_epoch = std::stoll(*v);
    if (auto v = get("time_to_target")) p.time_to_target = std::stod(*v);
    if (auto v = get("train_seconds")) p.train_seconds = std::stod(*v);
    if (auto v = get("world_size")) p.world_size = std::stoll(*v);
    if (get("rng_seed") && get("rng_offset")) {
      p.rng_seed = std::stoull(*get("rng_seed"));
      p.rng_offset = std::stoull(*get("rng_offset"));
      p.has_rng = true;
    }
  } catch (const std::exception&) {
    throw UsageError("--resume " + path + ": its metadata is not what --save-weights writes");
  }
  return p;
}

nn::SafetensorsFile read_weights_file(const std::string& flag, const std::string& path) {
  try {
    return nn::load_safetensors(path);
  } catch (const Error& e) {
    throw RunInputError(flag + " " + path + ": not a weights file minidl can read: " + e.what());
  }
}

void load_weights(Model& m, const std::string& flag, const std::string& path, const nn::SafetensorsFile& file) {
  const nn::StateDictDiff diff = m.module->compare_state_dict(file.tensors);
  if (!diff.empty()) {
    const auto saved = file.metadata.find("model");
    throw RunInputError(flag + " " + path + " does not fit --model " + m.name +
                     (saved != file.metadata.end() ? " (it was saved from " + saved->second + ")" : "") + ": " +
                     diff.summary(3));
  }
  m.module->load_state_dict(file.tensors);
}

void load_optimizer_state(const TrainConfig& c, const std::map<std::string, std::string>& weights_meta,
                          optim::Optimizer& opt, optim::GradScaler& scaler,
                          const std::function<void(const std::string&)>& log) {
  const std::string path = optimizer_state_path(c.resume);
  if (!std::filesystem::exists(path)) return;
  const nn::SafetensorsFile file = read_weights_file("--resume", path);
  if (!file.metadata.empty() && file.metadata != weights_meta) {
    const auto steps = [](const std::map<std::string, std::string>& meta) {
      const auto it = meta.find("steps");
      return it == meta.end() ? std::string("?") : it->second;
    };
    throw RunInputError("--resume " + c.resume + " and " + path + " are from different saves (steps " +
                     steps(weights_meta) + " and " + steps(file.metadata) + "): the save was cut short between the "
                     "two files; resume from a complete pair");
  }
  const auto& state = file.tensors;
  const bool has_scaler =
      std::any_of(state.begin(), state.end(), [](const auto& kv) { return kv.first.rfind("scaler.", 0) == 0; });
  try {
    if (c.uses_grad_scaler() && !has_scaler) {
      // Saved without --amp (or by an older minidl): the optimizer continues, the scaler starts fresh.
      opt.load_state_dict(state);
      log("--resume: " + path + " has no gradient-scaler state; the loss scale starts at --amp-init-scale");
    } else {
      optim::load_training_state(opt, scaler, state);
    }
  } catch (const Error& e) {
    throw RunInputError("--resume " + c.resume + ": its optimizer state " + path + " does not fit --optimizer " +
                     c.optimizer + ": " + e.what());
  }
}

std::string resume_line(const TrainConfig& c, const Progress& saved, int64_t steps, int64_t first_epoch) {
  return "resumed from " + c.resume + ": " +
         (saved.micro_batches > 0
              ? "inside epoch " + std::to_string(saved.epoch) + " after micro-batch " + std::to_string(saved.micro_batches)
              : "after epoch " + std::to_string(saved.epoch)) +
         ", optimizer step " + std::to_string(steps) + "; " +
         (first_epoch > c.epochs ? "nothing left to train with --epochs " + std::to_string(c.epochs)
                                 : "continuing at epoch " + std::to_string(first_epoch));
}

void save_state(const std::string& path, Model& m, const optim::Optimizer& opt, const optim::GradScaler& scaler,
                const Progress& p, distributed::ProcessGroup* group) {
  // Model weights under torchvision's names (loadable by torchvision); optimizer and gradient
  // scaler ("scaler.*" keys, only with --amp) beside them, both with the same progress metadata.
  const bool lead = group == nullptr || group->rank() == 0;
  std::string failed;
  if (lead) {
    try {
      const auto meta = progress_metadata(m.name, p, opt.step_count());
      nn::save_safetensors(path, m.module->state_dict(), meta);
      nn::save_safetensors(optimizer_state_path(path), optim::training_state_dict(opt, scaler), meta);
    } catch (const Error& e) {
      if (group == nullptr) throw;
      failed = e.what();
    }
  }
  if (group && group->any(!failed.empty()))
    throw Error(lead ? failed : "rank 0 could not write --save-weights " + path);
}

ResumePoint resume_point(const TrainConfig& c, const std::map<std::string, std::string>& weights_meta,
                         const EpochBatches& batches, optim::Optimizer& opt, optim::GradScaler& scaler,
                         const std::function<void(const std::string&)>& log) {
  const Progress saved = progress_from(weights_meta, c.resume);
  load_optimizer_state(c, weights_meta, opt, scaler, log);
  if (saved.micro_batches > 0 && saved.world_size != c.world_size)
    throw UsageError("--resume " + c.resume + " stopped inside epoch " + std::to_string(saved.epoch) + " on " +
                     std::to_string(saved.world_size) + " rank(s); the epoch's shards depend on the number of "
                     "ranks: resume it with mpirun -np " + std::to_string(saved.world_size));
  const EpochBatch seb{saved.scheduled_batch, saved.batch_size, saved.accumulation_steps};
  const bool same_phase =
      saved.epoch >= 1 && saved.epoch <= c.epochs && batches.scheduled(saved.epoch) == seb.scheduled &&
      (seb.fell_back() ? seb.accumulation % c.accumulation_steps == 0 : seb.accumulation == c.accumulation_steps);
  if (saved.micro_batches > 0 && saved.epoch <= c.epochs && !same_phase)
    throw UsageError("--resume " + c.resume + " stopped inside epoch " + std::to_string(saved.epoch) +
                     " with batch " + std::to_string(saved.scheduled_batch) + " (micro-batch " +
                     std::to_string(saved.batch_size) + " x " + std::to_string(saved.accumulation_steps) +
                     " accumulation); resume it with the same --batch-size, --batch-schedule and "
                     "--accumulation-steps");
  if (saved.has_rng) {
    default_generator().manual_seed(saved.rng_seed);
    default_generator().set_offset(saved.rng_offset);
  }
  ResumePoint rp;
  rp.first_epoch = saved.micro_batches > 0 ? saved.epoch : saved.epoch + 1;
  rp.skip_micro = saved.micro_batches;
  if (same_phase && (saved.micro_batches > 0 ||
                     (rp.first_epoch <= c.epochs && batches.scheduled(rp.first_epoch) == seb.scheduled)))
    rp.batch = seb;
  rp.line = resume_line(c, saved, opt.step_count(), rp.first_epoch);
  Progress& p = rp.progress;   // what the session carries on; the rest is set as it trains
  p.epoch = saved.epoch;
  p.micro_batches = saved.micro_batches;
  p.best_val_acc = saved.best_val_acc;
  p.best_epoch = saved.best_epoch;
  p.time_to_target = saved.time_to_target;
  p.train_seconds = saved.train_seconds;
  return rp;
}

}  // namespace minidl::train
