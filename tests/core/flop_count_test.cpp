// FlopCount (core/flop_count.h): the convolutions' and matrix products' flops, 2 a multiply-add,
// counted while a count lives on the thread, by every enclosing count, and by none after it ends.
#include <gtest/gtest.h>

#include <thread>

#include "core/flop_count.h"
#include "core/ops.h"

namespace minidl {
namespace {

TEST(FlopCount, CountsConvolutionsAndMatrixProductsWhileItLives) {
  const Tensor x = randn({2, 3, 8, 8}), w = randn({4, 3, 3, 3});
  Conv2dOptions o;
  o.padding = {1, 1};
  const double conv = 2.0 * (2 * 4 * 8 * 8) * (3 * 3 * 3);
  const double gemm = 2.0 * 5 * 7 * 6;   // [5, 6] x [6, 7]
  FlopCount outer;
  {
    FlopCount inner;
    (void)conv2d(x, w, Tensor(), o);
    EXPECT_DOUBLE_EQ(inner.flops(), conv);
    (void)matmul(randn({5, 6}), randn({6, 7}));
    EXPECT_DOUBLE_EQ(inner.flops(), conv + gemm);
  }
  EXPECT_DOUBLE_EQ(outer.flops(), conv + gemm) << "an enclosing count sees the inner one's flops";
  (void)add(x, x);
  EXPECT_DOUBLE_EQ(outer.flops(), conv + gemm) << "elementwise ops are not counted";
  double other_thread = -1;
  std::thread([&] {
    FlopCount mine;
    (void)matmul(randn({5, 6}), randn({6, 7}));
    other_thread = mine.flops();
  }).join();
  EXPECT_DOUBLE_EQ(other_thread, gemm);
  EXPECT_DOUBLE_EQ(outer.flops(), conv + gemm) << "another thread's ops count on that thread";
}

}  // namespace
}  // namespace minidl
