// Planning for a GPU from a machine without one (experiments/harness/gpu_plan.h): --gpu names a GPU
// or its memory, the budget is that memory less the CUDA context (or --memory-budget within it),
// and minidl-memest and minidl-maxbatch answer from the dry run on meta:cuda without touching a
// GPU. In a build without the CUDA backend a plan is refused with the fix.
#include <gtest/gtest.h>

#include "core/backend.h"
#include "experiments/harness/gpu_plan.h"
#include "experiments/harness/maxbatch.h"
#include "experiments/harness/memest.h"
#include "tests/experiments/helpers.h"

namespace minidl::harness {
namespace {

TrainConfig planned(const std::string& gpu) {
  TrainConfig c = testing::tiny_config();
  c.image_size = 16;
  c.device = "cuda";
  c.gpu = gpu;
  return c;
}

std::string usage_error(const std::function<void()>& f) {
  try {
    f();
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(GpuPlan, NamesAndSizes) {
  EXPECT_EQ(parse_gpu("H100").total_bytes, int64_t{81559} << 20);
  EXPECT_EQ(parse_gpu("rtx-2080ti").total_bytes, int64_t{11264} << 20);
  EXPECT_EQ(parse_gpu("24GiB").total_bytes, int64_t{24} << 30);
  const std::string bad = usage_error([] { parse_gpu("h1000"); });
  EXPECT_NE(bad.find("--gpu 'h1000': expected one of h100, h200, a100-80gb"), std::string::npos) << bad;
  EXPECT_NE(bad.find("24GiB"), std::string::npos) << bad;
}

TEST(GpuPlan, TheBudgetIsTheGpusMemoryLessItsContext) {
  TrainConfig c = planned("h100");
  EXPECT_EQ(plan_budget(c), (int64_t{81559} << 20) - kCudaContextBytes);
  c.memory_budget = "11GiB";
  EXPECT_EQ(plan_budget(c), int64_t{11} << 30);
  c.memory_budget = "80GiB";
  const std::string over = usage_error([&] { plan_budget(c); });
  EXPECT_NE(over.find("--memory-budget 80GiB is more than NVIDIA H100 80GB HBM3 leaves to tensors"), std::string::npos)
      << over;
  c = planned("h100");
  c.device = "cpu";
  EXPECT_NE(usage_error([&] { plan_budget(c); }).find("add --device cuda"), std::string::npos);
}

TEST(GpuPlan, MemestPlansWithoutAGpu) {
  if (!cuda_built()) {
    EXPECT_NE(usage_error([] { run_memest(planned("h100"), {4}); }).find("no CUDA backend"), std::string::npos);
    GTEST_SKIP() << "a build without CUDA refuses --gpu (checked)";
  }
  const MemestReport rep = run_memest(planned("l4"), {4, 16});
  ASSERT_EQ(rep.rows.size(), 2u);
  EXPECT_NE(rep.device.find("a plan for NVIDIA L4"), std::string::npos) << rep.device;
  EXPECT_NE(rep.device.find("meta:cuda"), std::string::npos) << rep.device;
  for (const MemestRow& r : rep.rows) {
    EXPECT_TRUE(r.estimate.ok);
    EXPECT_FALSE(r.measured) << "a plan runs no step";
  }
  EXPECT_GT(rep.rows[1].estimate.peak_allocated, rep.rows[0].estimate.peak_allocated);
  if (cuda_device_count() == 0) {
    EXPECT_NE(rep.device.find("workspace-free algorithms"), std::string::npos) << rep.device;
  }
}

// CUDA graphs by default: each batch's dry run captures after its eager step, and a batch whose
// capture does not fit falls back to eager steps, as the run would; the
// report says which. Required graphs (--cuda-graphs) make that batch over the budget instead.
TEST(GpuPlan, MemestSaysWhichBatchesReplayAGraph) {
  if (!cuda_built()) GTEST_SKIP() << "no CUDA backend in this build";
  TrainConfig c = planned("l4");
  c.memory_budget = "40MiB";
  const MemestReport rep = run_memest(c, {2, 320});
  ASSERT_EQ(rep.rows.size(), 2u);
  EXPECT_TRUE(rep.graphs);
  EXPECT_TRUE(rep.rows[0].estimate.graphed);
  ASSERT_TRUE(rep.rows[1].estimate.ok);
  EXPECT_FALSE(rep.rows[1].estimate.graphed);
  const std::string note = memest_graphs_note(rep);
  EXPECT_NE(note.find("except at batch 320, whose capture does not fit"), std::string::npos) << note;
  c.cuda_graphs = true;
  EXPECT_FALSE(run_memest(c, {320}).rows[0].estimate.ok) << "required graphs: the capture's OOM is the answer";
  c.cuda_graphs = false;
  const MemestReport eager = run_memest(c, {2});
  EXPECT_FALSE(eager.rows[0].estimate.graphed);
  EXPECT_EQ(memest_graphs_note(eager), "");
  // The capture released the eager cache first: its pool grew into that memory, not beside it.
  EXPECT_EQ(eager.rows[0].estimate.peak_reserved, rep.rows[0].estimate.peak_reserved);
  // With 4 micro-batches a window, 32 training images hold four windows at 2, and none at 12 (two
  // micro-batches and a smaller one): that batch's one step is an eager trailing window.
  c.cuda_graphs.reset();
  c.accumulation_steps = 4;
  const MemestReport windows = run_memest(c, {2, 12});
  ASSERT_EQ(windows.rows.size(), 2u);
  EXPECT_TRUE(windows.rows[0].estimate.graphed);
  EXPECT_FALSE(windows.rows[0].estimate.windowless);
  ASSERT_TRUE(windows.rows[1].estimate.ok);
  EXPECT_FALSE(windows.rows[1].estimate.graphed);
  EXPECT_TRUE(windows.rows[1].estimate.windowless);
  const std::string windowless = memest_graphs_note(windows);
  EXPECT_NE(windowless.find("except at batch 12, whose epoch holds fewer micro-batches than a window"),
            std::string::npos) << windowless;
}

TEST(GpuPlan, MaxbatchAnswersFromTheDryRunAlone) {
  if (!cuda_built()) GTEST_SKIP() << "no CUDA backend in this build";
  TrainConfig c = planned("1GiB");
  c.memory_budget = "24MiB";
  MaxBatchOptions o;
  o.steps = 2;
  const MaxBatchReport rep = run_maxbatch(c, o, false);
  EXPECT_GT(rep.finder.max_batch, 1) << rep.text;
  EXPECT_EQ(rep.finder.max_batch, rep.finder.dry_max_batch);
  EXPECT_FALSE(rep.finder.confirmed);
  EXPECT_NE(rep.text.find("not tried on a GPU"), std::string::npos) << rep.text;
  EXPECT_EQ(rep.budget_bytes, int64_t{24} << 20);
  o.profile = true;
  EXPECT_NE(usage_error([&] { run_maxbatch(c, o, false); }).find("--profile times real steps"), std::string::npos);
}

}  // namespace
}  // namespace minidl::harness
