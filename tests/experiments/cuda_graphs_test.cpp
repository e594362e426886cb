// --cuda-graphs on any machine: the flag parses, and every configuration whose step a CUDA graph
// cannot replay (it reads the host, or it is not on a CUDA device) is refused before anything runs,
// with one line naming the flag and the fix. The replay itself: cuda_graphs_cuda_test.cpp.
#include <CLI/CLI.hpp>

#include <functional>
#include <string>
#include <vector>

#include "train/config.h"
#include "train/graphed_step.h"
#include "experiments/harness/sweep.h"
#include "train/run.h"
#include "tests/experiments/helpers.h"

namespace minidl::harness {
namespace {

// The UsageError message of validate(c), or "" when it accepts c.
std::string refusal(const TrainConfig& c) {
  try {
    validate(c);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TrainConfig graphed() {
  TrainConfig c = testing::tiny_config();
  c.cuda_graphs = true;
  c.device = "cuda";
  return c;
}

TEST(ExperimentsCudaGraphs, FlagParsesAndIsOffByDefault) {
  TrainConfig c;
  EXPECT_FALSE(c.cuda_graphs);
  CLI::App app;
  add_train_flags(app, c);
  std::vector<const char*> argv{"prog", "--cuda-graphs", "--device", "cuda"};
  EXPECT_EQ(parse_command_line(app, static_cast<int>(argv.size()), argv.data(), "prog"), -1);
  EXPECT_TRUE(c.cuda_graphs);
  // SGD, no accumulation or ranks: accepted (validate() itself would also look for a GPU).
  EXPECT_NO_THROW(check_cuda_graphs(c));
}

// Their values live on the device (the optimizer's device state, clipping's device form), so
// every optimizer, schedule and --max-grad-norm replays.
TEST(ExperimentsCudaGraphs, EveryOptimizerScheduleAndClippingIsAccepted) {
  for (const std::string opt : {"sgd", "adam", "adamw"}) {
    TrainConfig c = graphed();
    c.optimizer = opt;
    c.nesterov = opt == "sgd";
    c.momentum = opt == "sgd" ? 0.9 : 0.0;
    c.max_grad_norm = 1.0;
    c.warmup_steps = 5;
    c.schedule = "cosine";
    SCOPED_TRACE(opt);
    EXPECT_NO_THROW(check_cuda_graphs(c));
  }
}

TEST(ExperimentsCudaGraphs, WhatAReplayCannotDoIsRefusedNamingTheFlagAndTheFix) {
  struct Case {
    std::function<void(TrainConfig&)> set;
    std::string says, fix;
  };
  const std::vector<Case> cases{
      {[](TrainConfig& c) { c.device = "cpu"; }, "needs a CUDA device, got --device cpu", "use --device cuda"},
      {[](TrainConfig& c) { c.accumulation_steps = 4; }, "--accumulation-steps 4", "use --accumulation-steps 1"},
      {[](TrainConfig& c) { c.world_size = 2; }, "data-parallel steps (2 ranks)", "run one process"},
  };
  for (const Case& k : cases) {
    TrainConfig c = graphed();
    k.set(c);
    const std::string what = refusal(c);
    SCOPED_TRACE(what);
    EXPECT_EQ(what.rfind("--cuda-graphs ", 0), 0u);
    EXPECT_NE(what.find(k.says), std::string::npos);
    EXPECT_NE(what.find(k.fix), std::string::npos);
    EXPECT_NE(what.find("or run without --cuda-graphs"), std::string::npos);
    c.cuda_graphs = false;
    if (c.device != "cpu") continue;
    EXPECT_EQ(refusal(c), "");   // the same configuration trains eagerly
  }
}

TEST(ExperimentsCudaGraphs, RunTrainingRefusesACpuRunBeforeTraining) {
  TrainConfig c = graphed();
  c.device = "cpu";
  std::string what;
  bool trained = false;
  try {
    run_training(c, {.log = {}, .on_epoch = {}, .on_step = [&](int64_t) { trained = true; }});
  } catch (const UsageError& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("--cuda-graphs needs a CUDA device"), std::string::npos) << what;
  EXPECT_FALSE(trained);
}

TEST(ExperimentsCudaGraphs, ASweepWithARunAReplayCannotDoIsRefusedBeforeItsFirstRun) {
  TrainConfig base = graphed();
  Study s = make_grid(base, {8}, {"sgd", "adam"}, {}, {});
  s.runs.at(1).config.device = "cpu";   // the second run cannot replay
  SweepOptions o;
  o.out = testing::temp_dir() / "grid";
  o.verbose = false;
  std::string what;
  try {
    run_sweep(s, o);
  } catch (const UsageError& e) {
    what = e.what();
  }
  EXPECT_NE(what.find("--cuda-graphs needs a CUDA device, got --device cpu"), std::string::npos) << what;
  EXPECT_NE(what.find("run "), std::string::npos) << what;
  EXPECT_FALSE(std::filesystem::exists(o.out / "results.csv"));   // the SGD run did not start either
}

}  // namespace
}  // namespace minidl::harness
