// Shared by the experiments suite: a tiny configuration that trains in well under a second, a
// private temporary folder per test, the path of the built programs (beside the test exe) and the
// runs of those programs whose output the tests read.
#pragma once
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "train/config.h"
#include "experiments/harness/results.h"
#include "tests/support/read_text.h"

namespace minidl::harness::testing {

// The small CNN on 8x8 synthetic images, 16/8/8 per class, one epoch, batch 8.
inline TrainConfig tiny_config() {
  TrainConfig c;
  c.model = "smallcnn";
  c.image_size = 8;
  c.split = "16,8,8";
  c.epochs = 1;
  c.batch_size = 8;
  c.quiet = true;
  c.synthetic_difficulty = 0.2;
  return c;
}

inline std::filesystem::path temp_dir() {
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  auto dir = std::filesystem::temp_directory_path() /
             ("minidl-exp-" + std::string(info->test_suite_name()) + "-" + info->name() + "-" +
              std::to_string(getpid()));
  std::filesystem::remove_all(dir);
  std::filesystem::create_directories(dir);
  return dir;
}

using ::minidl::testing::read_text;   // tests/support/read_text.h

// A program built into the same bin folder as this test executable.
inline std::filesystem::path program(const std::string& name) {
  return std::filesystem::read_symlink("/proc/self/exe").parent_path() / name;
}

// Runs a shell command; returns its exit status (or -1).
inline int run_status(const std::string& cmd) {
  const int s = std::system((cmd + " > /dev/null 2>&1").c_str());
  return WIFEXITED(s) ? WEXITSTATUS(s) : -1;
}

// What a command printed on stdout (stderr too where the command sends it there) and its exit
// status (-1 when it did not exit normally).
struct Outcome {
  int status = -1;
  std::string output;

  // The last line that is not empty, without its newline ("" when there is none).
  std::string last_line() const {
    const size_t end = output.find_last_not_of('\n');
    if (end == std::string::npos) return "";
    const size_t start = output.rfind('\n', end);
    const size_t from = start == std::string::npos ? 0 : start + 1;
    return output.substr(from, end - from + 1);
  }
};

// Runs a shell command and reads all it writes to stdout.
inline Outcome run_command(const std::string& cmd) {
  Outcome o;
  if (FILE* p = popen(cmd.c_str(), "r")) {
    char buf[1024];
    while (fgets(buf, sizeof(buf), p)) o.output += buf;
    const int s = pclose(p);
    o.status = WIFEXITED(s) ? WEXITSTATUS(s) : -1;
  }
  return o;
}

// Runs one of the built programs with `args`, its stderr joined to its stdout.
inline Outcome run_program(const std::string& name, const std::string& args) {
  return run_command(program(name).string() + " " + args + " 2>&1");
}

inline Outcome train(const std::string& args) { return run_program("minidl-train", args); }

// One column of a results table, every row's value in order: a whole column compares at once.
using Column = std::vector<std::string>;
inline Column column(const CsvTable& t, const std::string& name) {
  Column c;
  for (size_t i = 0; i < t.rows.size(); ++i) c.push_back(t.get(i, name));
  return c;
}

}  // namespace minidl::harness::testing
