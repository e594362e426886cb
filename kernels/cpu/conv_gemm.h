// The GEMM of the CPU convolution (conv.cpp) without Eigen's own threads: a product made outside a
// parallel region is split over OpenMP threads by blocks of its result, as matmul.cpp does, because
// Eigen's parallel GEMM busy-waits and collapses when a core is busy elsewhere. Each block is
// one single-threaded product(): minidl's sgemm for f32 on AVX-512, Eigen otherwise.
#pragma once
#include <omp.h>

#include <algorithm>
#include <cstdint>

#include "kernels/cpu/sgemm.h"

namespace minidl::cpu::conv_detail {

// Eigen threads a product itself when it is made outside a parallel region and has at least
// 2 x 50000 multiply-adds; its threads then spin until the others have packed their blocks
// (lab/results/bench/conv_threads_cpu_2026-11-22.md: 0.03 ms of work took 12-46 ms on a loaded
// machine). Such products are split into blocks of rows or columns of the result, at least
// kMinGemmBlock wide, one per thread of a team of at least two (inside a team Eigen does not
// thread), each computed by Eigen single-threaded. Inside a parallel region they run as they are.
constexpr double kEigenThreadedWork = 100000;
constexpr int64_t kMinGemmBlock = 16;

// dst = lhs * rhs, or dst += lhs * rhs.
template <typename Dst, typename Lhs, typename Rhs>
void gemm(Dst dst, const Lhs& lhs, const Rhs& rhs, bool accumulate) {
  const auto run = [accumulate](auto d, const auto& l, const auto& r) { product(d, l, r, accumulate); };
  const int nt = omp_get_max_threads();
  const double work =
      static_cast<double>(dst.rows()) * static_cast<double>(dst.cols()) * static_cast<double>(lhs.cols());
  if (nt <= 1 || omp_get_num_threads() > 1 || work < kEigenThreadedWork) return run(dst, lhs, rhs);
  const bool by_rows = dst.rows() >= dst.cols();
  const int64_t side = by_rows ? dst.rows() : dst.cols();
  const int64_t parts = std::clamp<int64_t>(side / kMinGemmBlock, 1, nt);
#pragma omp parallel for schedule(static) num_threads(std::max<int>(2, static_cast<int>(parts)))
  for (int64_t q = 0; q < parts; ++q) {
    const int64_t lo = side * q / parts, len = side * (q + 1) / parts - lo;
    if (by_rows) {
      run(dst.middleRows(lo, len), lhs.middleRows(lo, len), rhs);
    } else {
      run(dst.middleCols(lo, len), lhs, rhs.middleCols(lo, len));
    }
  }
}

}  // namespace minidl::cpu::conv_detail
