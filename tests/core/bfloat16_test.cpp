// BFloat16's conversions, the rules every bf16 path stands on: round-to-nearest-even from f32
// (ties, subnormals, the overflow edge), inf and NaN (quiet, signed, as Half), exact widening, and
// all 65536 bit patterns through the scalar code and the tensors' contiguous and strided copies.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "core/tensor.h"

namespace minidl {
namespace {

float from_bits(uint32_t x) {
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

bool is_nan16(uint16_t b) { return (b & 0x7fffu) > 0x7f80u; }

TEST(BFloat16, RoundsToNearestEven) {
  struct Case {
    uint32_t f32;
    uint16_t bf16;
  };
  const Case cases[] = {
      {0x3f800000, 0x3f80},  // 1: exact
      {0x3f808000, 0x3f80},  // 1 + half an ulp: a tie, to the even 1
      {0x3f818000, 0x3f82},  // 1 + 3 half ulps: a tie, to the even upper neighbour
      {0x3f807fff, 0x3f80},  // just below the tie
      {0x3f808001, 0x3f81},  // just above the tie
      {0xbf808001, 0xbf81},  // the same, negative
      {0x00008000, 0x0000},  // a subnormal tie to the even zero
      {0x00018000, 0x0002},  // a subnormal tie upward
      {0x80008001, 0x8001},  // negative subnormal, above the tie
      {0x007fffff, 0x0080},  // the largest f32 subnormal rounds to the smallest normal
      {0x7f7f7fff, 0x7f7f},  // below the overflow edge: the largest finite bf16
      {0x7f7f8000, 0x7f80},  // the tie at the edge goes to inf (0x7f7f is odd)
      {0xff7fffff, 0xff80},  // -FLT_MAX: -inf
      {0x7f800000, 0x7f80},  // inf stays inf
      {0x80000000, 0x8000},  // -0 keeps its sign
  };
  for (const Case& c : cases) {
    EXPECT_EQ(BFloat16::from_float(from_bits(c.f32)), c.bf16) << std::hex << "f32 0x" << c.f32;
  }
}

TEST(BFloat16, NanStaysAQuietNanOfItsSign) {
  // A signalling NaN whose payload is only in the low bits would truncate to inf: it must not.
  for (uint32_t x : {0x7f800001u, 0x7fc00000u, 0x7fbfffffu, 0x7fffffffu}) {
    EXPECT_EQ(BFloat16::from_float(from_bits(x)), 0x7fc0) << std::hex << x;
    EXPECT_EQ(BFloat16::from_float(from_bits(x | 0x80000000u)), 0xffc0) << std::hex << x;
  }
  EXPECT_TRUE(std::isnan(BFloat16::to_float(0x7f81)));
}

// The 65536 patterns, widened to f32 (exact: the pattern is the f32's upper half) and rounded back.
TEST(BFloat16, EveryPatternRoundTripsThroughF32) {
  for (uint32_t b = 0; b < 65536; ++b) {
    const uint16_t bits = static_cast<uint16_t>(b);
    const float f = BFloat16::to_float(bits);
    uint32_t x;
    std::memcpy(&x, &f, 4);
    ASSERT_EQ(x, b << 16);
    const uint16_t back = BFloat16::from_float(f);
    if (is_nan16(bits)) {
      ASSERT_EQ(back, (bits & 0x8000u) | 0x7fc0u) << std::hex << b;
    } else {
      ASSERT_EQ(back, bits) << std::hex << b;
    }
  }
}

// The same through tensors: bf16 -> f32 -> bf16 and bf16 -> f64 -> bf16 copies, contiguous (the
// vectorised loops) and transposed (the element loop), give every non-NaN pattern back.
TEST(BFloat16, EveryPatternRoundTripsThroughTensorCopies) {
  Tensor all = empty({256, 256}, {.dtype = DType::bf16});
  auto* p = reinterpret_cast<uint16_t*>(all.data<BFloat16>());
  for (uint32_t b = 0; b < 65536; ++b) p[b] = static_cast<uint16_t>(b);
  for (DType wide : {DType::f32, DType::f64}) {
    SCOPED_TRACE(dtype_name(wide));
    for (bool strided : {false, true}) {
      const Tensor src = strided ? all.t() : all;
      const Tensor back = src.to(wide).to(DType::bf16).contiguous();
      const Tensor want = src.contiguous();
      const auto* g = reinterpret_cast<const uint16_t*>(back.data<BFloat16>());
      const auto* w = reinterpret_cast<const uint16_t*>(want.data<BFloat16>());
      for (int64_t i = 0; i < 65536; ++i) {
        if (is_nan16(w[i])) {
          ASSERT_EQ(g[i], (w[i] & 0x8000u) | 0x7fc0u) << i;
        } else {
          ASSERT_EQ(g[i], w[i]) << i;
        }
      }
    }
  }
}

// The contiguous f32 -> bf16 loop against the scalar code on values around every rounding
// boundary of the positive and negative patterns.
TEST(BFloat16, ContiguousConversionMatchesTheScalarCode) {
  std::vector<float> probes;
  for (uint32_t b = 0; b < 0x7f80; b += 3) {
    const uint32_t mid = (b << 16) | 0x8000u;
    for (uint32_t x : {mid, mid - 1, mid + 1, b << 16}) {
      probes.push_back(from_bits(x));
      probes.push_back(from_bits(x | 0x80000000u));
    }
  }
  Tensor f = empty({static_cast<int64_t>(probes.size())});
  std::memcpy(f.data<float>(), probes.data(), probes.size() * 4);
  const Tensor got = f.to(DType::bf16);
  const auto* g = reinterpret_cast<const uint16_t*>(got.data<BFloat16>());
  for (size_t i = 0; i < probes.size(); ++i) ASSERT_EQ(g[i], BFloat16::from_float(probes[i])) << probes[i];
}

TEST(BFloat16, DtypeNamesAndErrors) {
  EXPECT_STREQ(dtype_name(DType::bf16), "bf16");
  EXPECT_EQ(dtype_from_name("bf16"), DType::bf16);
  EXPECT_TRUE(is_float16(DType::bf16));
  EXPECT_TRUE(is_float16(DType::f16));
  EXPECT_FALSE(is_float16(DType::f32));
  try {
    dtype_from_name("bfloat");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("f16, bf16"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace minidl
