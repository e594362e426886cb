// max_pool2d, avg_pool2d and adaptive_avg_pool2d (front-ends, backward nodes and CPU kernels)
// checked against direct-loop references in f64 that follow PyTorch's definitions, over padded,
// strided, ceil_mode and wide-row shapes, plus the argument errors. conv2d is in conv_test.cpp.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/ops.h"
#include "core/tensor.h"
#include "tests/support/conv_pool_helpers.h"

namespace minidl {
namespace {

using ::testing::HasSubstr;
using namespace testing::conv_pool;   // the suite's helpers, error_of among them

// ---------------------------------------------------------------- pooling reference

struct PoolCase {
  int64_t n, c, h, w, kh, kw, sh, sw, ph, pw;  // sh/sw 0: equal to the kernel
  bool ceil_mode, include_pad;
  Pool2dOptions opts() const {
    return {.kernel = {kh, kw}, .stride = {sh, sw}, .padding = {ph, pw}, .ceil_mode = ceil_mode,
            .count_include_pad = include_pad};
  }
};

void PrintTo(const PoolCase& k, std::ostream* os) {
  *os << "x" << k.n << "x" << k.c << "x" << k.h << "x" << k.w << "_k" << k.kh << "x" << k.kw << "_s" << k.sh << "x"
      << k.sw << "_p" << k.ph << "x" << k.pw << (k.ceil_mode ? "_ceil" : "") << (k.include_pad ? "" : "_nopad");
}

int64_t ref_out(int64_t in, int64_t k, int64_t s, int64_t p, bool ceil_mode) {
  const int64_t num = in + 2 * p - k;
  int64_t out = (ceil_mode ? (num + s - 1) / s : num / s) + 1;
  if (ceil_mode && (out - 1) * s >= in + p) --out;
  return out;
}

struct PoolRef {
  Shape out_shape;
  Vec y, gx;
};

PoolRef pool_reference(const PoolCase& k, bool is_max, const Vec& x, const Vec& gy_or_empty) {
  const int64_t sh = k.sh ? k.sh : k.kh, sw = k.sw ? k.sw : k.kw;
  const int64_t oh = ref_out(k.h, k.kh, sh, k.ph, k.ceil_mode), ow = ref_out(k.w, k.kw, sw, k.pw, k.ceil_mode);
  PoolRef r{{k.n, k.c, oh, ow}, Vec(k.n * k.c * oh * ow), Vec(x.size(), 0.0)};
  for (int64_t pl = 0; pl < k.n * k.c; ++pl) {
    for (int64_t i = 0; i < oh; ++i) {
      for (int64_t j = 0; j < ow; ++j) {
        const int64_t yi = (pl * oh + i) * ow + j;
        const double g = gy_or_empty.empty() ? 0.0 : gy_or_empty[yi];
        const int64_t hs = i * sh - k.ph, ws = j * sw - k.pw;
        if (is_max) {
          double best = -std::numeric_limits<double>::infinity();
          int64_t arg = -1;
          for (int64_t a = 0; a < k.kh; ++a)
            for (int64_t e = 0; e < k.kw; ++e) {
              const int64_t ih = hs + a, iw = ws + e;
              if (ih < 0 || ih >= k.h || iw < 0 || iw >= k.w) continue;
              const int64_t xi = (pl * k.h + ih) * k.w + iw;
              if (arg < 0 || x[xi] > best) best = x[xi], arg = xi;
            }
          r.y[yi] = best;
          r.gx[arg] += g;
        } else {
          // Divisor: the window clipped to the padded input, or to the input without padding.
          const int64_t he = std::min(hs + k.kh, k.h + k.ph), we = std::min(ws + k.kw, k.w + k.pw);
          int64_t inside = 0;
          double s = 0.0;
          for (int64_t ih = std::max<int64_t>(hs, 0); ih < std::min(he, k.h); ++ih)
            for (int64_t iw = std::max<int64_t>(ws, 0); iw < std::min(we, k.w); ++iw) {
              s += x[(pl * k.h + ih) * k.w + iw];
              ++inside;
            }
          const double div = k.include_pad ? static_cast<double>((he - hs) * (we - ws)) : static_cast<double>(inside);
          r.y[yi] = s / div;
          for (int64_t ih = std::max<int64_t>(hs, 0); ih < std::min(he, k.h); ++ih)
            for (int64_t iw = std::max<int64_t>(ws, 0); iw < std::min(we, k.w); ++iw)
              r.gx[(pl * k.h + ih) * k.w + iw] += g / div;
        }
      }
    }
  }
  return r;
}

void run_pool_case(const PoolCase& k, bool is_max, DType dt, double tol) {
  const Shape xs{k.n, k.c, k.h, k.w};
  const Vec xv = random_vec(numel_of(xs), 21);
  const PoolRef shape_only = pool_reference(k, is_max, xv, {});
  const Vec gyv = random_vec(numel_of(shape_only.out_shape), 22);
  const PoolRef ref = pool_reference(k, is_max, xv, gyv);
  Tensor x = make(xv, xs, dt, true);
  Tensor y = is_max ? max_pool2d(x, k.opts()) : avg_pool2d(x, k.opts());
  ASSERT_EQ(y.shape(), ref.out_shape);
  expect_near_vec(y.to_vector(), ref.y, tol, "forward");
  y.backward(make(gyv, ref.out_shape, dt));
  expect_near_vec(x.grad().to_vector(), ref.gx, tol, "grad input");
}

class PoolShapes : public ::testing::TestWithParam<PoolCase> {};

TEST_P(PoolShapes, MaxMatchesDirectLoop) {
  run_pool_case(GetParam(), true, DType::f64, 1e-12);
  run_pool_case(GetParam(), true, DType::f32, 1e-6);
}
TEST_P(PoolShapes, AvgMatchesDirectLoop) {
  run_pool_case(GetParam(), false, DType::f64, 1e-12);
  run_pool_case(GetParam(), false, DType::f32, 1e-6);
}

INSTANTIATE_TEST_SUITE_P(
    Pool, PoolShapes,
    ::testing::Values(
        //       n  c   h   w kh kw sh sw ph pw ceil   incl_pad
        PoolCase{2, 3, 8, 8, 2, 2, 0, 0, 0, 0, false, true},    // default stride = kernel
        PoolCase{2, 2, 9, 7, 3, 3, 2, 2, 1, 1, false, true},    // ResNet stem pool
        PoolCase{2, 2, 9, 7, 3, 3, 2, 2, 1, 1, false, false},   // padding not counted
        PoolCase{1, 2, 8, 8, 3, 3, 2, 2, 1, 1, true, true},     // ceil_mode, padded
        PoolCase{1, 2, 8, 8, 3, 3, 2, 2, 1, 1, true, false},
        PoolCase{1, 1, 5, 5, 2, 2, 2, 2, 0, 0, true, true},     // ceil_mode: partial last window
        PoolCase{2, 1, 5, 5, 2, 2, 2, 2, 1, 1, true, true},     // last window would start in padding
        PoolCase{1, 3, 6, 7, 2, 3, 1, 2, 1, 1, false, true},    // non-square kernel / stride
        PoolCase{1, 3, 6, 7, 2, 3, 1, 2, 1, 1, true, false},
        PoolCase{3, 4, 4, 4, 4, 4, 0, 0, 0, 0, false, true},    // whole-plane window
        PoolCase{1, 2, 4, 1100, 2, 3, 2, 2, 1, 1, false, true},  // rows wider than one kernel chunk
        PoolCase{1, 1, 3, 700, 3, 3, 1, 1, 1, 1, true, false},   // stride 1, wide rows
        PoolCase{1, 1, 7, 9, 3, 3, 3, 3, 1, 1, true, true}));    // stride 3 (generic stride path)

TEST(PoolTest, MaxTiesGoToTheFirstElement) {
  Tensor x = ones({1, 1, 4, 4}, {.dtype = DType::f64}).set_requires_grad(true);
  sum(max_pool2d(x, {.kernel = {2, 2}})).backward();
  const Vec want{1, 0, 1, 0, 0, 0, 0, 0, 1, 0, 1, 0, 0, 0, 0, 0};
  expect_near_vec(x.grad().to_vector(), want, 0.0, "grad input");
}

TEST(PoolTest, MaxOverlappingWindowsAccumulate) {
  // The centre element is the max of all four 2x2 windows of a 3x3 input with stride 1.
  Tensor x = from_vector({0, 1, 0, 1, 9, 1, 0, 1, 0}, {1, 1, 3, 3}, {.dtype = DType::f64});
  x.set_requires_grad(true);
  sum(max_pool2d(x, {.kernel = {2, 2}, .stride = {1, 1}})).backward();
  expect_near_vec(x.grad().to_vector(), {0, 0, 0, 0, 4, 0, 0, 0, 0}, 0.0, "grad input");
}

TEST(PoolTest, MaxPaddingIsMinusInfinity) {
  Tensor x = full({1, 1, 2, 2}, -5.0, {.dtype = DType::f64});
  Tensor y = max_pool2d(x, {.kernel = {3, 3}, .stride = {1, 1}, .padding = {1, 1}});
  expect_near_vec(y.to_vector(), Vec(4, -5.0), 0.0, "forward");
}

TEST(PoolTest, MaxPropagatesNaN) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  Tensor x = from_vector({1, nan, 3, 4}, {1, 1, 2, 2});
  EXPECT_TRUE(std::isnan(max_pool2d(x, {.kernel = {2, 2}}).item()));
}

TEST(PoolTest, AdaptiveAvgIsGlobalMean) {
  const Vec xv = random_vec(2 * 3 * 5 * 4, 30);
  Tensor x = make(xv, {2, 3, 5, 4}, DType::f64, true);
  Tensor y = adaptive_avg_pool2d(x);
  ASSERT_EQ(y.shape(), (Shape{2, 3, 1, 1}));
  Vec want(6, 0.0);
  for (size_t i = 0; i < xv.size(); ++i) want[i / 20] += xv[i] / 20.0;
  expect_near_vec(y.to_vector(), want, 1e-12, "forward");
  sum(y).backward();
  expect_near_vec(x.grad().to_vector(), Vec(xv.size(), 1.0 / 20.0), 1e-12, "grad input");
}

TEST(PoolTest, NonContiguousInput) {
  const Vec xv = random_vec(2 * 6 * 6, 31);
  Tensor base = make(xv, {2, 6, 6, 1});
  Tensor x = base.permute({0, 3, 1, 2});  // [2, 1, 6, 6], contiguous data but check the path anyway
  Tensor xt = make(xv, {2, 1, 6, 6}).transpose(2, 3);
  ASSERT_FALSE(xt.is_contiguous());
  const PoolCase k{2, 1, 6, 6, 3, 3, 2, 2, 1, 1, false, true};
  Tensor want = max_pool2d(xt.contiguous(), k.opts());
  expect_near_vec(max_pool2d(xt, k.opts()).to_vector(), want.to_vector(), 0.0, "max");
  expect_near_vec(avg_pool2d(x, k.opts()).to_vector(), avg_pool2d(x.contiguous(), k.opts()).to_vector(), 0.0,
                  "avg");
}

TEST(PoolTest, FiniteDifferenceGradients) {
  const Pool2dOptions o{.kernel = {3, 2}, .stride = {2, 1}, .padding = {1, 1}, .ceil_mode = true,
                        .count_include_pad = false};
  gradcheck([&](const std::vector<Tensor>& t) { return max_pool2d(t[0], o); }, {{2, 2, 6, 5}}, 50);
  gradcheck([&](const std::vector<Tensor>& t) { return avg_pool2d(t[0], o); }, {{2, 2, 6, 5}}, 60);
  gradcheck([](const std::vector<Tensor>& t) { return adaptive_avg_pool2d(t[0]); }, {{2, 3, 4, 3}}, 70);
}

// ---------------------------------------------------------------- pooling errors

TEST(PoolErrors, WrongRank) {
  const std::string e = error_of([] { max_pool2d(zeros({3, 8, 8}), {}); });
  EXPECT_THAT(e, HasSubstr("max_pool2d: expected a 4-D input [N, C, H, W] but got [3, 8, 8]"));
  EXPECT_THAT(e, HasSubstr("unsqueeze(0)"));
  EXPECT_THAT(error_of([] { adaptive_avg_pool2d(zeros({8, 8})); }),
              HasSubstr("adaptive_avg_pool2d: expected a 4-D input [N, C, H, W] but got [8, 8]"));
}

TEST(PoolErrors, PaddingAtMostHalfTheKernel) {
  const std::string e = error_of([] { max_pool2d(zeros({1, 1, 8, 8}), {.kernel = {3, 3}, .padding = {2, 1}}); });
  EXPECT_THAT(e, HasSubstr("max_pool2d: padding [2, 1] must be at most half the kernel size [3, 3]"));
  EXPECT_THAT(error_of([] { avg_pool2d(zeros({1, 1, 8, 8}), {.kernel = {2, 2}, .padding = {0, 2}}); }),
              HasSubstr("avg_pool2d: padding [0, 2] must be at most half the kernel size [2, 2]"));
}

TEST(PoolErrors, NegativeValues) {
  EXPECT_THAT(error_of([] { max_pool2d(zeros({1, 1, 8, 8}), {.kernel = {2, 2}, .padding = {-1, 0}}); }),
              HasSubstr("max_pool2d: padding [-1, 0] must be non-negative"));
  EXPECT_THAT(error_of([] { avg_pool2d(zeros({1, 1, 8, 8}), {.kernel = {0, 2}}); }),
              HasSubstr("avg_pool2d: kernel size [0, 2] must be positive"));
  EXPECT_THAT(error_of([] { avg_pool2d(zeros({1, 1, 8, 8}), {.kernel = {2, 2}, .stride = {-1, 1}}); }),
              HasSubstr("avg_pool2d: stride [-1, 1] must be positive"));
}

TEST(PoolErrors, KernelLargerThanInput) {
  EXPECT_THAT(error_of([] { max_pool2d(zeros({1, 1, 2, 8}), {.kernel = {3, 3}}); }),
              HasSubstr("max_pool2d (height): kernel size 3 is larger than the padded input (2 + 2 * 0 = 2)"));
}

TEST(PoolErrors, UnsupportedDtypeAndAdaptiveSize) {
  EXPECT_THAT(error_of([] { max_pool2d(zeros({1, 1, 4, 4}, {.dtype = DType::i64}), {}); }),
              HasSubstr("max_pool2d: input has dtype i64 on cpu"));
  EXPECT_THAT(error_of([] { adaptive_avg_pool2d(zeros({1, 1, 4, 4}), {2, 2}); }),
              HasSubstr("adaptive_avg_pool2d: output size [2, 2] is not supported yet"));
}

}  // namespace
}  // namespace minidl
