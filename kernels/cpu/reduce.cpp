// CPU reductions over any set of dims of a strided tensor. Sums accumulate in double (f32, f64, f16
// and bf16) or int64; large reductions are split into fixed blocks combined in order, so results do not
// depend on the thread count.
#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/strided.h"

namespace minidl::cpu {
namespace {

template <typename T>
constexpr bool kFloatLike = std::is_floating_point_v<T> || is_float16_v<T>;

template <typename T>
bool is_nan(T v) {
  if constexpr (is_float16_v<T>) {
    return (v.bits & 0x7fffu) > T::kInfBits;
  } else {
    return std::isnan(v);
  }
}

struct Dims {
  std::vector<int64_t> sizes, strides;  // outermost first
  int64_t count() const {
    int64_t c = 1;
    for (int64_t s : sizes) c *= s;
    return c;
  }
  int64_t offset_of(int64_t lin) const {  // element offset of the lin-th (row-major) position
    int64_t off = 0;
    for (int64_t d = static_cast<int64_t>(sizes.size()) - 1; d >= 0; --d) {
      off += (lin % sizes[d]) * strides[d];
      lin /= sizes[d];
    }
    return off;
  }
};

template <typename T>
struct Acc {
  double sum = 0;
  int64_t isum = 0;
  T best{};
  int64_t best_idx = -1;
};

template <typename T>
void visit(ReduceOp op, const T* base, const Dims& r, int64_t begin, int64_t end, Acc<T>& acc) {
  const bool is_max = op == ReduceOp::Max || op == ReduceOp::ArgMax;
  const bool is_ext = op != ReduceOp::Sum && op != ReduceOp::Mean;
  const int64_t inner = r.sizes.empty() ? 1 : r.sizes.back();
  const int64_t inner_stride = r.strides.empty() ? 0 : r.strides.back();
  int64_t lin = begin;
  while (lin < end) {
    const int64_t pos = lin % inner;
    const int64_t n = std::min(inner - pos, end - lin);
    const T* p = base + r.offset_of(lin);
    if (!is_ext) {
      if constexpr (kFloatLike<T>) {
        double s = 0;
        int64_t i = 0;
        if (inner_stride == 1 && !is_float16_v<T>) {
          // Eight partial sums the compiler keeps in one vector: a single running sum is a chain of
          // dependent adds, 4 cycles per element (the conv bias gradient sums whole activations).
          double part[8] = {};
          for (; i + 8 <= n; i += 8)
            for (int j = 0; j < 8; ++j) part[j] += static_cast<double>(p[i + j]);
          for (double v : part) s += v;
        }
        for (; i < n; ++i) s += static_cast<double>(p[i * inner_stride]);
        acc.sum += s;
      } else {
        int64_t s = 0;
        for (int64_t i = 0; i < n; ++i) s += static_cast<int64_t>(p[i * inner_stride]);
        acc.isum += s;
      }
    } else {
      for (int64_t i = 0; i < n; ++i) {
        const T v = p[i * inner_stride];
        bool take = acc.best_idx < 0;
        if (!take) {
          if constexpr (kFloatLike<T>) {
            if (is_nan(acc.best)) continue;  // NaN wins and stays, as PyTorch's max
            if (is_nan(v)) take = true;
          }
          take = take || (is_max ? v > acc.best : v < acc.best);
        }
        if (take) {
          acc.best = v;
          acc.best_idx = lin + i;
        }
      }
    }
    lin += n;
  }
}

template <typename T>
void combine(ReduceOp op, Acc<T>& into, const Acc<T>& part) {
  into.sum += part.sum;
  into.isum += part.isum;
  if (part.best_idx < 0) return;
  const bool is_max = op == ReduceOp::Max || op == ReduceOp::ArgMax;
  bool take = into.best_idx < 0;
  if (!take) {
    if constexpr (kFloatLike<T>) {
      if (is_nan(into.best)) return;
      if (is_nan(part.best)) take = true;
    }
    take = take || (is_max ? part.best > into.best : part.best < into.best);
  }
  if (take) {
    into.best = part.best;
    into.best_idx = part.best_idx;
  }
}

}  // namespace

void CpuBackend::reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, const Tensor& out) {
  Dims kept, red;
  for (int64_t d = 0; d < x.dim(); ++d) {
    const bool reduced = std::find(dims.begin(), dims.end(), d) != dims.end();
    Dims& target = reduced ? red : kept;
    target.sizes.push_back(x.shape()[d]);
    target.strides.push_back(x.strides()[d]);
  }
  const int64_t O = kept.count(), R = red.count();
  const char* name = op == ReduceOp::Sum ? "sum" : op == ReduceOp::Mean ? "mean" : op == ReduceOp::Max ? "max"
                   : op == ReduceOp::Min ? "min" : op == ReduceOp::ArgMax ? "argmax" : "argmin";
  auto run = [&](auto tag) {
    using T = decltype(tag);
    const T* base = x.data<T>();
    auto write = [&](int64_t o, const Acc<T>& acc) {
      switch (op) {
        case ReduceOp::Sum:
          if (out.dtype() == DType::f32) out.data<float>()[o] = static_cast<float>(acc.sum);
          else if (out.dtype() == DType::f64) out.data<double>()[o] = acc.sum;
          else if (out.dtype() == DType::f16) out.data<Half>()[o] = Half(static_cast<float>(acc.sum));
          else if (out.dtype() == DType::bf16) out.data<BFloat16>()[o] = BFloat16(static_cast<float>(acc.sum));
          else if (out.dtype() == DType::i32) out.data<int32_t>()[o] = static_cast<int32_t>(acc.isum);
          else out.data<int64_t>()[o] = acc.isum;
          break;
        case ReduceOp::Mean: {
          const double m = R > 0 ? acc.sum / static_cast<double>(R) : std::numeric_limits<double>::quiet_NaN();
          if (out.dtype() == DType::f32) out.data<float>()[o] = static_cast<float>(m);
          else if (out.dtype() == DType::f16) out.data<Half>()[o] = Half(static_cast<float>(m));
          else if (out.dtype() == DType::bf16) out.data<BFloat16>()[o] = BFloat16(static_cast<float>(m));
          else out.data<double>()[o] = m;
          break;
        }
        case ReduceOp::Max:
        case ReduceOp::Min: out.data<T>()[o] = acc.best; break;
        case ReduceOp::ArgMax:
        case ReduceOp::ArgMin: {
          // best_idx is a row-major position among the reduced elements; one reduced dim here.
          out.data<int64_t>()[o] = acc.best_idx;
          break;
        }
      }
    };
    constexpr int64_t kBlock = 1 << 14;
    if (O >= 16 || R <= kBlock) {
#pragma omp parallel for schedule(static) if (O > 1 && O * R > 32768)
      for (int64_t o = 0; o < O; ++o) {
        Acc<T> acc;
        visit<T>(op, base + kept.offset_of(o), red, 0, R, acc);
        write(o, acc);
      }
      return;
    }
    // Few outputs, many elements each: split each output's range into fixed blocks.
    const int64_t nb = (R + kBlock - 1) / kBlock;
    std::vector<Acc<T>> parts(static_cast<size_t>(nb));
    for (int64_t o = 0; o < O; ++o) {
      const T* ob = base + kept.offset_of(o);
#pragma omp parallel for schedule(static)
      for (int64_t b = 0; b < nb; ++b) {
        parts[b] = Acc<T>{};
        visit<T>(op, ob, red, b * kBlock, std::min(R, (b + 1) * kBlock), parts[b]);
      }
      Acc<T> acc;
      for (const auto& p : parts) combine<T>(op, acc, p);
      write(o, acc);
    }
  };
  dispatch_arith(x.dtype(), name, run);
}

}  // namespace minidl::cpu
