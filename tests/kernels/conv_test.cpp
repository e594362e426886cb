// conv2d (front-end, backward node and CPU kernels) checked against a direct-loop reference in
// f64 that follows PyTorch's definition, over the shapes the fast paths special-case (1x1, grouped
// small planes, strided, dilated, padded), plus the argument errors. Pooling is in pool_test.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "tests/support/conv_pool_helpers.h"

namespace minidl {
namespace {

using ::testing::HasSubstr;
using namespace testing::conv_pool;   // the suite's helpers, error_of among them

// ---------------------------------------------------------------- convolution reference

struct ConvCase {
  int64_t n, c, h, w, o, kh, kw, sh, sw, ph, pw, dh, dw;
  bool bias;
  int64_t oh() const { return (h + 2 * ph - dh * (kh - 1) - 1) / sh + 1; }
  int64_t ow() const { return (w + 2 * pw - dw * (kw - 1) - 1) / sw + 1; }
  Conv2dOptions opts() const { return {.stride = {sh, sw}, .padding = {ph, pw}, .dilation = {dh, dw}}; }
};

// Short, readable names for the parameterised cases in gtest and ctest output.
void PrintTo(const ConvCase& k, std::ostream* os) {
  *os << "x" << k.n << "x" << k.c << "x" << k.h << "x" << k.w << "_o" << k.o << "_k" << k.kh << "x" << k.kw << "_s"
      << k.sh << "x" << k.sw << "_p" << k.ph << "x" << k.pw << "_d" << k.dh << "x" << k.dw << (k.bias ? "_bias" : "");
}

struct ConvRef {
  Vec y, gx, gw, gb;
};

ConvRef conv_reference(const ConvCase& k, const Vec& x, const Vec& w, const Vec& b, const Vec& gy) {
  const int64_t oh = k.oh(), ow = k.ow();
  ConvRef r{Vec(k.n * k.o * oh * ow, 0.0), Vec(x.size(), 0.0), Vec(w.size(), 0.0), Vec(k.o, 0.0)};
  for (int64_t n = 0; n < k.n; ++n) {
    for (int64_t o = 0; o < k.o; ++o) {
      for (int64_t i = 0; i < oh; ++i) {
        for (int64_t j = 0; j < ow; ++j) {
          const int64_t yi = ((n * k.o + o) * oh + i) * ow + j;
          double acc = k.bias ? b[o] : 0.0;
          const double g = gy[yi];
          r.gb[o] += g;
          for (int64_t c = 0; c < k.c; ++c) {
            for (int64_t a = 0; a < k.kh; ++a) {
              for (int64_t e = 0; e < k.kw; ++e) {
                const int64_t ih = i * k.sh - k.ph + a * k.dh, iw = j * k.sw - k.pw + e * k.dw;
                if (ih < 0 || ih >= k.h || iw < 0 || iw >= k.w) continue;
                const int64_t xi = ((n * k.c + c) * k.h + ih) * k.w + iw;
                const int64_t wi = ((o * k.c + c) * k.kh + a) * k.kw + e;
                acc += x[xi] * w[wi];
                r.gx[xi] += g * w[wi];
                r.gw[wi] += g * x[xi];
              }
            }
          }
          r.y[yi] = acc;
        }
      }
    }
  }
  return r;
}

class ConvShapes : public ::testing::TestWithParam<ConvCase> {};

void run_conv_case(const ConvCase& k, DType dt, double tol) {
  const Shape xs{k.n, k.c, k.h, k.w}, ws{k.o, k.c, k.kh, k.kw}, ys{k.n, k.o, k.oh(), k.ow()};
  const Vec xv = random_vec(numel_of(xs), 1), wv = random_vec(numel_of(ws), 2), bv = random_vec(k.o, 3);
  const Vec gyv = random_vec(numel_of(ys), 4);
  const ConvRef ref = conv_reference(k, xv, wv, bv, gyv);

  Tensor x = make(xv, xs, dt, true), w = make(wv, ws, dt, true);
  Tensor b = k.bias ? make(bv, {k.o}, dt, true) : Tensor();
  Tensor y = conv2d(x, w, b, k.opts());
  ASSERT_EQ(y.shape(), ys);
  ASSERT_EQ(y.dtype(), dt);
  expect_near_vec(y.to_vector(), ref.y, tol, "forward");
  y.backward(make(gyv, ys, dt));
  expect_near_vec(x.grad().to_vector(), ref.gx, tol, "grad input");
  expect_near_vec(w.grad().to_vector(), ref.gw, tol, "grad weight");
  if (k.bias) expect_near_vec(b.grad().to_vector(), ref.gb, tol, "grad bias");
}

TEST_P(ConvShapes, MatchesDirectLoopF64) { run_conv_case(GetParam(), DType::f64, 1e-12); }
TEST_P(ConvShapes, MatchesDirectLoopF32) { run_conv_case(GetParam(), DType::f32, 2e-5); }

INSTANTIATE_TEST_SUITE_P(
    Conv, ConvShapes,
    ::testing::Values(
        //       n  c   h   w  o kh kw sh sw ph pw dh dw bias
        ConvCase{2, 3, 7, 7, 4, 3, 3, 1, 1, 1, 1, 1, 1, true},      // same padding, grouped samples
        ConvCase{2, 3, 8, 9, 5, 3, 3, 2, 2, 1, 1, 1, 1, false},     // stride 2, odd width
        ConvCase{1, 2, 9, 8, 3, 3, 3, 1, 1, 2, 2, 2, 2, true},      // dilation 2, N = 1
        ConvCase{3, 8, 5, 5, 6, 1, 1, 1, 1, 0, 0, 1, 1, true},      // 1x1 fast path, grouped
        ConvCase{2, 5, 17, 16, 4, 1, 1, 1, 1, 0, 0, 1, 1, false},   // 1x1 fast path, one sample per GEMM
        ConvCase{1, 4, 20, 20, 3, 1, 1, 1, 1, 0, 0, 1, 1, true},    // 1x1, N = 1 (Eigen threads)
        ConvCase{2, 4, 7, 7, 3, 1, 1, 2, 2, 0, 0, 1, 1, false},     // 1x1 stride 2 (downsample)
        ConvCase{2, 3, 6, 10, 4, 2, 5, 1, 2, 0, 2, 1, 1, true},     // non-square kernel and stride
        ConvCase{3, 2, 20, 18, 3, 3, 3, 1, 1, 1, 1, 1, 1, true},    // large planes, per-sample GEMM
        ConvCase{4, 3, 11, 9, 2, 3, 2, 2, 1, 0, 1, 1, 2, false},    // mixed stride / dilation
        ConvCase{2, 3, 16, 16, 4, 7, 7, 2, 2, 3, 3, 1, 1, false},   // ResNet stem
        ConvCase{5, 6, 4, 4, 7, 3, 3, 1, 1, 1, 1, 1, 1, true},      // odd batch, tiny planes
        ConvCase{3, 2, 5, 5, 2, 5, 5, 1, 1, 0, 0, 1, 1, true},      // kernel covers the input: 1x1 out
        ConvCase{2, 2, 3, 4, 3, 3, 3, 3, 3, 2, 2, 1, 1, true},      // padding larger than the overlap
        ConvCase{2, 64, 20, 20, 4, 3, 3, 1, 1, 1, 1, 1, 1, true},   // several row tiles per sample
        ConvCase{1, 64, 41, 20, 3, 3, 3, 2, 1, 1, 1, 1, 1, true},   // row tiles whose inputs overlap
        ConvCase{1, 600, 20, 20, 3, 1, 1, 1, 1, 0, 0, 1, 1, false}));  // 1x1 row tiles, no copies

TEST(ConvTest, OnlyRequestedGradientsAreComputed) {
  const ConvCase k{2, 3, 6, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1, true};
  const Shape xs{k.n, k.c, k.h, k.w}, ws{k.o, k.c, k.kh, k.kw};
  const Vec xv = random_vec(numel_of(xs), 5), wv = random_vec(numel_of(ws), 6), bv = random_vec(k.o, 7);
  const Vec ones(k.n * k.o * k.oh() * k.ow(), 1.0);
  const ConvRef ref = conv_reference(k, xv, wv, bv, ones);
  {  // only the input wants a gradient
    Tensor x = make(xv, xs, DType::f64, true), w = make(wv, ws), b = make(bv, {k.o});
    sum(conv2d(x, w, b, k.opts())).backward();  // sum's gradient arrives as a broadcast view
    expect_near_vec(x.grad().to_vector(), ref.gx, 1e-12, "grad input");
    EXPECT_FALSE(w.grad().defined());
    EXPECT_FALSE(b.grad().defined());
  }
  {  // only the weight and bias
    Tensor x = make(xv, xs), w = make(wv, ws, DType::f64, true), b = make(bv, {k.o}, DType::f64, true);
    sum(conv2d(x, w, b, k.opts())).backward();
    expect_near_vec(w.grad().to_vector(), ref.gw, 1e-12, "grad weight");
    expect_near_vec(b.grad().to_vector(), ref.gb, 1e-12, "grad bias");
    EXPECT_FALSE(x.grad().defined());
  }
}

TEST(ConvTest, NonContiguousInputAndChainedGradients) {
  const ConvCase k{2, 3, 5, 6, 4, 3, 3, 1, 1, 1, 1, 1, 1, false};
  const Vec xv = random_vec(k.n * k.c * k.h * k.w, 8), wv = random_vec(k.o * k.c * 9, 9);
  // Build x as [N, H, C, W] and transpose to [N, C, H, W]: a strided view.
  Vec xt(xv.size());
  for (int64_t n = 0; n < k.n; ++n)
    for (int64_t c = 0; c < k.c; ++c)
      for (int64_t h = 0; h < k.h; ++h)
        for (int64_t w = 0; w < k.w; ++w)
          xt[((n * k.h + h) * k.c + c) * k.w + w] = xv[((n * k.c + c) * k.h + h) * k.w + w];
  Tensor base = make(xt, {k.n, k.h, k.c, k.w}, DType::f64, true);
  Tensor x = base.transpose(1, 2);
  ASSERT_FALSE(x.is_contiguous());
  Tensor w = make(wv, {k.o, k.c, 3, 3}, DType::f64, true);
  Tensor y = conv2d(x, w, Tensor(), k.opts());
  const Vec gy(k.n * k.o * k.oh() * k.ow(), 1.0);
  const ConvRef ref = conv_reference(k, xv, wv, {}, gy);
  expect_near_vec(y.to_vector(), ref.y, 1e-12, "forward");
  sum(y).backward();
  expect_near_vec(base.grad().transpose(1, 2).contiguous().to_vector(), ref.gx, 1e-12, "grad input");
  expect_near_vec(w.grad().to_vector(), ref.gw, 1e-12, "grad weight");
}

TEST(ConvTest, GradientsAccumulateAcrossBackwardCalls) {
  const ConvCase k{2, 2, 5, 5, 3, 3, 3, 1, 1, 1, 1, 1, 1, true};
  const Vec xv = random_vec(k.n * k.c * 25, 10), wv = random_vec(k.o * k.c * 9, 11), bv = random_vec(k.o, 12);
  Tensor x = make(xv, {k.n, k.c, 5, 5}), w = make(wv, {k.o, k.c, 3, 3}, DType::f64, true);
  Tensor b = make(bv, {k.o}, DType::f64, true);
  sum(conv2d(x, w, b, k.opts())).backward();
  sum(conv2d(x, w, b, k.opts())).backward();
  const ConvRef ref = conv_reference(k, xv, wv, bv, Vec(k.n * k.o * 25, 1.0));
  Vec want = ref.gw;
  for (double& v : want) v *= 2.0;
  expect_near_vec(w.grad().to_vector(), want, 1e-12, "accumulated grad weight");
}

TEST(ConvTest, WorkspaceGoesThroughTheAllocator) {
  // 3x3 convolution of 64x64 planes: the column buffer is several times the output size.
  Tensor x = randn({2, 8, 64, 64}), w = randn({8, 8, 3, 3});
  const MemoryStats before = memory_stats();
  reset_peak_stats();
  Tensor y;
  {
    NoGradGuard ng;
    y = conv2d(x, w, Tensor(), {.padding = {1, 1}});
  }
  const MemoryStats after = memory_stats();
  EXPECT_EQ(after.allocated_bytes - before.allocated_bytes, static_cast<int64_t>(y.nbytes()));
  // At least one im2col tile (C*9 rows x one output row) was counted on top of the output.
  EXPECT_GE(after.peak_allocated_bytes - before.allocated_bytes,
            static_cast<int64_t>(y.nbytes() + 8 * 9 * 64 * sizeof(float)));
}

TEST(ConvTest, BatchOfZeroGivesEmptyOutputAndZeroWeightGrad) {
  Tensor x = zeros({0, 2, 5, 5}, {.dtype = DType::f64});
  Tensor w = ones({3, 2, 3, 3}, {.dtype = DType::f64}).set_requires_grad(true);
  Tensor y = conv2d(x, w);
  EXPECT_EQ(y.shape(), (Shape{0, 3, 3, 3}));
  y.backward(zeros({0, 3, 3, 3}, {.dtype = DType::f64}));
  expect_near_vec(w.grad().to_vector(), Vec(54, 0.0), 0.0, "grad weight");
}

TEST(ConvOutputSize, MatchesPyTorch) {
  EXPECT_EQ(conv_output_size(32, 3, 1, 1, 1, false, "t"), 32);
  EXPECT_EQ(conv_output_size(64, 7, 2, 3, 1, false, "t"), 32);
  EXPECT_EQ(conv_output_size(9, 3, 1, 2, 2, false, "t"), 9);
  EXPECT_EQ(conv_output_size(7, 1, 2, 0, 1, false, "t"), 4);
  EXPECT_EQ(conv_output_size(6, 3, 2, 0, 1, false, "t"), 2);
  EXPECT_EQ(conv_output_size(6, 3, 2, 0, 1, true, "t"), 3);
  // ceil_mode would add a window starting in the right padding: PyTorch drops it.
  EXPECT_EQ(conv_output_size(5, 2, 2, 1, 1, true, "t"), 3);
  EXPECT_EQ(conv_output_size(5, 2, 2, 1, 1, false, "t"), 3);
  EXPECT_EQ(conv_output_size(8, 3, 2, 1, 1, true, "t"), 5);  // last window starts at 7, inside
  EXPECT_EQ(conv_output_size(7, 3, 2, 1, 1, true, "t"), 4);
  EXPECT_EQ(conv_output_size(3, 3, 1, 0, 1, false, "t"), 1);
  EXPECT_THAT(error_of([] { conv_output_size(2, 3, 1, 0, 1, false, "myop"); }),
              HasSubstr("myop: kernel size 3 is larger than the padded input"));
  EXPECT_THAT(error_of([] { conv_output_size(4, 3, 0, 0, 1, false, "myop"); }), HasSubstr("must be positive"));
}

TEST(ConvTest, FiniteDifferenceGradients) {
  gradcheck([](const std::vector<Tensor>& t) {
    return conv2d(t[0], t[1], t[2], {.stride = {2, 1}, .padding = {1, 2}, .dilation = {1, 2}});
  }, {{2, 2, 5, 6}, {3, 2, 3, 2}, {3}}, 40);
}

// ---------------------------------------------------------------- convolution errors

TEST(ConvErrors, WrongRank) {
  Tensor x = zeros({3, 8, 8}), w = zeros({4, 3, 3, 3});
  const std::string e = error_of([&] { conv2d(x, w); });
  EXPECT_THAT(e, HasSubstr("conv2d: expected a 4-D input [N, C, H, W] but got [3, 8, 8]"));
  EXPECT_THAT(e, HasSubstr("unsqueeze(0)"));
  EXPECT_THAT(error_of([&] { conv2d(zeros({1, 3, 8, 8}), zeros({4, 3, 3})); }),
              HasSubstr("conv2d: expected a 4-D weight [out, in/groups, kH, kW] but got [4, 3, 3]"));
}

TEST(ConvErrors, ChannelMismatch) {
  const std::string e = error_of([] { conv2d(zeros({2, 3, 8, 8}), zeros({64, 4, 3, 3})); });
  EXPECT_THAT(e, HasSubstr("conv2d: input [2, 3, 8, 8] has 3 channels but weight [64, 4, 3, 3] expects 4"));
  EXPECT_THAT(e, HasSubstr("[out, in/groups, kH, kW]"));
}

TEST(ConvErrors, GroupsNotSupported) {
  Conv2dOptions o;
  o.groups = 2;
  EXPECT_THAT(error_of([&] { conv2d(zeros({1, 4, 8, 8}), zeros({4, 2, 3, 3}), Tensor(), o); }),
              HasSubstr("conv2d: groups=2 is not supported yet"));
}

TEST(ConvErrors, KernelLargerThanPaddedInput) {
  EXPECT_THAT(error_of([] { conv2d(zeros({1, 1, 3, 3}), zeros({1, 1, 5, 5})); }),
              HasSubstr("conv2d (height): kernel size 5 is larger than the padded input (3 + 2 * 0 = 3)"));
  // Dilation 2 makes a 3x3 kernel span 5.
  EXPECT_THAT(error_of([] { conv2d(zeros({1, 1, 4, 4}), zeros({1, 1, 3, 3}), Tensor(), {.dilation = {2, 2}}); }),
              HasSubstr("kernel size 3 (dilated to 5) is larger than the padded input"));
}

TEST(ConvErrors, BadStridePaddingDilation) {
  EXPECT_THAT(error_of([] { conv2d(zeros({1, 1, 5, 5}), zeros({1, 1, 3, 3}), Tensor(), {.padding = {-1, 0}}); }),
              HasSubstr("conv2d: padding [-1, 0] must be non-negative"));
  EXPECT_THAT(error_of([] { conv2d(zeros({1, 1, 5, 5}), zeros({1, 1, 3, 3}), Tensor(), {.stride = {1, 0}}); }),
              HasSubstr("conv2d: stride [1, 0] must be positive"));
  EXPECT_THAT(error_of([] { conv2d(zeros({1, 1, 5, 5}), zeros({1, 1, 3, 3}), Tensor(), {.dilation = {0, 1}}); }),
              HasSubstr("conv2d: dilation [0, 1] must be positive"));
}

TEST(ConvErrors, DtypeMismatchAndUnsupportedDtype) {
  const std::string e = error_of([] { conv2d(zeros({1, 2, 5, 5}), zeros({3, 2, 3, 3}, {.dtype = DType::f64})); });
  EXPECT_THAT(e, HasSubstr("conv2d: weight has dtype f64 but input has f32"));
  EXPECT_THAT(e, HasSubstr(".to(DType::f32)"));
  const std::string e2 = error_of([] {
    conv2d(zeros({1, 2, 5, 5}, {.dtype = DType::i32}), zeros({3, 2, 3, 3}, {.dtype = DType::i32}));
  });
  EXPECT_THAT(e2, HasSubstr("conv2d: input has dtype i32 on cpu"));
  EXPECT_THAT(e2, HasSubstr(".to(DType::f32)"));
  // f16 is supported on the CPU since the mixed-precision work (tests/kernels/cpu_f16_test.cpp).
  const TensorOptions half{.dtype = DType::f16};
  EXPECT_EQ(conv2d(zeros({1, 2, 5, 5}, half), zeros({3, 2, 3, 3}, half)).dtype(), DType::f16);
}

TEST(ConvErrors, BiasShapeAndDtype) {
  EXPECT_THAT(error_of([] { conv2d(zeros({1, 2, 5, 5}), zeros({3, 2, 3, 3}), zeros({4})); }),
              HasSubstr("conv2d: bias [4] must be [3] to match weight [3, 2, 3, 3]"));
  EXPECT_THAT(error_of([] { conv2d(zeros({1, 2, 5, 5}), zeros({3, 2, 3, 3}), zeros({3}, {.dtype = DType::f64})); }),
              HasSubstr("conv2d: bias has dtype f64 but input has f32"));
}

}  // namespace
}  // namespace minidl
