// Issue 30, item 1: a run whose only "cats" are unreadable files once reported "test acc 100.00%"
// and exited 0. These run minidl-train on folders with random-byte and truncated files and check
// that usable images are counted before the split (with and without --validate-data), that a class
// without usable images stops the run with status 2 and its counts, that a file found unreadable
// only while loading does the same when it empties a class, and that the header, the summary and
// the last line say how many files were skipped.
#include <gtest/gtest.h>

#include <cstdio>
#include <filesystem>
#include <random>
#include <string>

#include "tests/data/fixtures.h"
#include "tests/experiments/helpers.h"
#include "tests/support/holds_all.h"

namespace minidl::harness {
namespace {

namespace fs = std::filesystem;
using namespace data::fixtures;   // the JPEG files and shared photos of tests/data/fixtures.h

using ::minidl::testing::holds_all;
using testing::Outcome;
using testing::train;

// n real dog photos from the shared set when it is there, else n JPEG patterns (the checks do not
// depend on what the pictures show).
void real_dogs(const fs::path& dir, int n) {
  fs::create_directories(dir);
  const fs::path shared = shared_photos();
  for (int i = 1; i <= n; ++i) {
    const fs::path to = dir / ("dog." + std::to_string(i) + ".jpg");
    if (!shared.empty()) fs::copy_file(shared / "dog" / ("dog." + std::to_string(i) + ".jpg"), to);
    else write_bytes(to, encode_jpeg(pattern(48, 64, i)));
  }
}

void good_jpegs(const fs::path& dir, const std::string& stem, int n, int seed) {
  for (int i = 1; i <= n; ++i) write_bytes(dir / (stem + std::to_string(i) + ".jpg"), encode_jpeg(pattern(40, 40, seed + i)));
}

void random_files(const fs::path& dir, const std::string& stem, int n) {
  fs::create_directories(dir);
  std::mt19937 rng(7);
  for (int i = 1; i <= n; ++i) {
    std::vector<uint8_t> bytes(2000 + 100 * static_cast<size_t>(i));
    for (auto& b : bytes) b = static_cast<uint8_t>(rng());
    bytes[0] = 0x42;   // never the JPEG SOI by chance
    write_bytes(dir / (stem + std::to_string(i) + ".jpg"), bytes);
  }
}

// JPEGs cut after 60% of their bytes: the header is whole (a header scan passes them), the pixels
// are not (libjpeg: "Premature end of JPEG file"), so only the loader finds them.
void truncated_jpegs(const fs::path& dir, const std::string& stem, int n) {
  for (int i = 1; i <= n; ++i) {
    std::vector<uint8_t> bytes = encode_jpeg(pattern(64, 64, 100 + i));
    bytes.resize(bytes.size() * 6 / 10);
    write_bytes(dir / (stem + std::to_string(i) + ".jpg"), bytes);
  }
}

#define NEED_TRAIN() \
  if (!fs::exists(testing::program("minidl-train"))) GTEST_SKIP() << "minidl-train is not built"

// The scenario, exactly: 20 random-byte "cats", 20 real dog photos.
TEST(UnreadableData, RandomByteCatsStopTheRunWithStatus2) {
  NEED_TRAIN();
  const fs::path root = testing::temp_dir();
  random_files(root / "cat", "cat.", 20);
  real_dogs(root / "dog", 20);
  const std::string args = "--data " + root.string() + " --model smallcnn --image-size 64 --epochs 1 --split 0.6,0.2,0.2";
  for (const std::string extra : {"", " --validate-data"}) {
    const Outcome o = train(args + extra);
    EXPECT_EQ(o.status, 2) << extra << "\n" << o.output;
    EXPECT_NE(o.output.find("--data '" + root.string() + "': class 'cat' has no usable images (usable / files: "
                            "cat 0 / 20, dog 20 / 20; 20 unreadable files skipped)"),
              std::string::npos)
        << extra << "\n" << o.output;
    EXPECT_EQ(o.output.find("100.00%"), std::string::npos) << extra << "\n" << o.output;
    EXPECT_EQ(o.output.find(" ok"), std::string::npos) << extra << "\n" << o.output;
  }
  // Without --validate-data the header scan names the files it leaves out.
  const Outcome plain = train(args);
  EXPECT_NE(plain.output.find("minidl data: skipping " + (root / "cat" / "cat.1.jpg").string() + ": "), std::string::npos)
      << plain.output;
}

TEST(UnreadableData, SkippedFilesAreCountedInTheHeaderSummaryAndLastLine) {
  NEED_TRAIN();
  const fs::path root = testing::temp_dir();
  good_jpegs(root / "cat", "c", 6, 0);
  random_files(root / "cat", "bad", 2);
  good_jpegs(root / "dog", "d", 6, 50);
  const std::string args = "--data " + root.string() + " --model smallcnn --image-size 16 --epochs 1 --split 4,1,1 "
                           "--batch-size 4 --workers 0";
  for (const std::string extra : {"", " --validate-data"}) {
    const Outcome o = train(args + extra + " --out " + (root / "out").string());
    ASSERT_EQ(o.status, 0) << extra << "\n" << o.output;
    EXPECT_NE(o.output.find("(12 usable images, 2 unreadable files skipped), 8 train / 2 val / 2 test"),
              std::string::npos)
        << "header: " << o.output;
    EXPECT_NE(o.output.find("s; 2 unreadable files skipped\n"), std::string::npos) << "summary: " << o.output;
    EXPECT_EQ(o.last_line(), "minidl-train: 2 unreadable files were skipped (named above by 'minidl data: skipping'; "
                           "--validate-data lists them all before training)")
        << o.output;
  }
  // None skipped: the summary says 0, no extra last line.
  fs::remove_all(root / "cat");
  good_jpegs(root / "cat", "c", 6, 0);
  const Outcome clean = train(args);
  ASSERT_EQ(clean.status, 0) << clean.output;
  EXPECT_NE(clean.output.find("s; 0 unreadable files skipped\n"), std::string::npos) << clean.output;
  EXPECT_EQ(clean.output.find("were skipped"), std::string::npos) << clean.output;
}

// A manifest is read against every file: one that names a file which has since become unreadable
// still loads, without that file.
TEST(UnreadableData, AManifestNamingAnUnreadableFileLeavesItOut) {
  NEED_TRAIN();
  const fs::path root = testing::temp_dir();
  good_jpegs(root / "cat", "c", 3, 0);
  good_jpegs(root / "dog", "d", 3, 50);
  const std::string args = "--data " + root.string() + " --model smallcnn --image-size 16 --epochs 1 --split 3,0,0 "
                           "--batch-size 2 --workers 0 --manifest " + (root / "split.txt").string();
  ASSERT_EQ(train(args).status, 0);
  random_files(root / "cat", "c", 1);   // c1.jpg becomes random bytes
  const Outcome o = train(args);
  ASSERT_EQ(o.status, 0) << o.output;
  EXPECT_TRUE(holds_all(o.output, {"(5 usable images, 1 unreadable file skipped), 5 train / 0 val / 0 test",
                                   "s; 1 unreadable file skipped\n"}));
}

// Truncated JPEGs pass the header scan; the loader finds them. When they were all a class had for
// training, the run ends after the epoch that found them, with status 2 and the counts.
TEST(UnreadableData, AClassEmptiedWhileLoadingStopsTheRun) {
  NEED_TRAIN();
  const fs::path root = testing::temp_dir();
  truncated_jpegs(root / "cat", "t", 3);
  good_jpegs(root / "dog", "d", 3, 50);
  const Outcome o = train("--data " + root.string() + " --model smallcnn --image-size 16 --epochs 2 --split 3,0,0 "
                          "--batch-size 2 --workers 0");
  EXPECT_EQ(o.status, 2) << o.output;
  EXPECT_NE(o.output.find("class 'cat' has no usable training images left: all 3 were unreadable when loaded "
                          "(usable / files: cat 0 / 3, dog 3 / 3; 3 unreadable files skipped)"),
            std::string::npos)
      << o.output;
  EXPECT_NE(o.output.find("truncated JPEG"), std::string::npos) << "the loader names each file: " << o.output;
  EXPECT_EQ(o.output.find("epoch 2/2 done"), std::string::npos) << "stops after the epoch that found them: " << o.output;
  // The up-front scan saw nothing wrong with them.
  EXPECT_NE(o.output.find("(6 usable images, 0 unreadable files skipped)"), std::string::npos) << o.output;
}

}  // namespace
}  // namespace minidl::harness
