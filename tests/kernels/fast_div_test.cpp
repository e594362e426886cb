// kernels/cuda/device/fast_div.h, the CUDA pooling kernels' division by a launch-time constant,
// against '/' for divisors around every power of two and the pooling geometries' small ones, and
// dividends at both ends of the range it promises (n < 2^31).
#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <vector>

#include "kernels/cuda/device/fast_div.h"

namespace minidl::cuda {
namespace {

TEST(FastDiv, EqualsIntegerDivisionBelowTwoToThe31) {
  std::vector<int64_t> divisors;
  for (int64_t d = 1; d <= 300; ++d) divisors.push_back(d);
  for (int b = 9; b < 31; ++b) {
    for (int64_t off : {-3, -1, 0, 1, 3}) divisors.push_back((int64_t{1} << b) + off);
  }
  divisors.push_back(FastDiv::kLimit - 1);
  std::mt19937_64 rng(11);
  std::uniform_int_distribution<uint32_t> any(0, static_cast<uint32_t>(FastDiv::kLimit - 1));
  for (const int64_t d : divisors) {
    const FastDiv f(d);
    ASSERT_EQ(f.divisor(), static_cast<uint32_t>(d));
    std::vector<uint32_t> ns = {0, 1, static_cast<uint32_t>(d - 1), static_cast<uint32_t>(d),
                                static_cast<uint32_t>(FastDiv::kLimit - 1), static_cast<uint32_t>(FastDiv::kLimit - 2)};
    for (int64_t k : {int64_t{1}, int64_t{2}, int64_t{1000}, (FastDiv::kLimit - 1) / d}) {
      const int64_t m = k * d;   // multiples and their neighbours
      for (int64_t n : {m - 1, m, m + 1})
        if (n >= 0 && n < FastDiv::kLimit) ns.push_back(static_cast<uint32_t>(n));
    }
    for (int i = 0; i < 2000; ++i) ns.push_back(any(rng));
    for (const uint32_t n : ns) ASSERT_EQ(f.div(n), n / static_cast<uint32_t>(d)) << n << " / " << d;
  }
}

}  // namespace
}  // namespace minidl::cuda
