// minidl-train's loop on the emulated device or a GPU, run whole by the tests of CUDA graphs
// (cuda_graphs_cuda_test.cpp, cuda_graphs_fallback_cuda_test.cpp): the small CNN's configurations
// they share, a run that keeps what its log, epochs and saved files say, and the byte-for-byte
// comparison of saved tensors that "bit-identical to eager" means.
#pragma once
#include <cstdint>
#include <cstring>
#include <map>
#include <optional>
#include <regex>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "core/ops.h"
#include "nn/safetensors.h"
#include "train/run.h"
#include "tests/experiments/helpers.h"

namespace minidl::harness {

struct TrainingRun {
  std::vector<EpochMetrics> epochs;
  std::vector<std::string> progress;   // "step S/T  loss L  acc A" of every progress line
  std::string graph_line;              // the "CUDA graphs: N micro-batches replayed ..." summary
  std::vector<std::string> fallbacks;   // the lines of captures that fell back to eager steps
  RunResult result;
  std::map<std::string, Tensor> weights;
  std::map<std::string, Tensor> optimizer;   // the optimizer's and the scaler's saved state
};

// SGD with momentum and weight decay, a step schedule, batch 4 of 18 images (a partial last batch).
inline TrainConfig sgd_config(bool amp, double init_scale = 1024) {
  TrainConfig c = testing::tiny_config();
  c.image_size = 16;
  c.split = "9,2,2";   // 18 training images: 4 batches of 4 and a partial one of 2 per epoch
  c.batch_size = 4;
  c.epochs = 2;
  c.device = "cuda";
  c.momentum = 0.9;
  c.weight_decay = 1e-4;
  c.lr = 0.05;
  c.schedule = "step:3:0.5";   // a new rate at steps 3, 6, 9: the graph is captured again
  c.amp = amp;
  c.amp_init_scale = init_scale;   // 1024: no overflow (a skipped replay would still count as a step)
  c.workers = 0;
  c.quiet = false;
  c.progress_every = 1;
  c.progress_seconds = 0;
  return c;
}

// Adam with warmup + cosine (a new rate every step) and clipping, 3 epochs.
inline TrainConfig adam_config(bool amp, double init_scale = 1024) {
  TrainConfig c = sgd_config(amp, init_scale);
  c.optimizer = "adam";
  c.momentum = 0.0;
  c.lr = 2e-3;
  c.epochs = 3;
  c.warmup_steps = 3;
  c.schedule = "cosine";
  c.max_grad_norm = 0.5;
  return c;
}

// `graphs`: --cuda-graphs (true), --no-cuda-graphs (false), or neither (the default: graphs where they fit).
inline TrainingRun train(TrainConfig c, std::optional<bool> graphs, const std::string& dir, const RunHooks& extra = {},
                  const std::string& name = "") {
  c.cuda_graphs = graphs;
  const std::string mode = !graphs ? "default" : *graphs ? "graphed" : "eager";
  if (c.save_weights.empty()) c.save_weights = dir + "/" + (name.empty() ? mode : name) + ".safetensors";
  TrainingRun r;
  static const std::regex step_loss(R"(step \d+/\d+  loss \S+  acc \S+)");
  RunHooks hooks;
  hooks.log = [&](const std::string& line) {
    std::smatch m;
    if (std::regex_search(line, m, step_loss)) r.progress.push_back(m.str());
    if (line.rfind("CUDA graphs: ", 0) == 0 && line.find("replayed from") != std::string::npos) r.graph_line = line;
    if (line.find("eagerly from here") != std::string::npos) r.fallbacks.push_back(line);
  };
  hooks.on_epoch = [&](const EpochMetrics& em) { r.epochs.push_back(em); };
  hooks.on_step = extra.on_step;
  r.result = run_training(c, hooks);
  r.weights = nn::load_safetensors(c.save_weights).tensors;
  r.optimizer = nn::load_safetensors(c.save_weights + ".optimizer.safetensors").tensors;
  return r;
}

// `zero_sign`: false reads -0.0 as +0.0 (f32 tensors).
inline std::vector<uint8_t> bytes_of(const Tensor& t, bool zero_sign = true) {
  Tensor h = t.to(Device::cpu()).contiguous();
  if (!zero_sign && h.dtype() == DType::f32) {
    h = h.clone();
    float* v = h.data<float>();
    for (int64_t i = 0; i < h.numel(); ++i)
      if (v[i] == 0.0F) v[i] = 0.0F;
  }
  std::vector<uint8_t> b(h.nbytes());
  std::memcpy(b.data(), h.data_ptr(), b.size());
  return b;
}

// Every tensor of two saved maps, byte for byte (with `zero_sign` false, but for the sign of zeros:
// the kept gradients of a graphed accumulation window start at +0.0, and 0.0 + -0.0 is +0.0).
inline void expect_same_tensors(const std::map<std::string, Tensor>& a, const std::map<std::string, Tensor>& b,
                         const std::string& what, bool zero_sign = true) {
  ASSERT_EQ(a.size(), b.size()) << what;
  for (const auto& [name, t] : a) {
    ASSERT_TRUE(b.count(name)) << what << ": " << name;
    EXPECT_EQ(bytes_of(b.at(name), zero_sign), bytes_of(t, zero_sign)) << what << ": " << name;
  }
}

}  // namespace minidl::harness
