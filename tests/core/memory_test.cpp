// Exact memory accounting on the CPU allocator: known allocation sequences give known statistics,
// the budget throws OutOfMemoryError with the numbers in the message, and everything returns to
// its earlier values after the caller drops its tensors (the maximum-batch finder relies on it).
#include <gtest/gtest.h>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "core/tensor.h"

namespace minidl {
namespace {

class Memory : public ::testing::Test {
 protected:
  void SetUp() override {
    set_memory_budget(Device::cpu(), 0);
    reset_peak_stats();
    base_ = memory_stats();
  }
  void TearDown() override { set_memory_budget(Device::cpu(), 0); }
  MemoryStats base_;
};

TEST_F(Memory, StatisticsAreExactForAKnownSequence) {
  {
    Tensor a = empty({1000});                        // 4000 bytes, block 4032
    Tensor b = empty({10}, {.dtype = DType::f64});    // 80 bytes, block 128
    MemoryStats s = memory_stats();
    EXPECT_EQ(s.allocated_bytes - base_.allocated_bytes, 4080);
    EXPECT_EQ(s.reserved_bytes - base_.reserved_bytes, 4032 + 128);
    EXPECT_EQ(s.num_allocs - base_.num_allocs, 2);
    Tensor v = a.view({10, 100});  // views allocate nothing
    EXPECT_EQ(memory_stats().num_allocs - base_.num_allocs, 2);
    {
      Tensor c = empty({250});  // 1000 bytes
      EXPECT_EQ(memory_stats().peak_allocated_bytes - base_.allocated_bytes, 5080);
    }
    s = memory_stats();
    EXPECT_EQ(s.allocated_bytes - base_.allocated_bytes, 4080);
    EXPECT_EQ(s.peak_allocated_bytes - base_.allocated_bytes, 5080);
    EXPECT_EQ(s.num_frees - base_.num_frees, 1);
  }
  MemoryStats s = memory_stats();
  EXPECT_EQ(s.allocated_bytes, base_.allocated_bytes);
  EXPECT_EQ(s.reserved_bytes, base_.reserved_bytes);
  reset_peak_stats();
  EXPECT_EQ(memory_stats().peak_allocated_bytes, base_.allocated_bytes);
}

TEST_F(Memory, BudgetThrowsWithNumbersAndRecovers) {
  set_memory_budget(Device::cpu(), static_cast<size_t>(base_.reserved_bytes) + 1024 * 1024);
  Tensor keep = empty({128 * 1024});  // 512 KiB: fits
  const MemoryStats before = memory_stats();
  try {
    Tensor big = empty({256 * 1024});  // 1 MiB more: over
    FAIL() << "expected OutOfMemoryError";
  } catch (const OutOfMemoryError& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("1.0 MiB"), std::string::npos) << msg;
    EXPECT_NE(msg.find("memory budget"), std::string::npos) << msg;
    EXPECT_EQ(e.requested(), 1024u * 1024u);
    EXPECT_EQ(e.in_use(), static_cast<size_t>(before.reserved_bytes));
  }
  MemoryStats after = memory_stats();
  EXPECT_EQ(after.num_ooms - before.num_ooms, 1);
  EXPECT_EQ(after.allocated_bytes, before.allocated_bytes);
  EXPECT_EQ(after.reserved_bytes, before.reserved_bytes);
  // An OutOfMemoryError is a minidl::Error.
  EXPECT_THROW(empty({1024 * 1024}), Error);
}

TEST_F(Memory, TrainingStepOomLeavesNoDrift) {
  // A forward/backward that runs out of memory midway; after catching, the statistics return to
  // where they were, a hundred times in a row.
  Tensor w = randn({256, 256}).set_requires_grad(true);
  const MemoryStats start = memory_stats();
  set_memory_budget(Device::cpu(), static_cast<size_t>(start.reserved_bytes) + 3 * 256 * 1024);
  for (int i = 0; i < 100; ++i) {
    try {
      Tensor x = ones({256, 256});
      Tensor h = relu(matmul(x, w));
      Tensor y = relu(matmul(h, w));
      Tensor loss = sum(matmul(y, w));
      loss.backward();
      FAIL() << "expected OutOfMemoryError";
    } catch (const OutOfMemoryError&) {
    }
    w.zero_grad();
    const MemoryStats now = memory_stats();
    ASSERT_EQ(now.allocated_bytes, start.allocated_bytes) << "iteration " << i;
    ASSERT_EQ(now.reserved_bytes, start.reserved_bytes) << "iteration " << i;
  }
}

TEST_F(Memory, ParseBytes) {
  EXPECT_EQ(parse_bytes("11GiB"), 11ull << 30);
  EXPECT_EQ(parse_bytes("512MiB"), 512ull << 20);
  EXPECT_EQ(parse_bytes("1.5GB"), 1500000000ull);
  EXPECT_EQ(parse_bytes("4096"), 4096ull);
  EXPECT_THROW(parse_bytes("lots"), Error);
  EXPECT_THROW(parse_bytes("3 parsecs"), Error);
}

}  // namespace
}  // namespace minidl
