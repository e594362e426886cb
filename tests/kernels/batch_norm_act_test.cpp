// The CPU reference of the fused batch norm + (residual add) + ReLU (core batch_norm_relu /
// batch_norm_add_relu, kernels/cpu/batch_norm.cpp): bit for bit the composed ops in f32 and f64
// (what keeps ResNet's golden tests and recomputation exact with the fused path on), the same
// bits in channels-last memory as in NCHW, f16 activations, the running statistics, and the
// argument errors. The GPU kernels are compared with this in batch_norm_act_cuda_test.cpp.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/generator.h"
#include "core/ops.h"
#include "tests/support/error_of.h"
#include "tests/support/parity_helpers.h"

namespace minidl {
namespace {

using testing::parity::bit_equal;
using testing::parity::rnd;

struct Result {
  Tensor y, gx, gr, gw, gb, rm, rv;
};

// relu(batch_norm(x) [+ r]), fused or composed, forward and backward on the CPU.
Result run(const Shape& s, DType dt, bool residual, bool training, bool fused, bool channels_last, uint64_t seed) {
  const int64_t C = s[1];
  const DType pd = dt == DType::f16 ? DType::f32 : dt;
  auto leaf = [&](Tensor t, bool cl) {
    if (cl) t = to_channels_last(t).detach();
    t.set_requires_grad(true);
    return t;
  };
  const Tensor x = leaf((rnd(s, DType::f32, seed) * 2.0 + 0.5).to(dt), channels_last);
  const Tensor r = residual ? leaf(rnd(s, dt, seed + 1), channels_last) : Tensor();
  const Tensor w = leaf(rnd({C}, pd, seed + 2, 0.5, 1.5), false), b = leaf(rnd({C}, pd, seed + 3), false);
  Result out;
  out.rm = rnd({C}, pd, seed + 4);
  out.rv = rnd({C}, pd, seed + 5, 0.5, 2.0);
  if (fused) {
    out.y = residual ? batch_norm_add_relu(x, r, w, b, out.rm, out.rv, training)
                     : batch_norm_relu(x, w, b, out.rm, out.rv, training);
  } else {
    const Tensor z = batch_norm(x, w, b, out.rm, out.rv, training);
    out.y = relu(residual ? z + r : z);
  }
  out.y.backward(rnd(s, dt, seed + 6));
  out.gx = x.grad();
  out.gr = residual ? r.grad() : Tensor();
  out.gw = w.grad();
  out.gb = b.grad();
  return out;
}

void expect_bit_equal(const Result& a, const Result& b, bool residual, bool grads, const std::string& what) {
  EXPECT_TRUE(bit_equal(a.y, b.y, what + " forward"));
  EXPECT_TRUE(bit_equal(a.rm, b.rm, what + " running_mean"));
  EXPECT_TRUE(bit_equal(a.rv, b.rv, what + " running_var"));
  if (!grads) return;
  EXPECT_TRUE(bit_equal(a.gx, b.gx, what + " grad x"));
  if (residual) {
    EXPECT_TRUE(bit_equal(a.gr, b.gr, what + " grad residual"));
  }
  EXPECT_TRUE(bit_equal(a.gw, b.gw, what + " grad weight"));
  EXPECT_TRUE(bit_equal(a.gb, b.gb, what + " grad bias"));
}

const std::vector<Shape> kShapes{{3, 5, 4, 6}, {4, 3, 1, 1}, {6, 4}, {2, 7, 5, 3}};

TEST(BatchNormAct, FusedEqualsTheComposedOpsBitForBitInF32AndF64) {
  for (DType dt : {DType::f32, DType::f64}) {
    for (const Shape& s : kShapes) {
      for (bool residual : {false, true}) {
        for (bool training : {true, false}) {
          const std::string what = std::string(dtype_name(dt)) + " " + shape_str(s) + (residual ? " +residual" : "") +
                                   (training ? " train" : " eval");
          const Result fused = run(s, dt, residual, training, true, false, 5);
          const Result composed = run(s, dt, residual, training, false, false, 5);
          // Evaluation's composed backward runs through tensor ops in the parameters' dtype, the
          // fused one in double: equal to rounding there, bit for bit everywhere else.
          expect_bit_equal(fused, composed, residual, training, what);
          if (!training) {
            EXPECT_TRUE(allclose(fused.gx, composed.gx, 1e-6, 1e-7)) << what;
            EXPECT_TRUE(allclose(fused.gw, composed.gw, 1e-6, 1e-7)) << what;
          }
        }
      }
    }
  }
}

TEST(BatchNormAct, ChannelsLastGivesTheNchwBitsInChannelsLastMemory) {
  for (DType dt : {DType::f32, DType::f16}) {
    for (bool residual : {false, true}) {
      for (bool training : {true, false}) {
        const Shape s{2, 5, 3, 4};
        const Result nchw = run(s, dt, residual, training, true, false, 9);
        const Result nhwc = run(s, dt, residual, training, true, true, 9);
        EXPECT_TRUE(is_channels_last(nhwc.y) && !nhwc.y.is_contiguous()) << nhwc.y.meta();
        expect_bit_equal(nchw, nhwc, residual, true, std::string(dtype_name(dt)) + (training ? " train" : " eval"));
      }
    }
  }
}

TEST(BatchNormAct, HalfActivationsRoundOnceFromTheF32Result) {
  for (bool residual : {false, true}) {
    const Shape s{4, 3, 5, 5};
    const Result h = run(s, DType::f16, residual, true, true, false, 21);
    const Result f = run(s, DType::f32, residual, true, true, false, 21);
    ASSERT_EQ(h.y.dtype(), DType::f16);
    ASSERT_EQ(h.gw.dtype(), DType::f32);
    // Inputs are the same f16 values widened: the forward differs from f32 by its last rounding.
    EXPECT_TRUE(allclose(h.y.to(DType::f32), f.y, 1e-3, 1e-3));
    EXPECT_TRUE(allclose(h.rv, f.rv, 1e-3, 1e-4));
  }
}

// f16 activations are read and written as f16 and computed in f32: the bits of the f32 kernel on
// the same values widened, each output rounded once to f16, with no f32 copy of any operand (the
// kernel used to stage all five operands of a backward through f32 tensors: 2.5x the activation
// memory of the composed ops under autocast, the maximum batch of ResNet-50 AMP on the CPU fell
// by 3%).
TEST(BatchNormAct, HalfActivationsGiveTheF32BitsWithoutF32Copies) {
  for (bool residual : {false, true}) {
    for (bool training : {true, false}) {
      SCOPED_TRACE(std::string(residual ? "+residual" : "") + (training ? " train" : " eval"));
      const Shape s{8, 32, 48, 48};
      const int64_t C = s[1];
      const Tensor xh = (rnd(s, DType::f32, 31) * 2.0 + 0.5).to(DType::f16);
      const Tensor rh = residual ? rnd(s, DType::f16, 32) : Tensor();
      const Tensor gyh = rnd(s, DType::f16, 33);
      auto pass = [&](DType dt, int64_t* backward_peak) {
        auto leaf = [&](const Tensor& t, DType as) {
          Tensor v = t.to(as).detach();
          v.set_requires_grad(true);
          return v;
        };
        const Tensor x = leaf(xh, dt), r = residual ? leaf(rh, dt) : Tensor();
        const Tensor w = leaf(rnd({C}, DType::f32, 34, 0.5, 1.5), DType::f32);
        const Tensor b = leaf(rnd({C}, DType::f32, 35), DType::f32);
        Result out;
        out.rm = rnd({C}, DType::f32, 36);
        out.rv = rnd({C}, DType::f32, 37, 0.5, 2.0);
        out.y = residual ? batch_norm_add_relu(x, r, w, b, out.rm, out.rv, training)
                         : batch_norm_relu(x, w, b, out.rm, out.rv, training);
        const Tensor gy = gyh.to(dt);
        reset_peak_stats();
        const int64_t before = memory_stats().allocated_bytes;
        out.y.backward(gy);
        *backward_peak = memory_stats().peak_allocated_bytes - before;
        out.gx = x.grad();
        out.gr = residual ? r.grad() : Tensor();
        out.gw = w.grad();
        out.gb = b.grad();
        return out;
      };
      int64_t peak_h = 0, peak_f = 0;
      const Result h = pass(DType::f16, &peak_h);
      Result f = pass(DType::f32, &peak_f);
      ASSERT_EQ(h.y.dtype(), DType::f16);
      f.y = f.y.to(DType::f16);
      f.gx = f.gx.to(DType::f16);
      if (residual) f.gr = f.gr.to(DType::f16);
      expect_bit_equal(h, f, residual, true, "f16 against f32 on the widened values");
      // The backward makes gx (and the residual's gradient): f16 tensors, nothing in f32.
      const int64_t f16_bytes = xh.numel() * 2;
      EXPECT_LE(peak_h, (residual ? 2 : 1) * f16_bytes + (1 << 16)) << "f32 f16-backward peaks " << peak_f << " "
                                                                      << peak_h;
    }
  }
}

TEST(BatchNormAct, RunningStatisticsFollowPyTorchAndSkipACheckpointRerun) {
  const Tensor x = rnd({4, 2, 3, 3}, DType::f64, 1);
  Tensor rm = zeros({2}, {.dtype = DType::f64}), rv = ones({2}, {.dtype = DType::f64});
  batch_norm_relu(x, Tensor(), Tensor(), rm, rv, true, 0.25);
  for (int64_t c = 0; c < 2; ++c) {
    const Tensor xc = x.select(1, c);
    const double m = mean(xc).item();
    const double var_unbiased = sum(square(xc - m)).item() / (xc.numel() - 1);
    EXPECT_NEAR(rm.to_vector()[c], 0.25 * m, 1e-12);
    EXPECT_NEAR(rv.to_vector()[c], 0.75 + 0.25 * var_unbiased, 1e-12);
  }
  const std::vector<double> before = rm.to_vector();
  {
    RecomputeGuard rerun;
    batch_norm_add_relu(x, x, Tensor(), Tensor(), rm, rv, true, 0.25);
  }
  EXPECT_EQ(rm.to_vector(), before);
}

TEST(BatchNormAct, ErrorsNameTheOpTheShapesAndTheFix) {
  const Tensor x = rnd({2, 3, 4, 4}, DType::f32, 1);
  const Tensor w = ones({3}), b = zeros({3}), rm = zeros({3}), rv = ones({3});
  const Tensor wide = rnd({2, 3, 4, 5}, DType::f32, 2);
  std::string e = testing::error_of([&] { batch_norm_add_relu(x, wide, w, b, rm, rv, true); });
  EXPECT_NE(e.find("batch_norm_add_relu: the residual [2, 3, 4, 5] must have the input's shape [2, 3, 4, 4]"),
            std::string::npos) << e;
  e = testing::error_of([&] { batch_norm_add_relu(x, x.to(DType::f64), w, b, rm, rv, true); });
  EXPECT_NE(e.find("must have one dtype; convert the residual with .to(DType::f32)"), std::string::npos) << e;
  e = testing::error_of([&] { batch_norm_relu(x, ones({4}), b, rm, rv, true); });
  EXPECT_NE(e.find("batch_norm_relu: weight has shape [4] but the input [2, 3, 4, 4] has 3 channels"),
            std::string::npos) << e;
  e = testing::error_of([&] { batch_norm_relu(rnd({1, 3}, DType::f32, 3), w, b, rm, rv, true); });
  EXPECT_NE(e.find("batch_norm_relu: training needs more than 1 value per channel"), std::string::npos) << e;
  e = testing::error_of([&] { batch_norm_relu(x, w, b, Tensor(), Tensor(), false); });
  EXPECT_NE(e.find("batch_norm_relu: evaluation mode (training=false) normalises with running_mean"),
            std::string::npos) << e;
  e = testing::error_of([&] { batch_norm_relu(x.to(DType::i32), w, b, rm, rv, true); });
  EXPECT_NE(e.find("batch_norm_relu: input [2, 3, 4, 4] has dtype i32"), std::string::npos) << e;
}

TEST(BatchNormAct, OtherStridesAreCopiedToContiguous) {
  // A transposed H/W view is neither NCHW nor channels-last: the op copies it and returns NCHW.
  Tensor base = rnd({2, 3, 5, 4}, DType::f32, 4);
  const Tensor xt = base.transpose(2, 3);
  ASSERT_FALSE(xt.is_contiguous() || is_channels_last(xt));
  const Tensor y = batch_norm_relu(xt, Tensor(), Tensor(), Tensor(), Tensor(), true);
  EXPECT_TRUE(y.is_contiguous());
  EXPECT_TRUE(bit_equal(y, batch_norm_relu(xt.contiguous(), Tensor(), Tensor(), Tensor(), Tensor(), true), "y"));
}

}  // namespace
}  // namespace minidl
