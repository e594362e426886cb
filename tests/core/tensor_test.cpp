// Tensor basics: factories, views sharing storage, strides, conversions (f16 included), printing,
// and seeded randomness that does not depend on the thread count.
#include <gtest/gtest.h>
#include <omp.h>

#include <cmath>
#include <limits>

#include "core/generator.h"
#include "core/ops.h"
#include "core/tensor.h"

namespace minidl {
namespace {

TEST(Tensor, FactoriesFillShapeAndDtype) {
  Tensor z = zeros({2, 3});
  EXPECT_EQ(z.shape(), (Shape{2, 3}));
  EXPECT_EQ(z.strides(), (Shape{3, 1}));
  EXPECT_EQ(z.dtype(), DType::f32);
  EXPECT_EQ(z.to_vector(), std::vector<double>(6, 0.0));
  EXPECT_EQ(ones({4}, {.dtype = DType::i64}).to_vector(), std::vector<double>(4, 1.0));
  EXPECT_EQ(full({2}, 2.5, {.dtype = DType::f64}).to_vector(), (std::vector<double>{2.5, 2.5}));
  EXPECT_EQ(arange(5).to_vector(), (std::vector<double>{0, 1, 2, 3, 4}));
  EXPECT_EQ(arange(1.0, 2.0, 0.25).to_vector(), (std::vector<double>{1.0, 1.25, 1.5, 1.75}));
  Tensor s = scalar_tensor(3.0);
  EXPECT_EQ(s.dim(), 0);
  EXPECT_EQ(s.numel(), 1);
  EXPECT_DOUBLE_EQ(s.item(), 3.0);
}

TEST(Tensor, ViewsShareStorage) {
  Tensor a = arange(0.0, 24.0, 1.0).reshape({2, 3, 4});
  Tensor t = a.transpose(0, 2);  // [4, 3, 2]
  EXPECT_EQ(t.shape(), (Shape{4, 3, 2}));
  EXPECT_EQ(t.strides(), (Shape{1, 4, 12}));
  EXPECT_FALSE(t.is_contiguous());
  EXPECT_EQ(t.storage(), a.storage());
  Tensor s = a.slice(2, 1, 4, 2);  // elements 1 and 3 of the last dim
  EXPECT_EQ(s.shape(), (Shape{2, 3, 2}));
  EXPECT_EQ(s.to_vector()[0], 1.0);
  EXPECT_EQ(s.to_vector()[1], 3.0);
  EXPECT_EQ(a.select(1, 2).to_vector(), (std::vector<double>{8, 9, 10, 11, 20, 21, 22, 23}));
  // Writing through a view changes the base.
  a.slice(0, 1, 2).fill_(-1.0);
  EXPECT_EQ(a.to_vector()[12], -1.0);
  EXPECT_EQ(a.to_vector()[11], 11.0);
  Tensor e = from_vector({1, 2, 3}, {3, 1}).expand({3, 4});
  EXPECT_EQ(e.strides(), (Shape{1, 0}));
  EXPECT_EQ(e.contiguous().to_vector(), (std::vector<double>{1, 1, 1, 1, 2, 2, 2, 2, 3, 3, 3, 3}));
  EXPECT_EQ(a.flatten().shape(), (Shape{24}));
  EXPECT_EQ(a.flatten(1).shape(), (Shape{2, 12}));
  EXPECT_EQ(a.unsqueeze(0).shape(), (Shape{1, 2, 3, 4}));
  EXPECT_EQ(a.unsqueeze(-1).shape(), (Shape{2, 3, 4, 1}));
  EXPECT_EQ(a.unsqueeze(1).squeeze(1).shape(), (Shape{2, 3, 4}));
  EXPECT_EQ(a.view({-1, 4}).shape(), (Shape{6, 4}));
}

TEST(Tensor, EmptyTensorsAreContiguous) {
  EXPECT_TRUE(zeros({3, 0, 2}).is_contiguous());
  EXPECT_TRUE(zeros({0}).is_contiguous());
  EXPECT_TRUE(zeros({2, 0}).t().is_contiguous());
}

TEST(Tensor, ReshapeCopiesOnlyWhenNeeded) {
  Tensor a = arange(0.0, 12.0, 1.0).reshape({3, 4});
  EXPECT_EQ(a.reshape({2, 6}).storage(), a.storage());
  Tensor t = a.t();
  Tensor r = t.reshape({12});
  EXPECT_NE(r.storage(), a.storage());
  EXPECT_EQ(r.to_vector(), (std::vector<double>{0, 4, 8, 1, 5, 9, 2, 6, 10, 3, 7, 11}));
  EXPECT_THROW(t.view({12}), Error);
}

TEST(Tensor, DtypeConversionsRoundTrip) {
  Tensor a = from_vector({-2.5, 0.0, 1.0, 65504.0, 1e-7}, {5});
  Tensor h = a.to(DType::f16);
  EXPECT_EQ(h.dtype(), DType::f16);
  EXPECT_EQ(h.nbytes(), 10u);
  const auto back = h.to(DType::f32).to_vector();
  EXPECT_EQ(back[0], -2.5);
  EXPECT_EQ(back[3], 65504.0);
  EXPECT_NEAR(back[4], 1e-7, 3e-8);  // subnormal in f16
  EXPECT_EQ(from_vector({1.7, -1.7}, {2}).to(DType::i32).to_vector(), (std::vector<double>{1, -1}));
  EXPECT_EQ(from_vector({0, 2}, {2}).to(DType::boolean).to_vector(), (std::vector<double>{0, 1}));
}

TEST(Tensor, HalfConversionMatchesIeee) {
  EXPECT_EQ(Half::from_float(1.0f), 0x3c00);
  EXPECT_EQ(Half::from_float(-2.0f), 0xc000);
  EXPECT_EQ(Half::from_float(65504.0f), 0x7bff);
  EXPECT_EQ(Half::from_float(65520.0f), 0x7c00);  // rounds to inf
  EXPECT_EQ(Half::from_float(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_TRUE(std::isnan(Half::to_float(Half::from_float(std::nanf("")))));
  EXPECT_EQ(Half::from_float(5.960464477539063e-08f), 0x0001);  // smallest subnormal
  EXPECT_EQ(Half::to_float(0x0001), 5.960464477539063e-08f);
  EXPECT_EQ(Half::from_float(1.0f + 1.0f / 2048), 0x3c00);       // tie rounds to even
  EXPECT_EQ(Half::from_float(1.0f + 3.0f / 2048), 0x3c02);
  for (uint32_t h = 0; h < 0x7c00; ++h) {  // every finite half survives a round trip
    ASSERT_EQ(Half::from_float(Half::to_float(static_cast<uint16_t>(h))), h);
  }
}

TEST(Tensor, ItemAndPrinting) {
  EXPECT_EQ(from_vector({7}, {1, 1}).item<int>(), 7);
  const std::string s = from_vector({1, 2, 3, 4}, {2, 2}).str();
  EXPECT_NE(s.find("[[1, 2],\n [3, 4]]"), std::string::npos) << s;
  EXPECT_NE(s.find("f32[2, 2] cpu"), std::string::npos) << s;
}

TEST(Tensor, CopyBroadcastsAndConverts) {
  Tensor dst = zeros({2, 3}, {.dtype = DType::f64});
  dst.copy_(from_vector({1, 2, 3}, {3}));
  EXPECT_EQ(dst.to_vector(), (std::vector<double>{1, 2, 3, 1, 2, 3}));
  dst.add_(ones({2, 3}, {.dtype = DType::f64}), 2.0);
  EXPECT_EQ(dst.to_vector(), (std::vector<double>{3, 4, 5, 3, 4, 5}));
  dst.mul_(0.5);
  EXPECT_EQ(dst.to_vector()[0], 1.5);
  EXPECT_THROW(dst.copy_(zeros({4})), Error);
}

TEST(Generator, SameSeedSameNumbersAnyThreadCount) {
  Generator g1(42), g2(42), g3(43);
  const int prev = omp_get_max_threads();
  omp_set_num_threads(1);
  Tensor a = randn({100000}, {}, &g1);
  omp_set_num_threads(std::max(2, prev));
  Tensor b = randn({100000}, {}, &g2);
  omp_set_num_threads(prev);
  Tensor c = randn({100000}, {}, &g3);
  EXPECT_TRUE(allclose(a, b, 0, 0));
  EXPECT_FALSE(allclose(a, c, 0, 0));
  // The stream advances: two draws differ.
  EXPECT_FALSE(allclose(randn({8}, {}, &g1), randn({8}, {}, &g2).mul_(0.0), 0, 0));
  // Moments of the distributions.
  EXPECT_NEAR(mean(a).item(), 0.0, 0.02);
  EXPECT_NEAR(mean(square(a)).item(), 1.0, 0.02);
  Generator g4(7);
  Tensor u = uniform({100000}, -1.0, 3.0, {.dtype = DType::f64}, &g4);
  EXPECT_NEAR(mean(u).item(), 1.0, 0.02);
  EXPECT_GE(min(u).item(), -1.0);
  EXPECT_LT(max(u).item(), 3.0);
}

TEST(Generator, ReplayFromSavedOffset) {
  Generator g(5);
  (void)rand({10}, {}, &g);
  const uint64_t off = g.offset();
  Tensor a = rand({33}, {}, &g);
  g.set_offset(off);
  Tensor b = rand({33}, {}, &g);
  EXPECT_TRUE(allclose(a, b, 0, 0));
  // f32 and f64 draws agree (24-bit uniforms).
  Generator h1(9), h2(9);
  EXPECT_TRUE(allclose(rand({16}, {}, &h1).to(DType::f64), rand({16}, {.dtype = DType::f64}, &h2), 0, 0));
}

TEST(Device, ParseAndPrint) {
  EXPECT_EQ(Device::parse("cpu"), Device::cpu());
  EXPECT_EQ(Device::parse("cuda"), Device::cuda(0));
  EXPECT_EQ(Device::parse("cuda:3").index, 3);
  EXPECT_EQ(Device::cuda(2).str(), "cuda:2");
  EXPECT_THROW(Device::parse("gpu"), Error);
  EXPECT_THROW(Device::parse("cuda:x"), Error);
}

}  // namespace
}  // namespace minidl

namespace minidl {
namespace {

TEST(Generator, KernelMatchesPerElementDefinition) {
  // The CPU kernel draws four elements per Philox counter; element i must still equal the
  // per-element definition that the CUDA kernels use.
  Generator g(11);
  g.set_offset(5);
  Tensor u = rand({37}, {.dtype = DType::f64}, &g);
  g.set_offset(5);
  Tensor n = randn({37}, {.dtype = DType::f64}, &g);
  const auto vu = u.to_vector(), vn = n.to_vector();
  for (uint64_t i = 0; i < 37; ++i) {
    ASSERT_EQ(vu[i], philox::uniform_at(11, 5, i)) << i;
    ASSERT_EQ(vn[i], philox::normal_at(11, 5, i)) << i;
  }
}

}  // namespace
}  // namespace minidl
