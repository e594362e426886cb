// The conv-bn-chain study: its runs (per seed, the same run with batch norm and with the chain),
// and what its outputs conclude from finished runs (records made here, so no training runs): the
// per-epoch comparison with the batch norm runs' seed-to-seed range, the paired differences, the
// loss plot's data and the count of fused calls.
#include <gtest/gtest.h>


#include "experiments/harness/sweep.h"
#include "tests/experiments/helpers.h"

namespace minidl::harness {
namespace {

TEST(ExperimentsConvBnChainStudy, EachSeedTrainsTheSameRunWithAndWithoutTheChain) {
  TrainConfig base;
  base.seed = 7;
  const Study full = make_study("conv-bn-chain", false, base);
  ASSERT_EQ(full.runs.size(), 6u);
  EXPECT_EQ(full.seeds, 3);
  for (size_t i = 0; i < full.runs.size(); i += 2) {
    const TrainConfig& bn = full.runs[i].config;
    TrainConfig chain = full.runs[i + 1].config;
    EXPECT_FALSE(bn.conv_bn_chain);
    EXPECT_TRUE(chain.conv_bn_chain);
    EXPECT_EQ(full.runs[i].group, "batch norm");
    EXPECT_EQ(full.runs[i + 1].group, "conv-bn chain");
    EXPECT_EQ(full.runs[i + 1].id, "chain-s" + std::to_string(7 + i / 2));
    chain.conv_bn_chain = false;
    EXPECT_EQ(to_json(chain), to_json(bn)) << "a pair differs only in the chain";
  }
  const TrainConfig& c = full.runs[0].config;
  EXPECT_EQ(c.model, "resnet50");
  EXPECT_EQ(c.image_size, 224);
  EXPECT_EQ(c.split, "600,200,200");
  EXPECT_TRUE(c.amp && c.uses_grad_scaler());
  EXPECT_EQ(c.batch_size, 32);
  EXPECT_EQ(c.epochs, 8) << "about 300 steps over 1200 training photos";
  TrainConfig bf16 = base;
  bf16.amp = true;
  bf16.amp_dtype = "bf16";
  EXPECT_EQ(make_study("conv-bn-chain", false, bf16).runs[1].config.resolved_amp_dtype(), DType::bf16);
  const Study quick = make_study("conv-bn-chain", true, base);
  EXPECT_FALSE(quick.runs[0].config.amp) << "the CPU check runs f32 unless asked";
  EXPECT_EQ(quick.runs[0].config.model, "resnet18-small");
}

// A finished run's record as runs.jsonl holds it: the training loss after each epoch and the
// conv2d_stats calls.
nlohmann::json record(const std::vector<double>& losses, int64_t fused, int64_t composed) {
  nlohmann::json epochs = nlohmann::json::array();
  for (size_t k = 0; k < losses.size(); ++k)
    epochs.push_back({{"epoch", k + 1}, {"steps", 10 * (k + 1)}, {"train_loss", losses[k]}});
  return {{"status", "ok"},
          {"result",
           {{"epochs", epochs},
            {"conv_stats",
             {{"fused_forward", fused}, {"composed_forward", composed}, {"fused_backward", fused},
              {"composed_backward", composed}}}}}};
}

TEST(ExperimentsConvBnChainStudy, ComparesTheChainsLossWithTheBatchNormRunsSpread) {
  const Study st = make_study("conv-bn-chain", true, TrainConfig{});
  ASSERT_TRUE(st.extra_outputs);
  std::map<std::string, nlohmann::json> runs;
  // Epoch 1 and 2: the chain within batch norm's range; epoch 3: below it.
  runs["bn-s0"] = record({0.70, 0.60, 0.50}, 0, 40);
  runs["bn-s1"] = record({0.72, 0.62, 0.52}, 0, 40);
  runs["bn-s2"] = record({0.69, 0.61, 0.49}, 0, 40);
  runs["chain-s0"] = record({0.701, 0.602, 0.40}, 30, 10);
  runs["chain-s1"] = record({0.719, 0.618, 0.41}, 30, 10);
  runs["chain-s2"] = record({0.690, 0.611, 0.42}, 30, 10);
  const auto dir = testing::temp_dir();
  const std::string md = st.extra_outputs(st, CsvTable{}, runs, dir);
  EXPECT_NE(md.find("at 2 of 3 epochs"), std::string::npos) << md;
  EXPECT_NE(md.find("| 3 | 30 | 0.5033 +- 0.0153 [0.4900, 0.5200] | 0.4100 +- 0.0100 | -0.0933 | 0.1100 | **no** |"),
            std::string::npos)
      << md;
  EXPECT_NE(md.find("| 1 | 10 |"), std::string::npos) << md;
  EXPECT_NE(md.find("the largest paired difference is 0.1100"), std::string::npos) << md;
  EXPECT_NE(md.find("180 of 240 ran as the backend's fused graphs"), std::string::npos) << md;
  const std::string dat = testing::read_text(dir / "conv-bn-chain-loss.png.dat");
  EXPECT_NE(dat.find("\"batch norm\""), std::string::npos) << dat;
  EXPECT_NE(dat.find("\"conv-bn chain\""), std::string::npos) << dat;
  // One seed of each finished: no spread to judge by; a path without a finished run: no table.
  const std::map<std::string, nlohmann::json> one{{"bn-s0", runs["bn-s0"]}, {"chain-s0", runs["chain-s0"]}};
  EXPECT_NE(st.extra_outputs(st, CsvTable{}, one, dir).find("One seed per path so far"), std::string::npos);
  const std::map<std::string, nlohmann::json> bn_only{{"bn-s0", runs["bn-s0"]}};
  EXPECT_NE(st.extra_outputs(st, CsvTable{}, bn_only, dir).find("No finished pair of runs yet"), std::string::npos);
  // A CPU study composes every call, and says what that means for the comparison.
  runs["chain-s0"] = record({0.70, 0.60, 0.50}, 0, 40);
  runs["chain-s1"] = record({0.70, 0.60, 0.50}, 0, 40);
  runs["chain-s2"] = record({0.70, 0.60, 0.50}, 0, 40);
  const std::string cpu = st.extra_outputs(st, CsvTable{}, runs, dir);
  EXPECT_NE(cpu.find("at 3 of 3 epochs"), std::string::npos) << cpu;
  EXPECT_NE(cpu.find("0 of 240 ran as the backend's fused graphs"), std::string::npos) << cpu;
  EXPECT_NE(cpu.find("not cuDNN's fused kernels"), std::string::npos) << cpu;
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace minidl::harness
