// What the f16 and bf16 CPU tests both measure: the relative error of a low-precision result
// against a wider reference, and the raw bytes of a tensor for bit-for-bit comparisons.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "core/tensor.h"

namespace minidl::testing {

// Largest |got - want| / (|want| + atol) over all elements; a NaN in want must be a NaN in got.
inline double max_rel_err(const Tensor& got, const Tensor& want, double atol = 1e-3) {
  EXPECT_EQ(got.shape(), want.shape());
  const auto g = got.to_vector(), w = want.to_vector();
  double worst = 0.0;
  for (size_t i = 0; i < g.size(); ++i) {
    if (std::isnan(w[i])) {
      EXPECT_TRUE(std::isnan(g[i])) << "element " << i;
      continue;
    }
    worst = std::max(worst, std::abs(g[i] - w[i]) / (std::abs(w[i]) + atol));
  }
  return worst;
}

// sqrt(sum (got - want)^2 / sum want^2), the parity tests' measure: an error that a few elements
// near zero after cancellation would blow up element by element stays meaningful for the whole.
inline double normalised_err(const Tensor& got, const Tensor& want) {
  EXPECT_EQ(got.shape(), want.shape());
  const auto g = got.to_vector(), w = want.to_vector();
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < g.size(); ++i) {
    num += (g[i] - w[i]) * (g[i] - w[i]);
    den += w[i] * w[i];
  }
  return den > 0 ? std::sqrt(num / den) : std::sqrt(num);
}

// The bytes of t's elements in row-major order (a contiguous copy when t is strided).
inline std::string raw_bytes(const Tensor& t) {
  const Tensor c = t.contiguous();
  return std::string(static_cast<const char*>(c.data_ptr()), c.nbytes());
}

}  // namespace minidl::testing
