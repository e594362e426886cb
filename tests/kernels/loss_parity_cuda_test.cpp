// CPU-vs-CUDA parity of the fused losses (kernels/cpu/loss.cpp vs kernels/cuda/loss.cu):
// softmax cross-entropy with and without label smoothing and BCE-with-logits, forward and
// backward, at odd shapes, f32/f64/f16, every reduction, large logits, and the target check.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/generator.h"
#include "core/ops.h"
#include "tests/support/error_of.h"
#include "tests/support/parity_helpers.h"

namespace minidl {
namespace {

using namespace testing::parity;   // NOLINT: the shared harness (tests/support/parity_helpers.h)

class LossParity : public Parity {};

const char* reduction_name(Reduction r) {
  return r == Reduction::None ? "none" : r == Reduction::Sum ? "sum" : "mean";
}

// Class indices in [0, C), the same on both backends.
Tensor labels(int64_t N, int64_t C, uint64_t seed) {
  Generator g(seed);
  return (rand({N}, {DType::f64}, &g) * static_cast<double>(C)).to(DType::i64);
}

// check_op calls fn on the CPU inputs first, then on the GPU ones: each call gets its side's target.
void check_cross_entropy(int64_t N, int64_t C, DType dt, double eps, Reduction r, double scale, bool noncontig) {
  const Tensor tc = labels(N, C, static_cast<uint64_t>(N * 1000 + C));
  const Tensor tg = to_target(tc);
  int calls = 0;
  const std::string name = std::string("cross_entropy (") + reduction_name(r) + ", eps " + std::to_string(eps) +
                           ", logits x" + std::to_string(scale) + ")";
  check_op(name,
           [&](const std::vector<Tensor>& v) { return cross_entropy(v[0] * scale, calls++ == 1 ? tg : tc, r, eps); },
           {{N, C}}, dt, noncontig, true);
}

TEST_F(LossParity, CrossEntropyOddShapesSmoothingAndReductions) {
  for (DType dt : {DType::f32, DType::f16, DType::f64}) {
    for (const auto& [N, C] : std::vector<std::pair<int64_t, int64_t>>{{7, 1000}, {3, 2}, {1, 1}, {300, 10}, {5, 33}}) {
      for (double eps : {0.0, 0.1}) {
        for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
          check_cross_entropy(N, C, dt, eps, r, 1.0, false);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST_F(LossParity, CrossEntropyLargeLogitsAndStridedInputs) {
  for (DType dt : {DType::f32, DType::f16}) {
    // |logits| up to 1e4 (f16 holds them): exp must only ever see x - max <= 0.
    check_cross_entropy(7, 1000, dt, 0.1, Reduction::Mean, 5000.0, false);
    check_cross_entropy(3, 2, dt, 0.0, Reduction::None, 5000.0, false);
    // A transposed view: the front-end makes it contiguous before the kernel.
    check_cross_entropy(9, 31, dt, 0.1, Reduction::Sum, 1.0, true);
    if (HasFatalFailure()) return;
  }
}

TEST_F(LossParity, CrossEntropyFromAutocastF16LogitsIsF32) {
  // Under autocast the logits are widened and the loss is f32 on both backends.
  const Tensor tc = labels(7, 1000, 3), tg = to_target(tc);
  int calls = 0;
  check_op("cross_entropy of f16 logits cast to f32",
           [&](const std::vector<Tensor>& v) { return cross_entropy(v[0].to(DType::f32), calls++ == 1 ? tg : tc); },
           {{7, 1000}}, DType::f16, false, true);
}

TEST_F(LossParity, BceWithLogitsForwardBackward) {
  for (DType dt : {DType::f32, DType::f16, DType::f64}) {
    for (const Shape& s : {Shape{33, 1}, Shape{7, 1000}, Shape{4099}, Shape{2, 3, 5}}) {
      for (Reduction r : {Reduction::None, Reduction::Mean, Reduction::Sum}) {
        for (bool nc : {false, true}) {
          const std::string name = std::string("binary_cross_entropy_with_logits (") + reduction_name(r) + ")";
          // Soft targets that need a gradient too (through sigmoid), and logits up to |8|.
          check_op(name,
                   [r](const std::vector<Tensor>& v) {
                     return binary_cross_entropy_with_logits(v[0] * 4.0, sigmoid(v[1]), r);
                   },
                   {s, s}, dt, nc, true);
          if (HasFatalFailure()) return;
        }
      }
    }
    // Hard 0/1 labels that need no gradient (gy undefined), large logits.
    const Tensor yc = rnd({5, 77}, dt, 9, 0.0, 2.0).to(DType::i64).to(dt), yg = to_target(yc);
    int calls = 0;
    check_op("binary_cross_entropy_with_logits (labels, |x| <= 1e4)",
             [&](const std::vector<Tensor>& v) {
               return binary_cross_entropy_with_logits(v[0] * 5000.0, calls++ == 1 ? yg : yc);
             },
             {{5, 77}}, dt, false, true);
    if (HasFatalFailure()) return;
  }
}

// The composed path (log_softmax + nll_loss) still has its own kernels: keep it covered.
TEST_F(LossParity, NllLossOverLogSoftmax) {
  for (DType dt : {DType::f32, DType::f64}) {
    for (const auto& [N, C] : std::vector<std::pair<int64_t, int64_t>>{{1, 2}, {7, 1000}, {300, 10}}) {
      const Tensor tc = labels(N, C, static_cast<uint64_t>(N * C)), tg = to_target(tc);
      int calls = 0;
      check_op("nll_loss (none)",
               [&](const std::vector<Tensor>& v) {
                 return nll_loss(log_softmax(v[0], 1), calls++ == 1 ? tg : tc, Reduction::None);
               },
               {{N, C}}, dt, false, true);
      if (HasFatalFailure()) return;
    }
  }
}

TEST_F(LossParity, OutOfRangeTargetsNameTheFirstBadRow) {
  const Tensor logits = to_target(rnd({4, 3}, DType::f32, 1));
  const Tensor bad = to_target(from_vector({0, 2, 3, 1}, {4}, {DType::i64}));
  std::string msg = testing::error_of([&] { cross_entropy(logits, bad); });
  EXPECT_NE(msg.find("target[2] = 3 is out of range for C = 3"), std::string::npos) << msg;
  // Several bad rows: the lowest is reported, whichever warp saw it first.
  const Tensor many = to_target(from_vector({0, 5, -1, 9}, {4}, {DType::i64}));
  msg = testing::error_of([&] { cross_entropy(logits, many, Reduction::Mean, 0.1); });
  EXPECT_NE(msg.find("target[1] = 5 is out of range for C = 3"), std::string::npos) << msg;
  // The device is still usable afterwards, and a good batch right after gives the CPU's loss.
  const Tensor good = from_vector({0, 2, 1, 1}, {4}, {DType::i64});
  EXPECT_TRUE(close(cross_entropy(logits.to(Device::cpu()), good), cross_entropy(logits, to_target(good)), 2e-5,
                    "cross_entropy after a rejected batch"));
}

// Repeated runs of the fused kernels give the same bits (no atomics in their arithmetic).
TEST_F(LossParity, FusedLossesAreDeterministic) {
  const Tensor x = rnd({7, 1000}, DType::f32, 5), t = labels(7, 1000, 6);
  auto run = [&] {
    Tensor xl = to_target(x).set_requires_grad(true);
    Tensor loss = cross_entropy(xl, to_target(t), Reduction::Mean, 0.1) +
                  binary_cross_entropy_with_logits(xl, sigmoid(to_target(x) * 0.5));
    loss.backward();
    return std::vector<Tensor>{loss, xl.grad()};
  };
  const std::vector<Tensor> a = run();
  for (int i = 0; i < 3; ++i) {
    const std::vector<Tensor> b = run();
    ASSERT_TRUE(bit_equal(a[0], b[0], "loss"));
    ASSERT_TRUE(bit_equal(a[1], b[1], "gradient"));
  }
}

}  // namespace
}  // namespace minidl
