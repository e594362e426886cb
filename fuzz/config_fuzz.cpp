// libFuzzer target for the two text formats the experiment programs read from users' files: the
// TOML/INI --config file (CLI11's reader, then minidl's flag checks: train/config.cpp)
// and the split manifest (data/split.cpp). The first byte picks the reader. Any input must end in
// a usage error, a minidl::Error or success; any other exception (a std::out_of_range from a
// number parser, say, which the programs would report as an internal error with status 1) or a
// crash is a bug.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include "core/error.h"
#include "data/dataset.h"
#include "train/config.h"

namespace {

// A dataset of file names only: read_manifest maps keys to indices and checks labels.
class Names final : public minidl::data::Dataset {
 public:
  int64_t size() const override { return 6; }
  int64_t label(int64_t i) const override { return i / 3; }
  const std::vector<std::string>& class_names() const override { return classes_; }
  std::optional<minidl::data::Image> load(int64_t) const override { return std::nullopt; }
  std::string describe(int64_t i) const override { return classes_[static_cast<size_t>(i / 3)] + "/" + std::to_string(i % 3) + ".jpg"; }

 private:
  std::vector<std::string> classes_{"cat", "dog"};
};

void config(const std::string& text) {
  // Through a file, as --config reads it (CLI11's own reader, not a stream shortcut).
  struct TempFile {   // removed when the fuzzer exits
    std::string path = (std::filesystem::temp_directory_path() / ("minidl_config_fuzz." + std::to_string(::getpid()) +
                                                                  ".toml")).string();
    ~TempFile() { std::remove(path.c_str()); }
  };
  static const TempFile file;
  const std::string& path = file.path;
  std::ofstream(path, std::ios::binary | std::ios::trunc) << text;
  minidl::train::TrainConfig c;
  CLI::App app{"config_fuzz"};
  minidl::train::add_config_flag(app);
  minidl::train::add_train_flags(app, c);
  const char* argv[] = {"config_fuzz", "--config", path.c_str()};
  if (minidl::train::parse_command_line(app, 3, argv, "config_fuzz") >= 0) return;   // refused, status 2
  try {
    minidl::train::validate(c);
  } catch (const minidl::Error&) {   // UsageError included
  }
}

void manifest(const std::string& text) {
  static const Names names;
  std::istringstream in(text);
  try {
    const minidl::data::Split s = minidl::data::read_manifest(in, "<fuzz input>", names);
    for (const auto* part : {&s.train, &s.val, &s.test})
      for (const int64_t i : *part)
        if (i < 0 || i >= names.size()) __builtin_trap();
  } catch (const minidl::Error&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);
  if (data[0] % 2 == 0) config(text);
  else manifest(text);
  return 0;
}
