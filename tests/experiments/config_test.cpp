// Flag parsing and validation of the experiment programs: defaults, config files, command-line
// precedence, and the one-line exit-2 errors for every kind of bad input the issue lists.
#include <CLI/CLI.hpp>
#include <fstream>
#include <tuple>

#include "core/backend.h"
#include "experiments/harness/results.h"
#include "nn/resnet.h"
#include "train/config.h"
#include "train/model.h"
#include "train/run.h"
#include "tests/experiments/helpers.h"
#include "tests/support/error_of.h"

namespace minidl::harness {
namespace {

using minidl::testing::error_of;
using testing::program;
using testing::run_status;
using testing::temp_dir;

int parse(CLI::App& app, std::vector<std::string> args) {
  std::vector<const char*> argv{"prog"};
  for (auto& a : args) argv.push_back(a.c_str());
  return parse_command_line(app, static_cast<int>(argv.size()), argv.data(), "prog");
}

TEST(ExperimentsConfig, FlagsSetEveryFieldAndDefaultsResolve) {
  TrainConfig c;
  CLI::App app;
  add_config_flag(app);
  add_train_flags(app, c);
  EXPECT_EQ(parse(app, {"--model", "resnet18-small", "--batch-size", "64", "--accumulation-steps", "4", "--optimizer",
                        "adamw", "--lr-scaling", "linear", "--base-batch", "32", "--lr", "0.002", "--checkpoint",
                        "sequential:3", "--no-shuffle", "--memory-budget", "1GiB"}),
            -1);
  EXPECT_EQ(c.model, "resnet18-small");
  EXPECT_EQ(c.resolved_image_size(), 32);
  EXPECT_EQ(c.effective_batch(), 256);
  EXPECT_TRUE(c.no_shuffle);
  EXPECT_DOUBLE_EQ(c.resolved_weight_decay(), 0.01);       // AdamW's default
  EXPECT_DOUBLE_EQ(c.scaled_lr(), 0.002 * 256 / 32);       // linear scaling of the effective batch
  EXPECT_NO_THROW(validate(c));
  TrainConfig d;
  EXPECT_EQ(d.resolved_image_size(), 200);                  // the Keras study's size
  EXPECT_DOUBLE_EQ(d.resolved_lr(), 0.01);
}

// --expandable-segments is a CUDA device's: on meta:cuda it switches the dry run's allocator, on the
// CPU it is a usage error naming the fix (the CPU's allocator refuses it too).
TEST(ExperimentsConfig, ExpandableSegmentsAreACudaDevicesOnly) {
  TrainConfig c;
  CLI::App app;
  add_train_flags(app, c);
  EXPECT_EQ(parse(app, {"--expandable-segments"}), -1);
  EXPECT_TRUE(c.expandable_segments);
  const std::string e = error_of([&] { apply_backend_switches(c, Device::cpu()); });
  EXPECT_NE(e.find("--expandable-segments"), std::string::npos) << e;
  EXPECT_NE(e.find("use --device cuda"), std::string::npos) << e;
  EXPECT_THROW(set_expandable_segments(Device::cpu(), true), Error);
  EXPECT_NO_THROW(set_expandable_segments(Device::cpu(), false));
  if (!cuda_built()) return;   // meta:cuda needs the CUDA backend's answers
  const Device meta = Device::meta(DeviceType::CUDA);
  // The mode is set before a device's first tensor (one test a process under ctest).
  if (memory_stats(meta).allocated_bytes > 0) GTEST_SKIP() << "meta:cuda holds tensors of an earlier test";
  apply_backend_switches(c, meta);
  const int64_t before = memory_stats(meta).reserved_bytes;
  const Tensor t = empty({3 << 20}, {DType::u8, meta});   // a large block: two 2 MiB pages, not a 20 MiB segment
  EXPECT_EQ(memory_stats(meta).reserved_bytes - before, int64_t{4} << 20);
  c.expandable_segments = false;
  EXPECT_THROW(apply_backend_switches(c, meta), Error) << "a mode change with a live tensor";
}

// A flag given a value CLI11 cannot read as a boolean (fuzz/corpus/config/flag_value) is a usage
// error, exit 2, on the command line and in a config file; it used to escape as std::invalid_argument.
TEST(ExperimentsConfig, AFlagWithANonBooleanValueIsAUsageError) {
  const auto file = temp_dir() / "flag.toml";
  std::ofstream(file) << "no-channels-last = A\n";
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--no-channels-last=A"}, std::vector<std::string>{"--config", file.string()}}) {
    TrainConfig c;
    CLI::App app;
    add_config_flag(app);
    add_train_flags(app, c);
    EXPECT_EQ(parse(app, args), 2) << args[0];
  }
  TrainConfig c;
  CLI::App app;
  add_train_flags(app, c);
  EXPECT_EQ(parse(app, {"--no-channels-last=true"}), -1) << "a boolean value is read";
  EXPECT_EQ(c.channels_last, std::optional<bool>(false));
}

TEST(ExperimentsConfig, ConfigFileIsReadAndCommandLineWins) {
  const auto dir = temp_dir();
  const auto file = dir / "run.toml";
  std::ofstream(file) << "batch-size = 48\noptimizer = \"adam\"\nepochs = 7\n";
  TrainConfig c;
  CLI::App app;
  add_config_flag(app);
  add_train_flags(app, c);
  EXPECT_EQ(parse(app, {"--config", file.string(), "--epochs", "2"}), -1);
  EXPECT_EQ(c.batch_size, 48);
  EXPECT_EQ(c.optimizer, "adam");
  EXPECT_EQ(c.epochs, 2);
  // A misspelt key in the file is an error, not silently ignored.
  std::ofstream(file) << "batch-sise = 48\n";
  TrainConfig c2;
  CLI::App app2;
  add_config_flag(app2);
  add_train_flags(app2, c2);
  EXPECT_EQ(parse(app2, {"--config", file.string()}), 2);
  std::filesystem::remove_all(dir);
}

TEST(ExperimentsConfig, UnknownFlagsAndBadValuesAreParseErrors) {
  TrainConfig c;
  CLI::App app;
  add_train_flags(app, c);
  EXPECT_EQ(parse(app, {"--no-such-flag"}), 2);
  TrainConfig c2;
  CLI::App app2;
  add_train_flags(app2, c2);
  EXPECT_EQ(parse(app2, {"--batch-size", "many"}), 2);
  TrainConfig c3;
  CLI::App app3;
  add_train_flags(app3, c3);
  EXPECT_EQ(parse(app3, {"--help"}), 0);
  EXPECT_NE(app3.help().find("--memory-budget"), std::string::npos);
  EXPECT_NE(app3.help().find("=32"), std::string::npos) << "defaults are shown in --help";
}

// Channels-last is the default for CUDA + AMP only (cuDNN's f16 convolutions run channels-last: the
// step-time model and the GPU runs agree, docs/experiments.md); either flag overrides it, and a
// config file's "channels-last = false" asks for NCHW.
TEST(ExperimentsConfig, ChannelsLastIsTheDefaultForCudaWithAmpOnly) {
  auto resolved = [](std::vector<std::string> args) {
    TrainConfig c;
    CLI::App app;
    add_config_flag(app);
    add_train_flags(app, c);
    EXPECT_EQ(parse(app, std::move(args)), -1);
    return c.resolved_channels_last();
  };
  EXPECT_FALSE(resolved({}));
  EXPECT_FALSE(resolved({"--amp"}));                      // the CPU
  EXPECT_FALSE(resolved({"--device", "cuda"}));           // f32 on CUDA
  EXPECT_TRUE(resolved({"--device", "cuda", "--amp"}));
  EXPECT_TRUE(resolved({"--device", "cuda:1", "--amp"}));
  EXPECT_FALSE(resolved({"--device", "cuda", "--amp", "--no-channels-last"}));
  EXPECT_TRUE(resolved({"--channels-last"}));
  EXPECT_TRUE(resolved({"--device", "cuda", "--channels-last"}));
  const auto dir = temp_dir();
  const auto file = dir / "nchw.toml";
  std::ofstream(file) << "device = \"cuda\"\namp = true\nchannels-last = false\n";
  EXPECT_FALSE(resolved({"--config", file.string()}));
  std::filesystem::remove_all(dir);
  TrainConfig c;
  CLI::App app;
  add_train_flags(app, c);
  EXPECT_EQ(parse(app, {"--channels-last", "--no-channels-last"}), 2);   // one or the other
}

TEST(ExperimentsConfig, ValidateNamesTheFlagAndTheFix) {
  auto bad = [](auto edit) {
    TrainConfig c = testing::tiny_config();
    edit(c);
    return error_of([&] { validate(c); });
  };
  EXPECT_NE(bad([](TrainConfig& c) { c.batch_size = 0; }).find("--batch-size must be > 0"), std::string::npos);
  EXPECT_NE(bad([](TrainConfig& c) { c.batch_size = -3; }).find("--batch-size"), std::string::npos);
  EXPECT_NE(bad([](TrainConfig& c) { c.optimizer = "rmsprop"; }).find("sgd, adam or adamw"), std::string::npos);
  EXPECT_NE(bad([](TrainConfig& c) { c.model = "vgg"; }).find("--model 'vgg'"), std::string::npos);
  EXPECT_NE(bad([](TrainConfig& c) { c.lr_scaling = "cubic"; }).find("--lr-scaling"), std::string::npos);
  EXPECT_NE(bad([](TrainConfig& c) { c.schedule = "zigzag"; }).find("--schedule"), std::string::npos);
  EXPECT_NE(bad([](TrainConfig& c) { c.split = "1,2"; }).find("three parts"), std::string::npos);
  EXPECT_NE(bad([](TrainConfig& c) { c.memory_budget = "lots"; }).find("--memory-budget"), std::string::npos);
  EXPECT_NE(bad([](TrainConfig& c) { c.checkpoint = "stages"; }).find("needs a ResNet"), std::string::npos);
  EXPECT_NE(bad([](TrainConfig& c) { c.checkpoint = "optimal"; }).find("needs a ResNet"), std::string::npos);
  EXPECT_NE(bad([](TrainConfig& c) { c.conv_bn_chain = true; }).find("--conv-bn-chain: smallcnn has no residual"),
            std::string::npos);
  EXPECT_NE(bad([](TrainConfig& c) { c.data = "/no/such/folder"; }).find("no such folder"), std::string::npos);
  const auto dir = temp_dir();
  EXPECT_NE(bad([&](TrainConfig& c) { c.data = dir.string(); }).find("empty"), std::string::npos);
  std::filesystem::remove_all(dir);
  if (!cuda_available()) {
    EXPECT_NE(bad([](TrainConfig& c) { c.device = "cuda"; }).find("--device cuda"), std::string::npos);
  }
  EXPECT_NE(bad([](TrainConfig& c) { c.device = "tpu"; }).find("cpu, cuda or cuda:N"), std::string::npos);
}

// --amp takes an optional dtype: alone (or f16, or a config file's "amp = true") it is f16 with the
// gradient scaler, bf16 is bf16 autocast without one; anything else is refused naming the fix.
TEST(ExperimentsConfig, AmpTakesF16OrBf16) {
  const auto parsed = [](std::vector<std::string> args) {
    TrainConfig c;
    CLI::App app;
    add_config_flag(app);
    add_train_flags(app, c);
    EXPECT_EQ(parse(app, args), -1);
    return c;
  };
  EXPECT_FALSE(parsed({}).amp);
  for (const auto& args : {std::vector<std::string>{"--amp"}, {"--amp", "f16"}, {"--amp=F16"}}) {
    const TrainConfig c = parsed(args);
    EXPECT_TRUE(c.amp && c.uses_grad_scaler() && c.resolved_amp_dtype() == DType::f16) << args.back();
  }
  const TrainConfig b = parsed({"--amp", "bf16", "--epochs", "2"});
  EXPECT_TRUE(b.amp);
  EXPECT_EQ(b.resolved_amp_dtype(), DType::bf16);
  EXPECT_FALSE(b.uses_grad_scaler());
  EXPECT_EQ(b.epochs, 2);
  const auto dir = temp_dir();
  for (const auto& [line, amp, dtype] : {std::tuple<const char*, bool, DType>{"amp = true\n", true, DType::f16},
                                         {"amp = bf16\n", true, DType::bf16},
                                         {"amp = false\n", false, DType::f16}}) {
    std::ofstream(dir / "run.toml") << line;
    const TrainConfig c = parsed({"--config", (dir / "run.toml").string()});
    EXPECT_EQ(c.amp, amp) << line;
    EXPECT_EQ(c.resolved_amp_dtype(), dtype) << line;
  }
  std::filesystem::remove_all(dir);
  const auto bad = [](auto edit) {
    TrainConfig c = testing::tiny_config();
    edit(c);
    return error_of([&] { validate(c); });
  };
  EXPECT_NE(bad([](TrainConfig& c) { c.amp = true, c.amp_dtype = "f8"; }).find("--amp 'f8': expected f16 or bf16"),
            std::string::npos);
}

// --conv-bn-chain reaches the ResNet the run builds (and so the dry runs, which build the same), and
// results.json's config records it.
TEST(ExperimentsConfig, ConvBnChainSwitchesTheResNetsBlocks) {
  for (const bool chain : {false, true}) {
    TrainConfig c;
    CLI::App app;
    add_train_flags(app, c);
    std::vector<std::string> args{"--model", "resnet18-small"};
    if (chain) args.push_back("--conv-bn-chain");
    ASSERT_EQ(parse(app, args), -1);
    validate(c);
    const train::Model m = train::make_model(c, 3);
    ASSERT_NE(m.resnet, nullptr);
    EXPECT_EQ(m.resnet->options().conv_bn_chain, chain);
    EXPECT_EQ(to_json(c).at("conv_bn_chain").get<bool>(), chain);   // results.json's config says which
  }
}

TEST(ExperimentsConfig, SplitAndCheckpointSpecs) {
  const SplitSpec counts = parse_split("600,200,200");
  EXPECT_TRUE(counts.counts);
  EXPECT_EQ(counts.parts, (std::vector<double>{600, 200, 200}));
  const SplitSpec fr = parse_split("0.8,0.1,0.1");
  EXPECT_FALSE(fr.counts);
  EXPECT_THROW(parse_split("0.8,0.3,0.1"), UsageError);
  EXPECT_THROW(parse_split("0,5,5"), UsageError);
  EXPECT_EQ(parse_checkpoint("sequential:4").segments, 4);
  EXPECT_EQ(parse_checkpoint("stages").kind, CheckpointSpec::Kind::Stages);
  EXPECT_THROW(parse_checkpoint("sequential:0"), UsageError);
  EXPECT_THROW(parse_checkpoint("every-other"), UsageError);
  EXPECT_EQ(parse_int_list("--batch-sizes", "16,32"), (std::vector<int64_t>{16, 32}));
  EXPECT_THROW(parse_int_list("--batch-sizes", "16,0"), UsageError);
}

TEST(ExperimentsConfig, BudgetBelowTheModelIsAUsageError) {
  TrainConfig c = testing::tiny_config();
  c.memory_budget = "100000";  // the 8x8 small CNN has ~66k parameters: 264 KB of weights alone
  const std::string msg = error_of([&] { run_training(c); });
  EXPECT_NE(msg.find("smaller than the model itself"), std::string::npos) << msg;
}

// The programs themselves: bad input is one line on stderr and exit status 2.
TEST(ExperimentsPrograms, BadInputExitsWithStatus2) {
  const std::string train = program("minidl-train").string();
  if (!std::filesystem::exists(train)) GTEST_SKIP() << "minidl-train is not built beside the tests";
  EXPECT_EQ(run_status(train + " --batch-size 0"), 2);
  EXPECT_EQ(run_status(train + " --bogus"), 2);
  EXPECT_EQ(run_status(train + " --data /no/such/folder"), 2);
  EXPECT_EQ(run_status(train + " --memory-budget 1MiB"), 2);
  EXPECT_EQ(run_status(train + " --help"), 0);
  if (!cuda_available()) {
    EXPECT_EQ(run_status(train + " --device cuda"), 2);
  }
  const std::string maxbatch = program("minidl-maxbatch").string();
  if (std::filesystem::exists(maxbatch)) {
    EXPECT_EQ(run_status(maxbatch + " --image-size 8"), 2) << "no --memory-budget";
    EXPECT_EQ(run_status(maxbatch + " --margin 2 --memory-budget 1GiB"), 2);
  }
  const std::string sweep = program("minidl-sweep").string();
  if (std::filesystem::exists(sweep)) {
    EXPECT_EQ(run_status(sweep + " --study nosuch"), 2);
    EXPECT_EQ(run_status(sweep + " --batch-sizes 8,-1"), 2);
  }
}

// bf16 autocast end to end on the CPU: a ResNet trains, its epoch losses are finite, and
// results.json says which precision ran.
TEST(ExperimentsPrograms, AmpBf16TrainsOnTheCpu) {
  if (!std::filesystem::exists(program("minidl-train"))) GTEST_SKIP() << "minidl-train is not built beside the tests";
  const auto dir = temp_dir();
  const testing::Outcome o = testing::train("--model resnet18-small --image-size 16 --split 8,4,4 --batch-size 4 "
                                            "--epochs 1 --workers 0 --amp bf16 --out " + dir.string());
  ASSERT_EQ(o.status, 0) << o.output;
  std::ifstream in(dir / "results.json");
  const nlohmann::json j = nlohmann::json::parse(in);
  EXPECT_EQ(j.at("config").at("amp_dtype"), "bf16");
  EXPECT_EQ(j.at("result").at("status"), "ok");
  for (const auto& e : j.at("result").at("epochs")) EXPECT_TRUE(e.at("train_loss").is_number()) << e.dump();
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace minidl::harness
