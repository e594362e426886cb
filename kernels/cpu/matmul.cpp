// CPU batched GEMM through Eigen. Operands that are row-major or column-major in memory (e.g. a
// transposed weight) are mapped without a copy; anything else is made contiguous first.
// One product uses Eigen's own threads; many products run one per thread.
#include <Eigen/Core>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/strided.h"

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

void CpuBackend::matmul(const Tensor& a_in, const Tensor& b_in, const Tensor& out) {
  if (is_half(a_in) || is_half(b_in) || is_half(out)) {  // f16: an f32 GEMM (f32 accumulation), one rounding
    const Tensor o = f32_output_for(out);
    matmul(widen_half(a_in), widen_half(b_in), o);
    return narrow_into(o, out);
  }
  const int64_t B = out.shape()[0], M = out.shape()[1], N = out.shape()[2], K = a_in.shape()[2];
  Tensor a = a_in, b = b_in;
  Layout la = layout_of(M, K, a.strides()[1], a.strides()[2]);
  Layout lb = layout_of(K, N, b.strides()[1], b.strides()[2]);
  if (la == Layout::Other) {
    a = a.contiguous();
    la = Layout::Row;
  }
  if (lb == Layout::Other) {
    b = b.contiguous();
    lb = Layout::Row;
  }
  dispatch_floating(out.dtype(), "matmul", [&](auto tag) {
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
          o.noalias() = ma * mb;
        });
      });
    };
    if (B == 1) {
      one(0);  // Eigen parallelises a single large product itself
    } else {
      // Tiny products are not worth waking the thread team.
#pragma omp parallel for schedule(static) if (B * M * N * std::max<int64_t>(K, 1) > 32768)
      for (int64_t i = 0; i < B; ++i) one(i);
    }
  });
}

}  // namespace minidl::cpu
