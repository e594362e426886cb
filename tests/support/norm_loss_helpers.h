// Helpers shared by the batch-norm/dropout and softmax/loss kernel tests
// (tests/kernels/batch_norm_dropout_test.cpp, softmax_loss_test.cpp): seeded normal values, tensor
// construction, closeness and error-message checks, and a wrapper over the shared gradcheck.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "core/ops.h"
#include "core/tensor.h"
#include "tests/support/gradcheck.h"

namespace minidl::testing::norm_loss {

using Vec = std::vector<double>;

inline Vec random_vals(size_t n, uint64_t seed, double scale = 1.0, double shift = 0.0) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> dist(0.0, 1.0);
  Vec v(n);
  for (double& x : v) x = shift + scale * dist(rng);
  return v;
}

inline Tensor make(const Vec& v, const Shape& shape, DType dt = DType::f64, bool requires_grad = false) {
  Tensor t = from_vector(v, shape, {.dtype = dt});
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

inline void expect_close(const Vec& actual, const Vec& expected, double atol, double rtol, const std::string& what) {
  ASSERT_EQ(actual.size(), expected.size()) << what;
  for (size_t i = 0; i < actual.size(); ++i) {
    ASSERT_NEAR(actual[i], expected[i], atol + rtol * std::abs(expected[i])) << what << " at " << i;
  }
}

// Runs f and checks it throws minidl::Error whose message contains every one of `parts`.
inline void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
  } catch (const Error& e) {
    const std::string msg = e.what();
    for (const std::string& p : parts) EXPECT_NE(msg.find(p), std::string::npos) << "missing '" << p << "' in: " << msg;
    return;
  }
  ADD_FAILURE() << "expected a minidl::Error mentioning '" << (parts.empty() ? "" : parts[0]) << "'";
}

// The shared finite-difference checker (f64, perturbs in place, so inputs may be strided views).
inline void expect_gradcheck(const testing::GradFn& f, std::vector<Tensor> inputs, const std::string& what) {
  const testing::GradcheckResult r = testing::gradcheck(f, std::move(inputs));
  EXPECT_TRUE(r.ok) << what << ": " << r.message;
  EXPECT_GT(r.num_checked, 0) << what;
}

}  // namespace minidl::testing::norm_loss
