// The calibration's join: per-launch times summed per kernel with the model's keys, and the
// comparison table against the model's TSV rows of the same configuration.
#include <gtest/gtest.h>

#include <sstream>

#include "perfmodel/calibrate.h"

namespace minidl::gpumodel {
namespace {

TEST(Calibration, LaunchesAreKeyedAsTheModelKeysThem) {
  EXPECT_EQ(launch_key("batch_norm apply", "(apply_kernel<T>)"), "batch_norm apply / (apply_kernel<T>)");
  EXPECT_EQ(launch_key("cuDNN conv forward", ""), "cuDNN conv forward");
}

TEST(Calibration, TimesAreSummedPerKernelAndPerStep) {
  const std::vector<TimedLaunch> t = {{"relu / (unary_vec_kernel<T>)", 0.010}, {"cuDNN conv forward", 0.500},
                                      {"relu / (unary_vec_kernel<T>)", 0.030}, {"cuDNN conv forward", 0.700}};
  const std::vector<MeasuredRow> rows = per_kernel_measured(t, 2);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].key, "cuDNN conv forward");   // costliest first
  EXPECT_DOUBLE_EQ(rows[0].us, 600.0);            // (500 + 700) µs over 2 steps
  EXPECT_DOUBLE_EQ(rows[0].launches, 1.0);
  EXPECT_DOUBLE_EQ(rows[1].us, 20.0);
}

TEST(Calibration, TheModelsRowsOfOneConfigurationAreJoinedWithTheMeasuredOnes) {
  std::istringstream tsv(
      "# modelled, not measured: the label line minidl-gpumodel --tsv writes first\n"
      "resnet50-amp-b256-i224\tcuDNN conv forward\t53\t5000.000\t123\tf16 tensor\n"
      "resnet50-amp-b256-i224\trelu / (unary_vec_kernel<T>)\t49\t2000.000\t456\tHBM\n"
      "resnet50-fp32-b256-i224\tcuDNN conv forward\t53\t9000.000\t123\ttf32 tensor\n");
  const std::vector<ModelledRow> m = read_modelled(tsv, "resnet50-amp-b256-i224");
  ASSERT_EQ(m.size(), 2u);
  EXPECT_DOUBLE_EQ(m[0].us, 5000.0);
  const std::string table =
      comparison_table(m, {{"cuDNN conv forward", 53, 10000.0}, {"copy / (copy_contig_kernel<D, S>)", 2, 30.0}},
                       20.0, 256);
  EXPECT_NE(table.find("| `cuDNN conv forward` | 53 | 53 | 5000.0 | 10000.0 | 2.00 |"), std::string::npos) << table;
  // A key on one side only is still listed, with no ratio.
  EXPECT_NE(table.find("| `relu / (unary_vec_kernel<T>)` | 49 | 0 | 2000.0 | 0.0 | - |"), std::string::npos) << table;
  EXPECT_NE(table.find("| `copy / (copy_contig_kernel<D, S>)` | 0 | 2 | 0.0 | 30.0 | - |"), std::string::npos) << table;
  EXPECT_NE(table.find("12800 images/s"), std::string::npos) << table;   // 256 images in 20 ms
}

// The host's time: per key inside its launches or library calls, and the rest of the step.
TEST(Calibration, HostTimeIsSplitBetweenTheCallsAndTheRest) {
  const std::vector<TimedLaunch> t = {{"cuDNN conv forward", 0.5, 0.080}, {"relu / (unary_vec_kernel<T>)", 0.01, 0.004},
                                      {"cuDNN conv forward", 0.7, 0.120}, {"relu / (unary_vec_kernel<T>)", 0.03, 0.006}};
  const std::vector<MeasuredRow> rows = per_kernel_measured(t, 2);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_DOUBLE_EQ(rows[0].host_us, 100.0);   // (80 + 120) µs over 2 steps
  EXPECT_DOUBLE_EQ(rows[1].host_us, 5.0);
  const std::string table = host_table(rows, 0.5, 0.9, 10);
  EXPECT_NE(table.find("| the whole step (the host's calls) | 0.50 |"), std::string::npos) << table;
  EXPECT_NE(table.find("| inside the launches and library calls | 0.10 |"), std::string::npos) << table;   // 105 µs
  EXPECT_NE(table.find("| minidl's own work between them | 0.40 |"), std::string::npos) << table;
  EXPECT_NE(table.find("| `cuDNN conv forward` | 1 | 100.0 | 100.0 |"), std::string::npos) << table;
  EXPECT_LT(table.find("cuDNN conv forward"), table.find("relu"));   // costliest on the host first
  EXPECT_EQ(host_table(rows, 0.5, 0.9, 1).find("relu"), std::string::npos);   // only the top one
  EXPECT_EQ(table.find("bound"), std::string::npos) << "no GPU time given: no verdict";
  // With the GPU's own time: which side sets the pace.
  const std::string host_bound = host_table(rows, 0.5, 0.9, 10, 0.6);
  EXPECT_NE(host_bound.find("| the GPU's own work (the gated launches) | 0.60 |"), std::string::npos) << host_bound;
  EXPECT_NE(host_bound.find("Host-bound: the GPU's launches fill 67% of the wall; the GPU waits for the host 0.30 ms"),
            std::string::npos) << host_bound;
  const std::string gpu_bound = host_table(rows, 0.5, 0.9, 10, 0.85);
  EXPECT_NE(gpu_bound.find("GPU-bound: the GPU's launches fill 94% of the wall"), std::string::npos) << gpu_bound;
}

}  // namespace
}  // namespace minidl::gpumodel
