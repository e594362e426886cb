// Helpers shared by the conv2d and pooling kernel tests (tests/kernels/conv_test.cpp and
// pool_test.cpp): seeded f64 values, tensor construction, a scaled closeness check, error-message
// capture and the small finite-difference check both files run against backward.
#pragma once
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "tests/support/error_of.h"
#include "core/autograd.h"
#include "core/ops.h"
#include "core/tensor.h"

namespace minidl::testing::conv_pool {

using Vec = std::vector<double>;

inline Vec random_vec(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> dist(-1.0, 1.0);
  Vec v(n);
  for (double& x : v) x = dist(rng);
  return v;
}

inline Tensor make(const Vec& v, const Shape& s, DType dt = DType::f64, bool requires_grad = false) {
  Tensor t = from_vector(v, s, {.dtype = dt});
  if (requires_grad) t.set_requires_grad(true);
  return t;
}

inline void expect_near_vec(const Vec& got, const Vec& want, double tol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  double scale = 1.0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], tol * scale) << what << " at flat index " << i;
  }
}

using ::minidl::testing::error_of;

// Central finite differences of sum(f(inputs) * r) against backward, in f64.
inline void gradcheck(const std::function<Tensor(const std::vector<Tensor>&)>& f, const std::vector<Shape>& shapes,
                      uint32_t seed) {
  std::vector<Vec> vals;
  std::vector<Tensor> ins;
  for (size_t i = 0; i < shapes.size(); ++i) {
    vals.push_back(random_vec(numel_of(shapes[i]), seed + static_cast<uint32_t>(i)));
    ins.push_back(make(vals.back(), shapes[i], DType::f64, true));
  }
  const Tensor y0 = f(ins);
  const Tensor r = make(random_vec(y0.numel(), seed + 100), y0.shape());
  sum(mul(f(ins), r)).backward();
  auto loss = [&](const std::vector<Vec>& v) {
    NoGradGuard ng;
    std::vector<Tensor> ts;
    for (size_t i = 0; i < v.size(); ++i) ts.push_back(make(v[i], shapes[i]));
    return sum(mul(f(ts), r)).item();
  };
  const double eps = 1e-6;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Vec analytic = ins[i].grad().to_vector();
    for (size_t j = 0; j < vals[i].size(); ++j) {
      std::vector<Vec> plus = vals, minus = vals;
      plus[i][j] += eps;
      minus[i][j] -= eps;
      const double numeric = (loss(plus) - loss(minus)) / (2 * eps);
      ASSERT_NEAR(analytic[j], numeric, 1e-6 * std::max(1.0, std::abs(numeric))) << "input " << i << " element " << j;
    }
  }
}

}  // namespace minidl::testing::conv_pool
