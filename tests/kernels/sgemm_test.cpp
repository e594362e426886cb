// minidl's AVX-512 SGEMM (kernels/cpu/sgemm.cpp) against a double-precision triple loop, over the
// shapes its blocking special-cases: edges of the 8 x 32 register tile, depths past one 512-deep
// block, columns past one 2048-wide block, rows past one 160-row block, and every operand layout
// the packing reads differently (row-major, column-major, transposed, arbitrary strides), with
// and without accumulation. The convolution and matmul tests then cover it inside the ops.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/sgemm.h"

namespace minidl::cpu {
namespace {

// A strided view of a matrix stored in `data`: element (r, c) at data[off + r * rs + c * cs].
struct Operand {
  std::vector<float> data;
  int64_t rs = 0, cs = 0, off = 0;
  float at(int64_t r, int64_t c) const { return data[static_cast<size_t>(off + r * rs + c * cs)]; }
};

enum class Layout { Row, Col, Padded, Strided };

const char* name(Layout l) {
  switch (l) {
    case Layout::Row: return "row-major";
    case Layout::Col: return "column-major";
    case Layout::Padded: return "row-major with a padded row stride";
    case Layout::Strided: return "strided both ways";
  }
  return "?";
}

Operand make(int64_t rows, int64_t cols, Layout l, std::mt19937& gen) {
  Operand o;
  switch (l) {
    case Layout::Row: o.rs = cols, o.cs = 1; break;
    case Layout::Col: o.rs = 1, o.cs = rows; break;
    case Layout::Padded: o.rs = cols + 5, o.cs = 1, o.off = 3; break;
    case Layout::Strided: o.rs = 2, o.cs = 2 * rows + 1, o.off = 1; break;
  }
  const int64_t size = o.off + (rows - 1) * o.rs + (cols - 1) * o.cs + 1;
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  o.data.resize(static_cast<size_t>(std::max<int64_t>(size, 1)));
  for (float& v : o.data) v = u(gen);
  return o;
}

// Runs one product and compares every element of C with the f64 reference, within a bound that
// grows with the depth (f32 rounding of k products); elements outside C's columns must not change.
void check(int64_t m, int64_t n, int64_t k, Layout la, Layout lb, bool accumulate) {
  SCOPED_TRACE("m=" + std::to_string(m) + " n=" + std::to_string(n) + " k=" + std::to_string(k) + ", A " + name(la) +
               ", B " + name(lb) + (accumulate ? ", accumulate" : ""));
  std::mt19937 gen(static_cast<uint32_t>(m * 131 + n * 17 + k));
  const Operand a = make(m, k, la, gen), b = make(k, n, lb, gen);
  const int64_t ldc = n + 3;  // a row stride past the columns: the gap must stay untouched
  std::vector<float> c(static_cast<size_t>(m * ldc));
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  for (float& v : c) v = u(gen);
  const std::vector<float> before = c;
  sgemm(m, n, k, a.data.data() + a.off, a.rs, a.cs, b.data.data() + b.off, b.rs, b.cs, c.data(), ldc, accumulate);
  const double tol = 1e-6 * (8.0 + static_cast<double>(k));
  int bad = 0;
  for (int64_t i = 0; i < m; ++i) {
    for (int64_t j = 0; j < ldc; ++j) {
      const float got = c[static_cast<size_t>(i * ldc + j)];
      const float old = before[static_cast<size_t>(i * ldc + j)];
      if (j >= n) {
        if (got != old && ++bad <= 5) ADD_FAILURE() << "wrote outside C at (" << i << ", " << j << ")";
        continue;
      }
      double want = accumulate ? old : 0.0;
      for (int64_t p = 0; p < k; ++p) want += static_cast<double>(a.at(i, p)) * b.at(p, j);
      if (std::abs(got - want) > tol && ++bad <= 5) {
        ADD_FAILURE() << "C(" << i << ", " << j << ") = " << got << ", reference " << want;
      }
    }
  }
  EXPECT_EQ(bad, 0);
}

TEST(Sgemm, EdgesOfTheRegisterTileInEveryLayout) {
  if (!kSgemmAvailable) GTEST_SKIP() << "this build has no AVX-512: products use Eigen";
  const Layout layouts[] = {Layout::Row, Layout::Col, Layout::Padded, Layout::Strided};
  for (Layout la : layouts) {
    for (Layout lb : layouts) {
      for (bool acc : {false, true}) {
        check(1, 1, 1, la, lb, acc);
        check(7, 31, 5, la, lb, acc);    // one partial tile
        check(9, 33, 17, la, lb, acc);   // a full tile and a one-wide edge both ways
        check(24, 64, 16, la, lb, acc);  // whole tiles only
        check(13, 47, 40, la, lb, acc);  // depth not a multiple of the 16 x 16 transposes
      }
    }
  }
}

TEST(Sgemm, ProductsLargerThanOneCacheBlock) {
  if (!kSgemmAvailable) GTEST_SKIP() << "this build has no AVX-512: products use Eigen";
  check(20, 40, 1100, Layout::Row, Layout::Row, false);    // three depth blocks, the last partial
  check(20, 40, 1100, Layout::Row, Layout::Col, true);     // the conv weight gradient's B^T layout
  check(171, 36, 70, Layout::Col, Layout::Row, false);     // rows past one 160-row block
  check(10, 2100, 33, Layout::Row, Layout::Row, true);     // columns past one 2048-wide block
  check(64, 576, 600, Layout::Row, Layout::Col, false);    // a ResNet weight-gradient shape
  // Depth blocks of 256 or more with contiguous rows of B pack the whole block row by row:
  // partial panels, a padded row stride, and a second column block.
  check(9, 70, 300, Layout::Col, Layout::Padded, true);
  check(9, 2100, 280, Layout::Row, Layout::Row, false);
}

TEST(Sgemm, ZeroDepthWritesZerosOrLeavesCAlone) {
  if (!kSgemmAvailable) GTEST_SKIP() << "this build has no AVX-512: products use Eigen";
  std::vector<float> c = {1, 2, 3, 4, 5, 6};
  const float dummy = 0.0f;
  sgemm(2, 3, 0, &dummy, 1, 1, &dummy, 1, 1, c.data(), 3, true);
  EXPECT_EQ(c, (std::vector<float>{1, 2, 3, 4, 5, 6}));
  sgemm(2, 2, 0, &dummy, 1, 1, &dummy, 1, 1, c.data(), 3, false);
  EXPECT_EQ(c, (std::vector<float>{0, 0, 3, 0, 0, 6}));
}

}  // namespace
}  // namespace minidl::cpu
