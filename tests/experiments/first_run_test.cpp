// Issue 49, "the first run on one's own folder": what a newcomer's first runs met. The default
// split refused any folder under 1,000 images a class; Adam on photos stopped as "diverged" at
// step 1 under the default limit; an epoch cut by out of memory was printed as "done"; the last
// line did not say an accuracy was at chance; a batch larger than the training set was accepted;
// a killed save left its temporary file for good; and the programs' OpenMP threads spun on a busy
// machine. Each case runs minidl-train (or the loop) on tiny inputs.
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "core/allocator.h"
#include "experiments/harness/results.h"
#include "experiments/harness/sweep.h"
#include "train/run.h"
#include "tests/data/fixtures.h"
#include "tests/experiments/helpers.h"

namespace minidl::harness {
namespace {

namespace fs = std::filesystem;
using namespace data::fixtures;   // the JPEG files and shared photos of tests/data/fixtures.h

using testing::Outcome;
using testing::run_program;

bool built(const std::string& program) { return fs::exists(testing::program(program)); }

// A folder of two classes of n small JPEGs each: far below the default split's 1,000 a class.
fs::path small_folder(int n) {
  const fs::path dir = testing::temp_dir() / "pets";
  for (const char* cls : {"cat", "dog"}) {
    fs::create_directories(dir / cls);
    for (int i = 1; i <= n; ++i)
      write_bytes(dir / cls / (std::string(cls) + "." + std::to_string(i) + ".jpg"),
                  encode_jpeg(pattern(40, 40, i + (cls[0] == 'd' ? 1000 : 0))));
  }
  return dir;
}

const std::string kModel = "--model smallcnn --image-size 8 --workers 0";
const std::string kTiny = kModel + " --epochs 1 --batch-size 8";

TEST(ExperimentsFirstRun, TheDefaultSplitFallsBackToFractionsOnASmallFolder) {
  if (!built("minidl-train")) GTEST_SKIP() << "minidl-train is not built";
  const fs::path dir = small_folder(30);
  const Outcome o = run_program("minidl-train", kTiny + " --data " + dir.string());
  ASSERT_EQ(o.status, 0) << o.output;
  const size_t note = o.output.find("--split: '" + dir.string() + "' has 30 cat / 30 dog usable images, fewer than "
                                    "600+200+200 per class: using fractions 0.6,0.2,0.2");
  ASSERT_NE(note, std::string::npos) << o.output;
  EXPECT_LT(note, o.output.find("smallcnn (")) << "the note comes before the run's first line: " << o.output;
  EXPECT_NE(o.output.find("36 train / 12 val / 12 test"), std::string::npos) << o.output;
}

TEST(ExperimentsFirstRun, AnExplicitSplitThatDoesNotFitSuggestsFractions) {
  if (!built("minidl-train")) GTEST_SKIP() << "minidl-train is not built";
  const fs::path dir = small_folder(30);
  const fs::path cfg = dir.parent_path() / "run.toml";
  std::ofstream(cfg) << "split = \"600,200,200\"\n";
  for (const std::string& given : {std::string("--split 600,200,200"), "--config " + cfg.string()}) {
    const Outcome o = run_program("minidl-train", kTiny + " --data " + dir.string() + " " + given);
    EXPECT_EQ(o.status, 2) << given << ": " << o.output;
    EXPECT_NE(o.output.find("--split 600,200,200 does not fit"), std::string::npos) << o.output;
    EXPECT_NE(o.output.find("fractions fit any folder, e.g. --split 0.6,0.2,0.2"), std::string::npos) << o.output;
  }
}

TEST(ExperimentsFirstRun, SyntheticDataKeepsTheDefaultCounts) {
  TrainConfig c = testing::tiny_config();
  c.split = TrainConfig{}.split;
  c.max_steps = 1;
  const RunResult r = run_training(c, {[](const std::string&) {}, {}, {}});
  EXPECT_NE(r.data_description.find("1200 train / 400 val / 400 test"), std::string::npos) << r.data_description;
  EXPECT_EQ(r.split, "600,200,200");
}

TEST(ExperimentsFirstRun, AdamGetsARoomierDivergenceLimit) {
  TrainConfig c;
  EXPECT_EQ(c.resolved_diverge_loss(), kSgdDivergeLoss);
  c.optimizer = "adam";
  EXPECT_EQ(c.resolved_diverge_loss(), kAdamDivergeLoss);
  c.optimizer = "adamw";
  EXPECT_EQ(c.resolved_diverge_loss(), kAdamDivergeLoss);
  c.diverge_loss = 7.0;
  EXPECT_EQ(c.resolved_diverge_loss(), 7.0);
  // The photos: Adam's second batch at 128 px reaches a loss of 54.8 (the old default stopped it).
  const fs::path photos = shared_photos();
  if (photos.empty() || !built("minidl-train")) GTEST_SKIP() << "the shared photos or minidl-train are missing";
  const Outcome o = run_program("minidl-train", "--data " + photos.string() + " --optimizer adam --image-size 128 "
                                                "--split 100,0,0 --epochs 1 --max-steps 3 --workers 0 --quiet");
  EXPECT_EQ(o.status, 0) << o.output;
  EXPECT_NE(o.output.find("smallcnn: ok; 3 steps"), std::string::npos) << o.output;
}

TEST(ExperimentsFirstRun, ADivergedNoteNamesTheLimitAndTheFlag) {
  TrainConfig c = testing::tiny_config();
  c.diverge_loss = 0.01;
  const RunResult r = run_training(c, {[](const std::string&) {}, {}, {}});
  ASSERT_EQ(r.status, "diverged");
  EXPECT_NE(r.note.find("above --diverge-loss 0.01; if it would recover, give a higher --diverge-loss"),
            std::string::npos) << r.note;
}

TEST(ExperimentsFirstRun, AnEpochCutByOutOfMemoryIsNotReportedDone) {
  // Budgets from the one where the first forward fails to the one where the epoch fits: in
  // between, the first forward fits and its backward does not (the epoch has a line, no step).
  int cut_lines = 0;
  for (int mib = 16; mib <= 40; mib += 2) {
    TrainConfig c = testing::tiny_config();
    c.image_size = 32;
    c.batch_size = 64;
    c.split = "64,8,8";
    c.memory_budget = std::to_string(mib) + "MiB";
    std::vector<std::string> lines;
    const RunResult r = run_training(c, {[&](const std::string& s) { lines.push_back(s); }, {}, {}});
    for (const std::string& l : lines) {
      if (l.rfind("epoch 1/1 ", 0) != 0) continue;
      if (r.status == "oom") {
        EXPECT_EQ(l.find("done"), std::string::npos) << mib << " MiB: " << l;
        EXPECT_EQ(l.rfind("epoch 1/1 out of memory in step 1: ", 0), 0u) << mib << " MiB: " << l;
        ++cut_lines;
      } else {
        EXPECT_EQ(l.rfind("epoch 1/1 done: ", 0), 0u) << l;
      }
    }
  }
  EXPECT_GT(cut_lines, 0) << "no budget let the forward fit and not the backward";
}

TEST(ExperimentsFirstRun, TheLastLineMarksAccuraciesAtChance) {
  EXPECT_TRUE(at_chance(0.5, 400));
  EXPECT_TRUE(at_chance(0.45, 400));    // band: 2 x sqrt(0.25 / 400) = 5 points
  EXPECT_FALSE(at_chance(0.56, 400));
  EXPECT_FALSE(at_chance(std::numeric_limits<double>::quiet_NaN(), 400));
  EXPECT_EQ(accuracy_cell("0.5125", 400), "0.5125 (chance)");   // summary.md: the same rule
  if (!built("minidl-train")) GTEST_SKIP() << "minidl-train is not built";
  // No step: the untrained model on 16 + 16 images (band 25 points) is at chance.
  const Outcome o = run_program("minidl-train", kTiny + " --split 16,8,8 --max-steps 1 --lr 1e-9 --quiet");
  ASSERT_EQ(o.status, 0) << o.output;
  EXPECT_NE(o.output.find("(epoch 1, chance), test acc "), std::string::npos) << o.output;
  EXPECT_NE(o.output.find("% (chance), "), std::string::npos) << o.output;
}

TEST(ExperimentsFirstRun, ABatchLargerThanTheTrainingSetIsRefused) {
  TrainConfig c = testing::tiny_config();   // 32 training images
  c.batch_size = 33;
  EXPECT_THROW(run_training(c, {[](const std::string&) {}, {}, {}}), RunInputError);
  c.batch_up_to_data = true;   // the sweep's runs at the max-batch finder's answer: a bound, not a request
  const RunResult whole = run_training(c, {[](const std::string&) {}, {}, {}});
  EXPECT_EQ(whole.status, "ok");
  ASSERT_EQ(whole.epochs.size(), 1u);
  EXPECT_EQ(whole.epochs[0].batch_size, 32);
  c.batch_up_to_data = false;
  c.batch_size = 32;
  EXPECT_EQ(run_training(c, {[](const std::string&) {}, {}, {}}).status, "ok");
  if (!built("minidl-train")) GTEST_SKIP() << "minidl-train is not built";
  Outcome o = run_program("minidl-train", kModel + " --epochs 1 --split 16,8,8 --batch-size 99999999999");
  EXPECT_EQ(o.status, 2) << o.output;
  EXPECT_NE(o.output.find("minidl-train: error: --batch-size 99999999999 is larger than the training set (32 "
                          "images): use a batch of at most 32, or a --split with more training images"),
            std::string::npos) << o.output;
  o = run_program("minidl-train", kModel + " --split 16,8,8 --epochs 2 --batch-size 8 --batch-schedule 8@0,64@1");
  EXPECT_EQ(o.status, 2) << o.output;
  EXPECT_NE(o.output.find("--batch-schedule 8@0,64@1: batch 64 at epoch 2 is larger than the training set"),
            std::string::npos) << o.output;
  // A sweep: the batch that does not fit is an error row, the others run.
  if (!built("minidl-sweep")) GTEST_SKIP() << "minidl-sweep is not built";
  const fs::path out = testing::temp_dir() / "sweep";
  o = run_program("minidl-sweep", kModel + " --epochs 1 --split 16,8,8 --batch-sizes 8,64 --optimizers sgd --quiet --out " + out.string());
  EXPECT_EQ(o.status, 0) << o.output;
  std::ifstream csv(out / "grid" / "results.csv");
  const std::string table((std::istreambuf_iterator<char>(csv)), std::istreambuf_iterator<char>());
  EXPECT_NE(table.find("b8-sgd-none-none,grid"), std::string::npos) << table;
  EXPECT_NE(table.find(",error,\"--batch-size 64 is larger than the training set (32 images)"), std::string::npos)
      << table;
}

// The programs wait passively unless told otherwise: libgomp reads OMP_WAIT_POLICY before main(),
// so the program sets it and runs itself again, which its environment shows (/proc/PID/environ).
std::string environment_seen(const std::vector<std::string>& set) {
  const std::string prog = testing::program("minidl-train").string();
  std::vector<std::string> env_strings;
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string kv = *e;
    if (kv.rfind("OMP_WAIT_POLICY=", 0) != 0 && kv.rfind("GOMP_SPINCOUNT=", 0) != 0) env_strings.push_back(kv);
  }
  env_strings.insert(env_strings.end(), set.begin(), set.end());
  std::vector<char*> envp;
  for (std::string& kv : env_strings) envp.push_back(kv.data());
  envp.push_back(nullptr);
  // A run long enough to be looked at; the parent kills it.
  const std::vector<std::string> args{prog, "--model", "smallcnn", "--image-size", "8", "--workers", "0", "--epochs",
                                      "1000", "--split", "16,8,8", "--batch-size", "8", "--quiet"};
  std::vector<char*> argv;
  for (const std::string& a : args) argv.push_back(const_cast<char*>(a.c_str()));
  argv.push_back(nullptr);
  const pid_t pid = fork();
  if (pid == 0) {
    const int null = ::open("/dev/null", O_WRONLY);
    ::dup2(null, 1);
    ::execve(prog.c_str(), argv.data(), envp.data());
    _exit(127);
  }
  std::string env;
  for (int k = 0; k < 100; ++k) {   // until the program's own environment is in place (a few ms)
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    std::ifstream f("/proc/" + std::to_string(pid) + "/environ");
    std::stringstream ss;
    ss << f.rdbuf();
    env = ss.str();
    if (env.find("OMP_WAIT_POLICY=") != std::string::npos || k > 20) break;
  }
  ::kill(pid, SIGKILL);
  ::waitpid(pid, nullptr, 0);
  return env;
}

TEST(ExperimentsFirstRun, ProgramsWaitPassivelyUnlessTheUserChose) {
  if (!built("minidl-train")) GTEST_SKIP() << "minidl-train is not built";
  EXPECT_NE(environment_seen({}).find(std::string("OMP_WAIT_POLICY=passive") + '\0'), std::string::npos);
  const std::string active = environment_seen({"OMP_WAIT_POLICY=active"});
  EXPECT_NE(active.find(std::string("OMP_WAIT_POLICY=active") + '\0'), std::string::npos);
  EXPECT_EQ(active.find("OMP_WAIT_POLICY=passive"), std::string::npos);
  EXPECT_EQ(environment_seen({"GOMP_SPINCOUNT=1000"}).find("OMP_WAIT_POLICY"), std::string::npos);
}

TEST(ExperimentsFirstRun, ASaveRemovesTheTemporaryFilesOfKilledWriters) {
  const fs::path dir = testing::temp_dir();
  const fs::path target = dir / "w.safetensors";
  const pid_t gone = fork();   // a process that has exited: its pid names no process now
  if (gone == 0) _exit(0);
  ::waitpid(gone, nullptr, 0);
  const pid_t alive = fork();  // a writer still at work
  if (alive == 0) {
    pause();
    _exit(0);
  }
  const fs::path stale = dir / ("w.safetensors.tmp." + std::to_string(gone));
  const fs::path live = dir / ("w.safetensors.tmp." + std::to_string(alive));
  const fs::path other = dir / ("w.safetensors.optimizer.safetensors.tmp." + std::to_string(gone));
  for (const fs::path& p : {stale, live, other}) std::ofstream(p) << "half a file";
  write_file_atomic(target, "whole");
  EXPECT_FALSE(fs::exists(stale)) << "the killed writer's file stays";
  EXPECT_TRUE(fs::exists(live)) << "a live writer's file was removed";
  EXPECT_TRUE(fs::exists(other)) << "another target's file was removed";
  ::kill(alive, SIGKILL);
  ::waitpid(alive, nullptr, 0);
}

}  // namespace
}  // namespace minidl::harness
