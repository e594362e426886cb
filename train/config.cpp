// TrainConfig's resolved values, the parsers its specs share (--split, --checkpoint, lists, the
// device) and the command line around them (--config, parse errors as one line). The specs'
// flags and checks are train/specs.cpp's.
#include "train/config.h"

#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdio>
#include <regex>
#include <sstream>
#include <stdexcept>

#include "core/allocator.h"
#include "core/backend.h"
#include "optim/schedule.h"

namespace minidl::train {
namespace {

[[noreturn]] void usage(const std::string& msg) { throw UsageError(msg); }

}  // namespace

double OptimizerSpec::resolved_lr() const {
  if (lr > 0) return lr;
  return optimizer == "sgd" ? 0.01 : 0.001;
}

double TrainConfig::resolved_diverge_loss() const {
  if (diverge_loss > 0) return diverge_loss;
  return optimizer == "sgd" ? kSgdDivergeLoss : kAdamDivergeLoss;
}

double OptimizerSpec::resolved_weight_decay() const {
  if (weight_decay >= 0) return weight_decay;
  return optimizer == "adamw" ? 0.01 : 0.0;
}

bool TrainConfig::resolved_channels_last() const {
  if (channels_last) return *channels_last;
  const bool cuda = device == "cuda" || device.rfind("cuda:", 0) == 0;
  return cuda && amp;
}

bool TrainConfig::resolved_cuda_graphs(std::string* why) const {
  if (why != nullptr) why->clear();
  const bool cuda = device == "cuda" || device.rfind("cuda:", 0) == 0;
  if (!cuda || !cuda_graphs.value_or(true)) return false;   // --cuda-graphs off CUDA: refused by validate()
  if (world_size > 1) {
    if (why != nullptr)
      *why = "data-parallel steps (" + std::to_string(world_size) + " ranks) run eagerly: the gradient allreduce "
             "and the ranks' agreed decisions run on the host";
    return false;
  }
  return true;
}

double TrainConfig::scaled_lr() const {
  return optim::scaled_lr(resolved_lr(), effective_batch(), base_batch, optim::parse_lr_scaling(lr_scaling));
}

void add_config_flag(CLI::App& app) {
  app.set_config("--config", "", "read flags from a TOML/INI file (key = value); command-line flags win");
  app.allow_config_extras(CLI::config_extras_mode::error);
  app.option_defaults()->always_capture_default();
}

SplitSpec parse_split(const std::string& s) {
  SplitSpec spec;
  spec.counts = s.find('.') == std::string::npos;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      const double v = std::stod(item, &used);
      if (used != item.size() || v < 0) throw std::invalid_argument(item);
      spec.parts.push_back(v);
    } catch (const std::exception&) {
      usage("--split '" + s + "': '" + item + "' is not a non-negative number; expected TRAIN,VAL,TEST");
    }
  }
  if (spec.parts.size() != 3) usage("--split '" + s + "': expected three parts TRAIN,VAL,TEST");
  if (spec.parts[0] <= 0) usage("--split '" + s + "': the training part must be > 0");
  if (!spec.counts && spec.parts[0] + spec.parts[1] + spec.parts[2] > 1.0 + 1e-9)
    usage("--split '" + s + "': fractions must add up to at most 1");
  return spec;
}

CheckpointSpec parse_checkpoint(const std::string& s) {
  CheckpointSpec c;
  if (s == "none") return c;
  if (s == "stages") {
    c.kind = CheckpointSpec::Kind::Stages;
  } else if (s == "optimal") {
    c.kind = CheckpointSpec::Kind::Optimal;
  } else if (s.rfind("sequential:", 0) == 0) {
    c.kind = CheckpointSpec::Kind::Sequential;
    const std::string n = s.substr(11);
    try {
      size_t used = 0;
      c.segments = std::stoi(n, &used);
      if (used != n.size() || c.segments < 1) throw std::invalid_argument(n);
    } catch (const std::exception&) {
      usage("--checkpoint '" + s + "': N in sequential:N must be a positive integer");
    }
  } else {
    usage("--checkpoint '" + s + "': expected none, stages, sequential:N or optimal");
  }
  return c;
}

std::vector<int64_t> parse_int_list(const std::string& flag, const std::string& s) {
  std::vector<int64_t> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) {
    try {
      size_t used = 0;
      const long long v = std::stoll(item, &used);
      if (used != item.size() || v <= 0) throw std::invalid_argument(item);
      out.push_back(v);
    } catch (const std::exception&) {
      usage(flag + " '" + s + "': '" + item + "' is not a positive integer");
    }
  }
  if (out.empty()) usage(flag + " is empty: give a comma-separated list of positive integers");
  return out;
}

std::vector<std::string> parse_word_list(const std::string& s) {
  std::vector<std::string> out;
  std::stringstream ss(s);
  std::string item;
  while (std::getline(ss, item, ',')) if (!item.empty()) out.push_back(item);
  return out;
}

Device resolve_device(const std::string& spec) {
  Device d;
  try {
    d = Device::parse(spec);
  } catch (const Error&) {
    usage("--device '" + spec + "': expected cpu, cuda or cuda:N");
  }
  if (d.is_meta())
    usage("--device " + spec + ": the shape-only device computes nothing; minidl-memest and minidl-maxbatch dry-run "
          "on it by themselves (use cpu or cuda)");
  if (d.is_cuda()) {
    if (!cuda_built()) usage("--device " + spec + ": this build has no CUDA backend (rebuild with -DMINIDL_CUDA=ON)");
    const int n = cuda_device_count();
    if (n == 0) usage("--device " + spec + ": no CUDA device is visible (use --device cpu)");
    if (d.index >= n) usage("--device " + spec + ": only " + std::to_string(n) + " CUDA device(s) visible");
  }
  return d;
}

void apply_backend_switches(const TrainConfig& c, Device d) {
  if (d.target() != DeviceType::CUDA) {
    if (c.expandable_segments)
      usage("--expandable-segments: the allocator of " + d.str() + " has no segments to expand (a CUDA device's "
            "has); drop it, or use --device cuda");
    return;
  }
  set_conv_autotune(c.cudnn_benchmark == "on");   // meta:cuda too
  set_expandable_segments(d, c.expandable_segments);
}

std::string user_message(const std::exception& e, bool verbose) {
  const std::string msg = e.what();
  if (verbose) return msg;
  static const std::regex location(R"( \[[A-Za-z0-9_./+-]+\.(cpp|h|cu|cuh):[0-9]+\])");
  return std::regex_replace(msg, location, "");
}

int parse_command_line(CLI::App& app, int argc, const char* const* argv, const std::string& program) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp&) {
    std::printf("%s", app.help().c_str());
    return 0;
  } catch (const CLI::CallForAllHelp&) {
    std::printf("%s", app.help("", CLI::AppFormatMode::All).c_str());
    return 0;
  } catch (const CLI::ConfigError& e) {
    // CLI11 says "INI was not able to parse KEY": name the key and the file instead.
    std::string file;
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      if (a == "--config" && i + 1 < argc) file = argv[i + 1];
      else if (a.rfind("--config=", 0) == 0) file = a.substr(9);
    }
    std::string msg = e.what();
    const std::string prefix = "INI was not able to parse ";
    if (msg.rfind(prefix, 0) == 0)
      msg = "unknown key '" + msg.substr(prefix.size()) + "'; keys are the flags' long names without the dashes "
            "(batch-size = 64), see --help";
    std::fprintf(stderr, "%s: error: --config %s: %s\n", program.c_str(), file.c_str(), msg.c_str());
    return 2;
  } catch (const CLI::ParseError& e) {
    std::string msg = e.what();
    for (char& ch : msg) if (ch == '\n') ch = ' ';
    std::fprintf(stderr, "%s: error: %s (see --help)\n", program.c_str(), msg.c_str());
    return 2;
  } catch (const std::invalid_argument& e) {
    // CLI11 converts a flag's value (--no-channels-last=A, or "no-channels-last = A" in a --config
    // file) with std::invalid_argument, naming neither the flag nor the values it takes.
    std::fprintf(stderr,
                 "%s: error: a flag was given a value that is not one of true, false, on, off, yes, no, 1, 0 (%s); "
                 "on the command line a flag takes no value (--no-channels-last), in a --config file write "
                 "'channels-last = false' (see --help)\n",
                 program.c_str(), e.what());
    return 2;
  }
  return -1;
}

}  // namespace minidl::train
