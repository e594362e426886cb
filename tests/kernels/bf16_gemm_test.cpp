// The bf16 GEMM's two paths (kernels/cpu/bf16_gemm.h): the scalar loop and vdpbf16ps must give
// the same bits on every shape and value that reaches them (odd K, ragged N, strided and batched
// operands, subnormals, cancellation, inf and NaN), and the scalar loop, which runs everywhere,
// must follow the documented arithmetic: f32 accumulation, subnormals as zero, one rounding.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "core/error.h"
#include "core/generator.h"
#include "core/ops.h"
#include "kernels/cpu/bf16_gemm.h"
#include "tests/support/low_precision.h"

namespace minidl {
namespace {

using cpu::Bf16GemmPath;
using cpu::bf16_matmul;
using testing::raw_bytes;

Tensor bf16_randn(const Shape& s, uint64_t seed, double scale = 1.0) {
  Generator gen(seed);
  return (randn(s, {}, &gen) * scale).to(DType::bf16);
}

Tensor run(const Tensor& a, const Tensor& b, Bf16GemmPath path) {
  const Tensor out = empty({a.size(0), a.size(1), b.size(2)}, {.dtype = DType::bf16});
  bf16_matmul(a, b, out, path);
  return out;
}

// Both paths on a and b, bit for bit; without the instructions only the scalar one runs.
void expect_paths_agree(const Tensor& a, const Tensor& b) {
  const Tensor scalar = run(a, b, Bf16GemmPath::Scalar);
  if (!cpu::bf16_dot_instructions()) return;
  const Tensor avx = run(a, b, Bf16GemmPath::Avx512Bf16);
  const auto* s = reinterpret_cast<const uint16_t*>(scalar.data<BFloat16>());
  const auto* v = reinterpret_cast<const uint16_t*>(avx.data<BFloat16>());
  for (int64_t i = 0; i < scalar.numel(); ++i) {
    ASSERT_EQ(s[i], v[i]) << "element " << i << " of " << scalar.meta() << ": scalar " << BFloat16::to_float(s[i])
                          << ", vdpbf16ps " << BFloat16::to_float(v[i]);
  }
}

TEST(Bf16Gemm, ThePathsGiveTheSameBitsOnEveryShape) {
  if (!cpu::bf16_dot_instructions()) {
    std::cout << "[ INFO ] this CPU has no avx512_bf16: only the scalar path runs\n";
  }
  const int64_t shapes[][3] = {{1, 1, 1}, {1, 2, 16}, {3, 7, 5}, {17, 40, 9}, {5, 33, 17}, {64, 64, 64},
                               {2, 1, 70},  {9, 129, 31}, {1, 0, 4}};
  uint64_t seed = 1;
  for (const auto& s : shapes) {
    SCOPED_TRACE(std::to_string(s[0]) + "x" + std::to_string(s[1]) + "x" + std::to_string(s[2]));
    expect_paths_agree(bf16_randn({2, s[0], s[1]}, seed), bf16_randn({2, s[1], s[2]}, seed + 1));
    seed += 2;
  }
  // Transposed and sliced operands (strided reads in the packing).
  const Tensor a = bf16_randn({3, 20, 11}, 50), b = bf16_randn({3, 13, 20}, 51);
  expect_paths_agree(a.transpose(1, 2), b.transpose(1, 2));
  expect_paths_agree(a.slice(2, 1, 10).transpose(1, 2), b.slice(1, 2, 11).transpose(1, 2));
  expect_paths_agree(a.slice(1, 0, 20, 2), b.slice(2, 1, 20, 3));
}

TEST(Bf16Gemm, ThePathsAgreeOnSubnormalsCancellationInfAndNan) {
  // Values spread over the whole exponent range: products underflow into f32 subnormals (flushed),
  // partial sums overflow to inf, inf - inf makes NaN, and bf16 subnormal operands appear.
  auto spread = [](const Shape& s, uint64_t seed) {
    const std::vector<double> m = bf16_randn(s, seed).to_vector();
    std::vector<double> v(m.size());
    uint64_t x = seed;
    for (size_t i = 0; i < v.size(); ++i) {
      x = x * 6364136223846793005ull + 1442695040888963407ull;
      v[i] = std::ldexp(m[i], static_cast<int>((x >> 33) % 251) - 125);
    }
    return from_vector(v, s, {.dtype = DType::bf16});
  };
  expect_paths_agree(spread({2, 24, 37}, 8), spread({2, 37, 19}, 9));
  expect_paths_agree(spread({1, 40, 300}, 10), spread({1, 300, 33}, 11));
  // Exact cancellation around 1 and sums that only an f32 accumulator keeps.
  std::vector<double> av(64), bv(64);
  for (int i = 0; i < 64; ++i) {
    av[i] = i % 2 == 0 ? 256.0 : -256.0;
    bv[i] = 1.0 + (i % 3) * std::ldexp(1.0, -7);
  }
  expect_paths_agree(from_vector(av, {1, 1, 64}, {.dtype = DType::bf16}), from_vector(bv, {1, 64, 1}, {.dtype = DType::bf16}));
  const Tensor specials =
      from_vector({INFINITY, 1.0, -INFINITY, NAN, 0.0, -0.0, 1e-39, 3e38}, {1, 1, 8}, {.dtype = DType::bf16});
  const Tensor ones8 = ones({1, 8, 3}, {.dtype = DType::bf16});
  expect_paths_agree(specials, ones8);
  expect_paths_agree(specials.slice(2, 4, 8), ones8.slice(1, 0, 4));
}

TEST(Bf16Gemm, TheScalarPathFollowsTheDocumentedArithmetic) {
  // f32 accumulation: 1 + 2^-8 + ... is kept, then rounded once (a bf16 accumulator would drop it).
  std::vector<double> av(16, 1.0), bv(16, std::ldexp(1.0, -9));
  bv[0] = 1.0;
  const Tensor a = from_vector(av, {1, 1, 16}, {.dtype = DType::bf16});
  const Tensor b = from_vector(bv, {1, 16, 1}, {.dtype = DType::bf16});
  // 1 + 15 * 2^-9 = 1.029..., the nearest bf16 is 1 + 4 * 2^-7 = 1.03125 (0x3f84).
  EXPECT_EQ(run(a, b, Bf16GemmPath::Scalar).item(), 1.03125);
  // A bf16 subnormal operand counts as zero (the instruction's rule, kept by the scalar path).
  const Tensor sub = from_vector({std::ldexp(1.0, -130), 1.0}, {1, 1, 2}, {.dtype = DType::bf16});
  const Tensor big = from_vector({std::ldexp(1.0, 100), 0.0}, {1, 2, 1}, {.dtype = DType::bf16});
  EXPECT_EQ(run(sub, big, Bf16GemmPath::Scalar).item(), 0.0);
  // NaN comes out as the positive quiet NaN on every path.
  const Tensor nan = from_vector({NAN, 1.0}, {1, 1, 2}, {.dtype = DType::bf16});
  const Tensor n = run(nan, ones({1, 2, 1}, {.dtype = DType::bf16}), Bf16GemmPath::Scalar);
  EXPECT_EQ(reinterpret_cast<const uint16_t*>(n.data<BFloat16>())[0], 0x7fc0);
  // K = 0: zeros.
  EXPECT_EQ(run(empty({1, 2, 0}, {.dtype = DType::bf16}), empty({1, 0, 3}, {.dtype = DType::bf16}), Bf16GemmPath::Scalar)
                .to_vector(),
            std::vector<double>(6, 0.0));
}

TEST(Bf16Gemm, MatmulTakesTheAutoPathAndNamesAMissingOne) {
  const Tensor a = bf16_randn({1, 9, 21}, 20), b = bf16_randn({1, 21, 6}, 21);
  EXPECT_EQ(raw_bytes(matmul(a, b)), raw_bytes(run(a, b, Bf16GemmPath::Scalar)));
  if (!cpu::bf16_dot_instructions()) {
    try {
      run(a, b, Bf16GemmPath::Avx512Bf16);
      FAIL() << "no error";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("Bf16GemmPath::Scalar"), std::string::npos) << e.what();
    }
  }
  try {
    bf16_matmul(a.to(DType::f32), b, empty({1, 9, 6}, {.dtype = DType::bf16}));
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(".to(DType::bf16)"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace minidl
