// Issue 30, item 3: --resume and --init-weights with a file of another model printed a 3,483-
// character line listing 122 keys, advised a strict=false flag that does not exist and exited 1;
// random bytes exited 1 too. Now: one short line with the counts and the first three of each kind,
// status 2; a resumed run says from where it continues; a finished run resumed prints '-' for what
// it did not measure.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>

#include "tests/experiments/helpers.h"

namespace minidl::harness {
namespace {

namespace fs = std::filesystem;

struct Outcome {
  int status = -1;
  std::string out, err;
};

Outcome train(const std::string& args) {
  const fs::path err = fs::temp_directory_path() / ("minidl-weights-files-stderr-" + std::to_string(getpid()));
  const testing::Outcome run =
      testing::run_command(testing::program("minidl-train").string() + " " + args + " 2> " + err.string());
  std::ifstream f(err);
  return {.status = run.status, .out = run.output,
          .err = std::string(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>())};
}

const std::string kData = " --split 16,8,8 --synthetic-difficulty 0.2 --workers 0 --batch-size 8 ";
const std::string kTiny = kData + "--image-size 8 ";

#define NEED_TRAIN() \
  if (!fs::exists(testing::program("minidl-train"))) GTEST_SKIP() << "minidl-train is not built"

TEST(WeightsFiles, AnotherModelsFileIsOneShortLineWithStatus2) {
  NEED_TRAIN();
  const fs::path dir = testing::temp_dir();
  const std::string resnet = (dir / "resnet.safetensors").string();
  ASSERT_EQ(train("--model resnet18-small --image-size 32 --split 1,0,0 --batch-size 2 --max-steps 1 --workers 0 "
                  "--save-initial-weights " + resnet).status,
            0);
  for (const std::string flag : {"--resume", "--init-weights"}) {
    const Outcome o = train("--model smallcnn --epochs 1 " + flag + " " + resnet + kTiny);
    EXPECT_EQ(o.status, 2) << flag << ": " << o.err;
    EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << "one line: " << o.err;
    EXPECT_LT(o.err.size(), 400u) << o.err;
    EXPECT_NE(o.err.find("minidl-train: error: " + flag + " " + resnet + " does not fit --model smallcnn (it was "
                         "saved from resnet18-small): 6 missing keys [conv.bias, conv.weight, fc1.bias, ...], "),
              std::string::npos)
        << o.err;
    EXPECT_NE(o.err.find(", 122 unexpected keys [bn1.bias, bn1.num_batches_tracked, bn1.running_mean, ...], "
                         "0 shape/dtype mismatches []"),
              std::string::npos)
        << o.err;
    EXPECT_EQ(o.err.find("strict"), std::string::npos) << "no flag that does not exist: " << o.err;
  }
  // Same model, other shapes (fc1 depends on the image size): the mismatches, first three.
  const std::string small16 = (dir / "smallcnn16.safetensors").string();
  ASSERT_EQ(train("--model smallcnn --max-steps 0 --save-initial-weights " + small16 + kData + "--image-size 16").status, 0);
  const Outcome o = train("--model smallcnn --epochs 1 --init-weights " + small16 + kTiny);
  EXPECT_EQ(o.status, 2) << o.err;
  EXPECT_NE(o.err.find("0 missing keys [], 0 unexpected keys [], 1 shape/dtype mismatches [fc1.weight (expected "
                       "f32[128, 512], got f32[128, 2048])]"),
            std::string::npos)
      << o.err;
}

TEST(WeightsFiles, ACorruptFileExitsWith2) {
  NEED_TRAIN();
  const fs::path dir = testing::temp_dir();
  const fs::path junk = dir / "junk.safetensors";
  std::mt19937 rng(3);
  std::ofstream f(junk, std::ios::binary);
  for (int i = 0; i < 5000; ++i) f.put(static_cast<char>(rng()));
  f.close();
  for (const std::string flag : {"--resume", "--init-weights"}) {
    const Outcome o = train("--model smallcnn --epochs 1 " + flag + " " + junk.string() + kTiny);
    EXPECT_EQ(o.status, 2) << flag << ": " << o.err;
    EXPECT_NE(o.err.find(flag + " " + junk.string() + ": not a weights file minidl can read: "), std::string::npos)
        << o.err;
    EXPECT_EQ(std::count(o.err.begin(), o.err.end(), '\n'), 1) << o.err;
  }
}

TEST(WeightsFiles, AResumedRunSaysFromWhereAndAFinishedOnePrintsDashes) {
  NEED_TRAIN();
  const fs::path dir = testing::temp_dir();
  const std::string w = (dir / "w.safetensors").string();
  ASSERT_EQ(train("--model smallcnn --epochs 2 --save-weights " + w + kTiny).status, 0);
  const Outcome more = train("--model smallcnn --epochs 3 --resume " + w + kTiny);
  ASSERT_EQ(more.status, 0) << more.err;
  EXPECT_NE(more.out.find("\nresumed from " + w + ": after epoch 2, optimizer step 8; continuing at epoch 3\n"),
            std::string::npos)
      << more.out;
  const std::string part = (dir / "part.safetensors").string();
  ASSERT_EQ(train("--model smallcnn --epochs 2 --max-steps 6 --save-weights " + part + kTiny).status, 0);
  const Outcome inside = train("--model smallcnn --epochs 2 --resume " + part + kTiny);
  EXPECT_NE(inside.out.find("resumed from " + part + ": inside epoch 2 after micro-batch 2, optimizer step 6; "
                            "continuing at epoch 2\n"),
            std::string::npos)
      << inside.out;
  // Nothing left to train: no images/s or peak memory was measured in this session.
  const Outcome done = train("--model smallcnn --epochs 2 --resume " + w + kTiny);
  ASSERT_EQ(done.status, 0) << done.err;
  EXPECT_NE(done.out.find("resumed from " + w + ": after epoch 2, optimizer step 8; nothing left to train with "
                          "--epochs 2"),
            std::string::npos)
      << done.out;
  EXPECT_NE(done.out.find(", - img/s, peak allocated -, "), std::string::npos) << done.out;
  EXPECT_EQ(done.out.find(" 0.0 img/s"), std::string::npos) << done.out;
}

}  // namespace
}  // namespace minidl::harness
