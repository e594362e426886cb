// The process group's collectives give the right numbers on every rank, for every dtype the CPU
// transport carries. Runs as one rank in the plain suite and as two under mpirun (ctest distributed.mpi2.*),
// so every expectation is written for any world size W.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "core/ops.h"
#include "distributed/process_group.h"
#include "tests/support/error_of.h"

namespace minidl::distributed {
namespace {
using minidl::testing::error_of;

TEST(DistCollectives, AllreduceSumMeanMaxMinPerDtype) {
  ProcessGroup& g = world();
  const int r = g.rank();
  const int w = g.world_size();
  for (DType dt : {DType::f32, DType::f64, DType::f16, DType::bf16}) {
    // Rank r holds [r + 1, -(r + 1), 0.5 * r]: sums, means and extremes have closed forms.
    const std::vector<double> v{r + 1.0, -(r + 1.0), 0.5 * r};
    Tensor t = from_vector(v, {3}, {.dtype = dt});
    g.allreduce(t, ReduceOp::Sum);
    const double s = w * (w + 1) / 2.0;
    EXPECT_EQ(t.to_vector(), (std::vector<double>{s, -s, 0.5 * (w - 1) * w / 2.0})) << dtype_name(dt);
    t = from_vector(v, {3}, {.dtype = dt});
    g.allreduce(t, ReduceOp::Mean);
    EXPECT_NEAR(t.to_vector()[0], (w + 1) / 2.0, 1e-3) << dtype_name(dt);
    t = from_vector(v, {3}, {.dtype = dt});
    g.allreduce(t, ReduceOp::Max);
    EXPECT_EQ(t.to_vector(), (std::vector<double>{double(w), -1.0, 0.5 * (w - 1)})) << dtype_name(dt);
    t = from_vector(v, {3}, {.dtype = dt});
    g.allreduce(t, ReduceOp::Min);
    EXPECT_EQ(t.to_vector(), (std::vector<double>{1.0, -double(w), 0.0})) << dtype_name(dt);
  }
  for (DType dt : {DType::i32, DType::i64, DType::u8}) {
    Tensor t = full({4}, r + 1.0, {.dtype = dt});
    g.allreduce(t, ReduceOp::Sum);
    EXPECT_EQ(t.to_vector(), std::vector<double>(4, w * (w + 1) / 2.0)) << dtype_name(dt);
  }
}

TEST(DistCollectives, NonFiniteValuesSurviveTheSum) {
  ProcessGroup& g = world();
  // The last rank contributes inf / NaN: every rank must see them (this is how a gradient
  // scaler's inf on one rank reaches all of them through the gradient average).
  const bool last = g.rank() == g.world_size() - 1;
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    Tensor t = from_vector({last ? INFINITY : 1.0, last ? NAN : 2.0}, {2}, {.dtype = dt});
    g.allreduce(t, ReduceOp::Mean);
    const auto v = t.to_vector();
    EXPECT_TRUE(std::isinf(v[0])) << dtype_name(dt);
    EXPECT_TRUE(std::isnan(v[1])) << dtype_name(dt);
  }
}

TEST(DistCollectives, AsyncAllreduceBroadcastBarrierAndScalars) {
  ProcessGroup& g = world();
  const int r = g.rank();
  const int w = g.world_size();
  Tensor a = full({1000}, 1.0);
  Tensor b = full({10}, 2.0, {.dtype = DType::f64});
  auto wa = g.allreduce_async(a, ReduceOp::Sum);
  auto wb = g.allreduce_async(b, ReduceOp::Mean);
  wb->wait();
  wa->wait();
  wa->wait();  // idempotent
  EXPECT_TRUE(wa->test());
  EXPECT_EQ(a.to_vector(), std::vector<double>(1000, double(w)));
  EXPECT_EQ(b.to_vector(), std::vector<double>(10, 2.0));

  const int root = w - 1;
  Tensor c = arange(0.0, 6.0, 1.0).view({2, 3}) * (r == root ? 1.0 : 0.0);
  g.broadcast(c, root);
  EXPECT_EQ(c.to_vector(), (std::vector<double>{0, 1, 2, 3, 4, 5}));
  g.barrier();
  EXPECT_EQ(g.allreduce(double(r), ReduceOp::Sum), w * (w - 1) / 2.0);
  EXPECT_EQ(g.any(r == w - 1), true);
  EXPECT_EQ(g.any(false), false);
  g.check_same("a value every rank agrees on", 7);
  if (w > 1) {
    const std::string e = error_of([&] { g.check_same("the batch count", 10 + r); });
    EXPECT_NE(e.find("the batch count differs across the"), std::string::npos) << e;
  }
}

TEST(DistCollectives, CountsCallsAndRejectsWhatItCannotCarry) {
  ProcessGroup& g = world();
  g.reset_counters();
  Tensor t = zeros({4, 4});
  g.allreduce(t);
  g.broadcast(t, 0);
  g.barrier();
  EXPECT_EQ(g.counters().allreduce, 1);
  EXPECT_EQ(g.counters().broadcast, 1);
  EXPECT_EQ(g.counters().barrier, 1);
  EXPECT_EQ(g.counters().allreduce_bytes, 64);
  // Checked on every rank before any communication, so no rank is left waiting.
  std::string e = error_of([&] { g.allreduce(t.t()); });
  EXPECT_NE(e.find("not contiguous"), std::string::npos) << e;
  EXPECT_NE(e.find("rank " + std::to_string(g.rank())), std::string::npos) << e;
  e = error_of([&] { g.allreduce(zeros({2}, {.dtype = DType::i64}), ReduceOp::Mean); });
  EXPECT_NE(e.find("mean needs a floating dtype"), std::string::npos) << e;
  e = error_of([&] { g.broadcast(t, g.world_size()); });
  EXPECT_NE(e.find("outside the world"), std::string::npos) << e;
  EXPECT_NE(g.describe().find("rank " + std::to_string(g.rank())), std::string::npos);
  std::printf("[dist] %s\n", g.describe().c_str());  // in the log: which world and engines ran
}

TEST(DistCollectives, CheckModeNamesAShapeMismatchOnEveryRank) {
  ProcessGroup& g = world();
  g.set_check_shapes(true);
  Tensor same = ones({5});
  g.allreduce(same);  // agreeing tensors pass
  EXPECT_EQ(same.to_vector(), std::vector<double>(5, double(g.world_size())));
  Tensor t = zeros({3 + g.rank()});
  const std::string e = error_of([&] { g.allreduce(t); });
  const std::string b = error_of([&] { g.broadcast(zeros({2}, {.dtype = g.rank() == 0 ? DType::f32 : DType::f64})); });
  g.set_check_shapes(false);
  if (g.world_size() > 1) {
    EXPECT_NE(e.find("the ranks disagree on the tensor (element counts 3 to 4)"), std::string::npos) << e;
    EXPECT_NE(e.find("rank " + std::to_string(g.rank())), std::string::npos) << e;
    EXPECT_NE(b.find("dtypes differ"), std::string::npos) << b;
  } else {
    EXPECT_EQ(e, "");
    EXPECT_EQ(b, "");
  }
}

}  // namespace
}  // namespace minidl::distributed
