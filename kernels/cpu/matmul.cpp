// CPU batched GEMM: minidl's sgemm for f32 on AVX-512 (sgemm.h), Eigen otherwise; bf16 has its
// own kernel (bf16_gemm.h) and f16 runs the f32 GEMM on widened copies. Operands that
// are row-major or column-major in memory (e.g. a transposed weight) are mapped without a copy;
// anything else is made contiguous first.
// Threads split the work themselves and each runs Eigen single-threaded: a batch of products one
// per thread, one product by blocks of rows or columns of the output. Eigen's own parallel GEMM
// busy-waits on its threads at every depth block, which collapses (up to 200x slower) when a core
// is busy with anything else and is slower than one thread for a long-depth product such as the
// Keras CNN's 320000-input dense layer.
#include <omp.h>

#include <algorithm>

#include <Eigen/Core>

#include "kernels/common/checks.h"
#include "kernels/cpu/bf16_gemm.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/sgemm.h"
#include "kernels/cpu/strided.h"
#include "kernels/cpu/workspace.h"

namespace minidl::cpu {
namespace {

template <typename T>
using RowMap = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>, 0, Eigen::OuterStride<>>;
template <typename T>
using ColMap = Eigen::Map<const Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::ColMajor>, 0, Eigen::OuterStride<>>;
template <typename T>
using OutMap = Eigen::Map<Eigen::Matrix<T, Eigen::Dynamic, Eigen::Dynamic, Eigen::RowMajor>>;

// Layout of a 2-D operand [rows, cols] with element strides (rs, cs).
enum class Layout { Row, Col, Other };
Layout layout_of(int64_t rows, int64_t cols, int64_t rs, int64_t cs) {
  if (cs == 1 && (rs >= cols || rows == 1)) return Layout::Row;
  if (rs == 1 && (cs >= rows || cols == 1)) return Layout::Col;
  return Layout::Other;
}

template <typename T, typename F>
void with_map(const T* p, int64_t rows, int64_t cols, int64_t rs, int64_t cs, Layout l, F&& f) {
  if (l == Layout::Row) {
    f(RowMap<T>(p, rows, cols, Eigen::OuterStride<>(std::max<int64_t>(rs, cols))));
  } else {
    f(ColMap<T>(p, rows, cols, Eigen::OuterStride<>(std::max<int64_t>(cs, rows))));
  }
}

}  // namespace

std::pair<bool, bool> matmul_operand_copies(const Tensor& a, const Tensor& b) {
  const int64_t M = a.shape()[1], K = a.shape()[2], N = b.shape()[2];
  return {layout_of(M, K, a.strides()[1], a.strides()[2]) == Layout::Other,
          layout_of(K, N, b.strides()[1], b.strides()[2]) == Layout::Other};
}

void CpuBackend::matmul(const Tensor& a_in, const Tensor& b_in, const Tensor& out) {
  if (a_in.dtype() == DType::bf16 && b_in.dtype() == DType::bf16 && out.dtype() == DType::bf16) {
    return bf16_matmul(a_in, b_in, out);  // f32 accumulation, one rounding
  }
  if (is_half(a_in) || is_half(b_in) || is_half(out)) {  // f16: an f32 GEMM (f32 accumulation), one rounding
    return in_f32(out, [&](const Tensor& o) { matmul(widen_half(a_in), widen_half(b_in), o); });
  }
  const int64_t B = out.shape()[0], M = out.shape()[1], N = out.shape()[2], K = a_in.shape()[2];
  const std::pair<Tensor, Tensor> operands = common::gemm_operands(a_in, b_in, matmul_operand_copies(a_in, b_in));
  const Tensor &a = operands.first, &b = operands.second;
  const Layout la = layout_of(M, K, a.strides()[1], a.strides()[2]);
  const Layout lb = layout_of(K, N, b.strides()[1], b.strides()[2]);
  dispatch_wide(out.dtype(), "matmul", [&](auto tag) {
    using T = decltype(tag);
    const T* pa = a.data<T>();
    const T* pb = b.data<T>();
    T* po = out.data<T>();
    const int64_t sa = a.strides()[0], sb = b.strides()[0];
    auto one = [&](int64_t i) {
      OutMap<T> o(po + i * M * N, M, N);
      if (K == 0) {
        o.setZero();
        return;
      }
      with_map<T>(pa + i * sa, M, K, a.strides()[1], a.strides()[2], la, [&](const auto& ma) {
        with_map<T>(pb + i * sb, K, N, b.strides()[1], b.strides()[2], lb, [&](const auto& mb) {
          product(o, ma, mb, false);
        });
      });
    };
    if (B == 1) {
      // Blocks of at least kMinBlock rows (or columns) of the larger output side, one per thread.
      constexpr int64_t kMinBlock = 16;
      const bool by_rows = M >= N;
      const int64_t side = by_rows ? M : N;
      const int64_t parts = std::min<int64_t>(omp_get_max_threads(), side / kMinBlock);
      if (parts <= 1 || M * N * std::max<int64_t>(K, 1) < (int64_t{1} << 18) || K == 0) {
        one(0);
        return;
      }
      OutMap<T> o(po, M, N);
      with_map<T>(pa, M, K, a.strides()[1], a.strides()[2], la, [&](const auto& ma) {
        with_map<T>(pb, K, N, b.strides()[1], b.strides()[2], lb, [&](const auto& mb) {
#pragma omp parallel for schedule(static) num_threads(static_cast<int>(parts))
          for (int64_t p = 0; p < parts; ++p) {
            const int64_t lo = side * p / parts, len = side * (p + 1) / parts - lo;
            if (by_rows) {
              product(o.middleRows(lo, len), ma.middleRows(lo, len), mb, false);
            } else {
              product(o.middleCols(lo, len), ma, mb.middleCols(lo, len), false);
            }
          }
        });
      });
    } else {
      // Tiny products are not worth waking the thread team.
#pragma omp parallel for schedule(static) if (B * M * N * std::max<int64_t>(K, 1) > 32768)
      for (int64_t i = 0; i < B; ++i) one(i);
    }
  });
}

}  // namespace minidl::cpu
