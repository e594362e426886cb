// The results writers: CSV round trips with quoting, torn last lines from a killed sweep, header
// checks on append, atomic file replacement, Markdown tables, the per-epoch CSV and the plot data.
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>

#include "experiments/harness/results.h"
#include "tests/experiments/helpers.h"

namespace minidl::harness {
namespace {

TEST(ExperimentsResults, CsvRoundTripWithQuotesAndCommas) {
  const auto dir = testing::temp_dir();
  const auto f = dir / "t.csv";
  const Row h{"id", "note"};
  append_csv_row(f, h, {"a", "plain"});
  append_csv_row(f, h, {"b", "with, comma and \"quotes\""});
  const CsvTable t = read_csv(f);
  ASSERT_EQ(t.rows.size(), 2u);
  EXPECT_EQ(t.header, h);
  EXPECT_EQ(t.get(1, "note"), "with, comma and \"quotes\"");
  EXPECT_EQ(t.get(0, "id"), "a");
  EXPECT_EQ(t.get(0, "missing"), "");
  EXPECT_THROW(append_csv_row(f, {"other", "header"}, {"x", "y"}), Error);
  EXPECT_THROW(append_csv_row(f, h, {"too", "many", "fields"}), Error);
  std::filesystem::remove_all(dir);
}

// A results.csv written by an older minidl (today's columns minus the newest, last ones) is
// upgraded in place, so a resumed sweep keeps its finished runs; any other difference is refused.
TEST(ExperimentsResults, OlderFileWithFewerTrailingColumnsIsUpgradedOnAppend) {
  const auto dir = testing::temp_dir();
  const auto f = dir / "t.csv";
  append_csv_row(f, {"id", "note"}, {"a", "old, quoted"});
  const Row h{"id", "note", "steady"};
  append_csv_row(f, h, {"b", "new", "12.5"});
  const CsvTable t = read_csv(f);
  EXPECT_EQ(t.header, h);
  ASSERT_EQ(t.rows.size(), 2u);
  EXPECT_EQ(t.get(0, "id"), "a");
  EXPECT_EQ(t.get(0, "note"), "old, quoted");
  EXPECT_EQ(t.get(0, "steady"), "");
  EXPECT_EQ(t.get(1, "steady"), "12.5");
  EXPECT_THROW(append_csv_row(f, {"id", "other", "steady", "more"}, {"c", "x", "y", "z"}), Error);
  EXPECT_THROW(append_csv_row(f, {"id"}, {"c"}), Error) << "a file with more columns than ours is not ours";
  EXPECT_EQ(read_csv(f).rows.size(), 2u) << "a refused append changes nothing";
  std::filesystem::remove_all(dir);
}

// A results file saved again by a spreadsheet or Python's csv module (CRLF line ends) still resumes;
// one whose columns are not ours is refused, naming the first column that differs.
TEST(ExperimentsResults, CrlfLineEndsAreReadAndOtherColumnsAreNamed) {
  const auto dir = testing::temp_dir();
  const auto f = dir / "t.csv";
  { std::ofstream(f, std::ios::binary) << "id,note\r\na,\"quoted, \"\"x\"\"\"\r\nb,plain\r\n"; }
  const Row h{"id", "note"};
  CsvTable t = read_csv(f);
  EXPECT_EQ(t.header, h);
  ASSERT_EQ(t.rows.size(), 2u);
  EXPECT_EQ(t.get(0, "note"), "quoted, \"x\"");
  EXPECT_EQ(t.get(1, "note"), "plain");
  append_csv_row(f, h, {"c", "new"});
  replace_csv_row(f, h, "id", {"a", "again"});
  t = read_csv(f);
  ASSERT_EQ(t.rows.size(), 3u);
  EXPECT_EQ(t.get(0, "note"), "again");
  EXPECT_EQ(t.get(2, "id"), "c");
  try {
    append_csv_row(f, {"id", "status"}, {"d", "ok"});
    ADD_FAILURE() << "a file with another second column was appended to";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("column 2 is 'note' where it writes 'status'"), std::string::npos)
        << e.what();
  }
  std::filesystem::remove_all(dir);
}

TEST(ExperimentsResults, TornLastLineIsDroppedAndTheNextAppendStartsClean) {
  const auto dir = testing::temp_dir();
  const auto f = dir / "t.csv";
  const Row h{"id", "value"};
  append_csv_row(f, h, {"a", "1"});
  { std::ofstream(f, std::ios::app) << "b,2"; }  // a kill in the middle of a write: no newline
  EXPECT_EQ(read_csv(f).rows.size(), 1u);
  append_csv_row(f, h, {"c", "3"});
  const CsvTable t = read_csv(f);
  ASSERT_EQ(t.rows.size(), 2u);
  EXPECT_EQ(t.get(1, "id"), "c");
  std::filesystem::remove_all(dir);
}

TEST(ExperimentsResults, AtomicWriteReplacesWholeFiles) {
  const auto dir = testing::temp_dir();
  const auto f = dir / "sub" / "x.json";
  write_file_atomic(f, "first");
  write_file_atomic(f, "second");
  std::ifstream in(f);
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(s, "second");
  int files = 0;
  for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(dir / "sub")) ++files;
  EXPECT_EQ(files, 1) << "no temporary file left behind";
  std::filesystem::remove_all(dir);
}

TEST(ExperimentsResults, MarkdownAndNumbers) {
  EXPECT_EQ(markdown_table({"a", "b"}, {{"1", "2"}}), "| a | b |\n| --- | --- |\n| 1 | 2 |\n");
  EXPECT_EQ(fmt(0.5, 2), "0.50");
  EXPECT_EQ(fmt(std::nan(""), 2), "");
  EXPECT_EQ(csv_escape("x\"y"), "\"x\"\"y\"");
  EpochMetrics e;
  e.epoch = 3;
  e.val_acc = 0.75;
  const std::string csv = epochs_csv({e});
  EXPECT_NE(csv.find("\n3,"), std::string::npos);
  EXPECT_NE(csv.find("0.7500"), std::string::npos);
}

TEST(ExperimentsResults, PlotDataKeepsItsSettingsAndIsWrittenWithoutGnuplot) {
  // A GPU machine has no gnuplot: the .dat must still be written, with what it takes to draw it.
  const auto dir = testing::temp_dir();
  PlotSpec spec;
  spec.title = "Accuracy \"quoted\"";
  spec.xlabel = "batch size";
  spec.ylabel = "test accuracy";
  spec.series = {{"sgd, augment none", {{16, 0.5}, {32, 0.625}}, {}, 0}, {"empty", {}, {}, 0}};
  const std::string path = std::getenv("PATH") ? std::getenv("PATH") : "";
  setenv("PATH", "/nonexistent", 1);
  const std::string note = plot_png(spec, dir / "p.png");
  setenv("PATH", path.c_str(), 1);
  EXPECT_NE(note.find("gnuplot is not installed"), std::string::npos) << note;
  EXPECT_NE(note.find("p.png.dat"), std::string::npos) << note;
  std::ifstream in(dir / "p.png.dat");
  std::string s((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_EQ(s, "# plot: plottitle='Accuracy  quoted '; xlab='batch size'; ylab='test accuracy'; logx=1\n"
               "\"sgd, augment none\" \"y\"\n16.000000 0.500000\n32.000000 0.625000\n");
  std::filesystem::remove_all(dir);
}

TEST(ExperimentsResults, ProvenanceHasCommitDateAndDevice) {
  const auto j = provenance("cpu: test");
  EXPECT_EQ(j["device"], "cpu: test");
  EXPECT_GE(j["commit"].get<std::string>().size(), 7u);
  EXPECT_EQ(j["date"].get<std::string>().size(), 20u);  // 2026-01-01T00:00:00Z
}

}  // namespace
}  // namespace minidl::harness
