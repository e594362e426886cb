// CUDA graphs' flags on any machine: the default, the flags parse, a run that cannot replay (data-parallel ranks) runs
// eagerly saying why, and --cuda-graphs off a CUDA device is refused before anything runs, with one
// line naming the flag and the fix. The replay itself: cuda_graphs_cuda_test.cpp.
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

// On by default with a CUDA device, where they fit (a capture out of memory falls back); off on any
// other device; --cuda-graphs (required: no fallback) and --no-cuda-graphs parse, and exclude each other.
TEST(ExperimentsCudaGraphs, FlagsParseAndGraphsAreOnByDefaultOnCuda) {
  const auto parsed = [](std::vector<const char*> argv) {
    TrainConfig c;
    CLI::App app;
    add_train_flags(app, c);
    argv.insert(argv.begin(), "prog");
    EXPECT_EQ(parse_command_line(app, static_cast<int>(argv.size()), argv.data(), "prog"), -1);
    return c;
  };
  EXPECT_FALSE(parsed({}).cuda_graphs.has_value());
  EXPECT_FALSE(parsed({}).resolved_cuda_graphs()) << "cpu";
  EXPECT_TRUE(parsed({}).cuda_graphs_fall_back());
  EXPECT_TRUE(parsed({"--device", "cuda"}).resolved_cuda_graphs());
  EXPECT_TRUE(parsed({"--device", "cuda"}).cuda_graphs_fall_back());
  EXPECT_TRUE(parsed({"--device", "cuda:1", "--accumulation-steps", "4", "--cuda-graphs"}).resolved_cuda_graphs());
  EXPECT_FALSE(parsed({"--device", "cuda", "--no-cuda-graphs"}).resolved_cuda_graphs());
  const TrainConfig asked = parsed({"--cuda-graphs", "--device", "cuda"});
  EXPECT_EQ(asked.cuda_graphs, std::optional<bool>(true));
  EXPECT_TRUE(asked.resolved_cuda_graphs());
  EXPECT_FALSE(asked.cuda_graphs_fall_back()) << "asked for: a capture out of memory is the run's OOM";
  // SGD, no accumulation or ranks: accepted (validate() itself would also look for a GPU).
  EXPECT_NO_THROW(check_cuda_graphs(asked));
  TrainConfig both;
  CLI::App app;
  add_train_flags(app, both);
  std::vector<const char*> argv{"prog", "--cuda-graphs", "--no-cuda-graphs"};
  EXPECT_NE(parse_command_line(app, static_cast<int>(argv.size()), argv.data(), "prog"), -1);
}

// What a replay still cannot do runs eagerly instead of refusing the run, with the reason.
TEST(ExperimentsCudaGraphs, DataParallelRunsFallBackToEagerSayingWhy) {
  TrainConfig c = graphed();
  c.world_size = 2;
  std::string why;
  EXPECT_FALSE(c.resolved_cuda_graphs(&why));
  EXPECT_NE(why.find("data-parallel steps (2 ranks) run eagerly"), std::string::npos) << why;
  EXPECT_NO_THROW(check_cuda_graphs(c));
  why = "stale";
  EXPECT_TRUE(graphed().resolved_cuda_graphs(&why));
  EXPECT_EQ(why, "");
}

// Their values live on the device (the optimizer's device state, clipping's device form), and an
// accumulation window replays as two graphs, so every optimizer, schedule, --max-grad-norm and
// --accumulation-steps replays.
TEST(ExperimentsCudaGraphs, EveryOptimizerScheduleClippingAndAccumulationIsAccepted) {
  for (const std::string opt : {"sgd", "adam", "adamw"}) {
    TrainConfig c = graphed();
    c.accumulation_steps = opt == "adam" ? 4 : 1;
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

TEST(ExperimentsCudaGraphs, CudaGraphsOffACudaDeviceAreRefusedNamingTheFlagAndTheFix) {
  struct Case {
    std::function<void(TrainConfig&)> set;
    std::string says, fix;
  };
  const std::vector<Case> cases{
      {[](TrainConfig& c) { c.device = "cpu"; }, "needs a CUDA device, got --device cpu", "use --device cuda"},
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
