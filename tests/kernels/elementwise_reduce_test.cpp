// Numerical cases for the elementwise, reduction and matmul kernels against values computed by
// hand, over contiguous, transposed, sliced and broadcast operands (the paths the strided iterator
// and the GEMM layout detection take).
#include <gtest/gtest.h>

#include <cmath>

#include "core/generator.h"
#include "core/ops.h"

namespace minidl {
namespace {

std::vector<double> naive_matmul(const std::vector<double>& a, const std::vector<double>& b, int64_t M, int64_t K,
                                 int64_t N) {
  std::vector<double> c(static_cast<size_t>(M * N), 0.0);
  for (int64_t i = 0; i < M; ++i)
    for (int64_t j = 0; j < N; ++j)
      for (int64_t k = 0; k < K; ++k) c[i * N + j] += a[i * K + k] * b[k * N + j];
  return c;
}

TEST(Elementwise, BroadcastingArithmetic) {
  Tensor a = from_vector({1, 2, 3, 4, 5, 6}, {2, 3});
  Tensor b = from_vector({10, 20, 30}, {3});
  EXPECT_EQ((a + b).to_vector(), (std::vector<double>{11, 22, 33, 14, 25, 36}));
  EXPECT_EQ((a - b).to_vector(), (std::vector<double>{-9, -18, -27, -6, -15, -24}));
  EXPECT_EQ((a * 2.0).to_vector(), (std::vector<double>{2, 4, 6, 8, 10, 12}));
  EXPECT_EQ((1.0 / from_vector({2, 4}, {2, 1})).to_vector(), (std::vector<double>{0.5, 0.25}));
  Tensor c = from_vector({1, 2}, {2, 1});
  EXPECT_EQ((c * b).shape(), (Shape{2, 3}));
  EXPECT_EQ((c * b).to_vector(), (std::vector<double>{10, 20, 30, 20, 40, 60}));
  EXPECT_EQ(maximum(a, full({1}, 3.5)).to_vector(), (std::vector<double>{3.5, 3.5, 3.5, 4, 5, 6}));
  EXPECT_EQ(gt(a, full({}, 3.0)).to_vector(), (std::vector<double>{0, 0, 0, 1, 1, 1}));
  EXPECT_EQ(gt(a, full({}, 3.0)).dtype(), DType::boolean);
  // Integer arithmetic stays integral.
  Tensor i = arange(4);
  EXPECT_EQ((i * i).to_vector(), (std::vector<double>{0, 1, 4, 9}));
}

TEST(Elementwise, NonContiguousOperands) {
  Generator g(1);
  Tensor base = randn({6, 8}, {.dtype = DType::f64}, &g);
  Tensor t = base.t();                    // [8, 6], column-major
  Tensor s = base.slice(1, 0, 8, 2).t();  // [4, 6], strided
  const auto vb = base.to_vector();
  Tensor r = exp(t);
  const auto vr = r.to_vector();
  for (int64_t i = 0; i < 8; ++i)
    for (int64_t j = 0; j < 6; ++j) ASSERT_DOUBLE_EQ(vr[i * 6 + j], std::exp(vb[j * 8 + i]));
  Tensor sum2 = s + t.slice(0, 0, 4);
  const auto vs = sum2.to_vector();
  for (int64_t i = 0; i < 4; ++i)
    for (int64_t j = 0; j < 6; ++j) ASSERT_DOUBLE_EQ(vs[i * 6 + j], vb[j * 8 + 2 * i] + vb[j * 8 + i]);
}

TEST(Elementwise, UnaryValues) {
  Tensor x = from_vector({-2, -0.5, 0.5, 2}, {4}, {.dtype = DType::f64});
  const auto rl = relu(x).to_vector();
  EXPECT_EQ(rl, (std::vector<double>{0, 0, 0.5, 2}));
  const auto sg = sigmoid(x).to_vector();
  for (int i = 0; i < 4; ++i) EXPECT_DOUBLE_EQ(sg[i], 1.0 / (1.0 + std::exp(-x.to_vector()[i])));
  EXPECT_EQ(abs(x).to_vector(), (std::vector<double>{2, 0.5, 0.5, 2}));
  EXPECT_EQ(pow(x, 2.0).to_vector(), (std::vector<double>{4, 0.25, 0.25, 4}));
  EXPECT_DOUBLE_EQ(tanh(x).to_vector()[3], std::tanh(2.0));
  EXPECT_DOUBLE_EQ(log1p(abs(x)).to_vector()[0], std::log1p(2.0));
}

TEST(Elementwise, LargeTensorsUseAllChunks) {
  // Larger than one parallel chunk with a broadcast operand, so the chunk decomposition is exercised.
  Tensor a = arange(0.0, 300000.0, 1.0, {.dtype = DType::f64}).reshape({1000, 300});
  Tensor b = arange(0.0, 300.0, 1.0, {.dtype = DType::f64});
  const auto v = (a + b).to_vector();
  for (int64_t i = 0; i < 300000; i += 977) ASSERT_EQ(v[i], static_cast<double>(i + i % 300));
}

TEST(Reduce, SumMeanMaxArgmaxOverDims) {
  Tensor a = arange(0.0, 24.0, 1.0, {.dtype = DType::f64}).reshape({2, 3, 4});
  EXPECT_DOUBLE_EQ(sum(a).item(), 276.0);
  EXPECT_EQ(sum(a, {0}).to_vector()[0], 12.0);
  EXPECT_EQ(sum(a, {0, 2}).to_vector(), (std::vector<double>{60, 92, 124}));
  EXPECT_EQ(sum(a, {0, 2}, true).shape(), (Shape{1, 3, 1}));
  EXPECT_EQ(mean(a, {-1}).to_vector()[0], 1.5);
  EXPECT_EQ(max(a, {1}).to_vector(), (std::vector<double>{8, 9, 10, 11, 20, 21, 22, 23}));
  EXPECT_EQ(min(a).item(), 0.0);
  EXPECT_EQ(argmax(a, 2).to_vector(), std::vector<double>(6, 3.0));
  EXPECT_EQ(argmax(a, 2).dtype(), DType::i64);
  EXPECT_EQ(argmin(from_vector({3, 1, 1, 5}, {4}), 0).item(), 1.0);   // first of ties
  EXPECT_EQ(argmax(from_vector({3, 7, 7, 5}, {4}), 0).item(), 1.0);
  // Transposed input and a reduction large enough to be split in blocks.
  EXPECT_EQ(sum(a.transpose(0, 2), {2}).to_vector()[0], 12.0);
  Tensor big = ones({3, 100000}, {.dtype = DType::f64});
  EXPECT_EQ(sum(big).item(), 300000.0);
  EXPECT_EQ(sum(big, {1}).to_vector(), (std::vector<double>{100000, 100000, 100000}));
  EXPECT_EQ(sum(arange(10), {0}).item(), 45.0);  // integer sums
}

TEST(Reduce, MaxPropagatesNan) {
  Tensor a = from_vector({1, NAN, 3}, {3});
  EXPECT_TRUE(std::isnan(max(a).item()));
}

TEST(Matmul, LayoutsAndBatches) {
  Generator g(3);
  const int64_t M = 5, K = 7, N = 4;
  Tensor a = randn({M, K}, {.dtype = DType::f64}, &g);
  Tensor b = randn({K, N}, {.dtype = DType::f64}, &g);
  const auto ref = naive_matmul(a.to_vector(), b.to_vector(), M, K, N);
  auto check = [&](const Tensor& c) {
    const auto v = c.to_vector();
    ASSERT_EQ(v.size(), ref.size());
    for (size_t i = 0; i < v.size(); ++i) ASSERT_NEAR(v[i], ref[i], 1e-12);
  };
  check(matmul(a, b));
  check(matmul(a.t().contiguous().t(), b));           // column-major a
  check(matmul(a, b.t().contiguous().t()));           // column-major b
  Tensor wide = randn({M, 2 * K}, {.dtype = DType::f64}, &g);
  wide.slice(1, 0, 2 * K, 2).copy_(a);
  check(matmul(wide.slice(1, 0, 2 * K, 2), b));       // strided: needs a copy
  // Batched with a broadcast batch dim, and 1-D operands.
  Tensor a3 = a.unsqueeze(0).expand({3, M, K}).contiguous();
  Tensor c3 = matmul(a3, b);
  EXPECT_EQ(c3.shape(), (Shape{3, M, N}));
  check(c3.select(0, 2));
  Tensor v = randn({K}, {.dtype = DType::f64}, &g);
  EXPECT_EQ(matmul(a, v).shape(), (Shape{M}));
  EXPECT_EQ(matmul(v, b).shape(), (Shape{N}));
  EXPECT_EQ(matmul(v, v).dim(), 0);
  EXPECT_NEAR(matmul(v, v).item(), sum(v * v).item(), 1e-12);
  // f32 against the f64 result.
  const auto c32 = matmul(a.to(DType::f32), b.to(DType::f32)).to_vector();
  for (size_t i = 0; i < ref.size(); ++i) ASSERT_NEAR(c32[i], ref[i], 1e-5);
}

TEST(Linear, MatchesMatmulPlusBias) {
  Generator g(4);
  Tensor x = randn({3, 2, 5}, {.dtype = DType::f64}, &g);
  Tensor w = randn({4, 5}, {.dtype = DType::f64}, &g);
  Tensor b = randn({4}, {.dtype = DType::f64}, &g);
  EXPECT_TRUE(allclose(linear(x, w, b), matmul(x, w.t()) + b, 1e-12, 1e-12));
  EXPECT_EQ(linear(x, w).shape(), (Shape{3, 2, 4}));
}

}  // namespace
}  // namespace minidl
