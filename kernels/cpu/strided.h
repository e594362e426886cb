// Iteration over N strided operands of one shape, the engine under every elementwise CPU kernel.
// Dims are coalesced first (a contiguous tensor becomes one long dim) and the work is split into
// fixed-size chunks across OpenMP threads; chunking does not depend on the thread count.
#pragma once
#include <omp.h>

#include <array>
#include <cstdint>
#include <vector>

#include "core/dtype.h"
#include "core/error.h"
#include "core/tensor.h"
#include "kernels/cpu/half.h"

namespace minidl::cpu {

template <size_t N>
struct StridedPlan {
  std::vector<int64_t> sizes;                       // coalesced, outermost first
  std::array<std::vector<int64_t>, N> strides;      // per operand, in elements
  int64_t numel = 1;
};

template <size_t N>
StridedPlan<N> make_plan(const Shape& shape, const std::array<const Shape*, N>& strides) {
  StridedPlan<N> p;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 1) continue;  // size-1 dims do not move any pointer
    p.sizes.push_back(shape[d]);
    for (size_t k = 0; k < N; ++k) p.strides[k].push_back((*strides[k])[d]);
  }
  p.numel = numel_of(shape);
  // Merge dim i into dim i-1 when every operand is contiguous across the pair.
  for (size_t i = p.sizes.size(); i-- > 1;) {
    bool mergeable = true;
    for (size_t k = 0; k < N; ++k) mergeable = mergeable && p.strides[k][i - 1] == p.strides[k][i] * p.sizes[i];
    if (mergeable) {
      p.sizes[i - 1] *= p.sizes[i];
      p.sizes.erase(p.sizes.begin() + static_cast<int64_t>(i));
      for (size_t k = 0; k < N; ++k) {
        p.strides[k][i - 1] = p.strides[k][i];
        p.strides[k].erase(p.strides[k].begin() + static_cast<int64_t>(i));
      }
    }
  }
  if (p.sizes.empty()) {
    p.sizes.push_back(1);
    for (size_t k = 0; k < N; ++k) p.strides[k].push_back(0);
  }
  return p;
}

// Calls body(ptrs, n, inner_strides) for runs of n elements along the innermost coalesced dim,
// where ptrs[k] points at operand k's first element of the run (element pointers as char*).
template <size_t N, typename Body>
void for_each_run(const StridedPlan<N>& p, std::array<char*, N> base, const std::array<size_t, N>& elem_size,
                  Body&& body) {
  if (p.numel == 0) return;
  const int64_t nd = static_cast<int64_t>(p.sizes.size());
  const int64_t inner = p.sizes.back();
  std::array<int64_t, N> inner_stride_bytes;
  for (size_t k = 0; k < N; ++k) inner_stride_bytes[k] = p.strides[k].back() * static_cast<int64_t>(elem_size[k]);
  constexpr int64_t kChunk = 1 << 15;
  const int64_t num_chunks = (p.numel + kChunk - 1) / kChunk;
#pragma omp parallel for schedule(static) if (num_chunks > 1)
  for (int64_t c = 0; c < num_chunks; ++c) {
    int64_t lin = c * kChunk;
    const int64_t end = std::min(p.numel, lin + kChunk);
    // Decompose the start index into a multi-index over the outer dims.
    std::vector<int64_t> idx(static_cast<size_t>(nd), 0);
    int64_t rem = lin / inner;
    for (int64_t d = nd - 2; d >= 0; --d) {
      idx[d] = rem % p.sizes[d];
      rem /= p.sizes[d];
    }
    int64_t pos = lin % inner;
    while (lin < end) {
      std::array<char*, N> ptr;
      for (size_t k = 0; k < N; ++k) {
        int64_t off = pos * p.strides[k].back();
        for (int64_t d = 0; d < nd - 1; ++d) off += idx[d] * p.strides[k][d];
        ptr[k] = base[k] + off * static_cast<int64_t>(elem_size[k]);
      }
      const int64_t n = std::min(inner - pos, end - lin);
      body(ptr, n, inner_stride_bytes);
      lin += n;
      pos += n;
      if (pos == inner) {
        pos = 0;
        for (int64_t d = nd - 2; d >= 0; --d) {
          if (++idx[d] < p.sizes[d]) break;
          idx[d] = 0;
        }
      }
    }
  }
}

template <typename To, typename From>
inline To convert(From v) {
  if constexpr (std::is_same_v<To, From>) {
    return v;
  } else if constexpr (is_float16_v<To>) {
    return To(static_cast<float>(v));
  } else if constexpr (is_float16_v<From>) {
    return convert<To>(static_cast<float>(v));
  } else if constexpr (std::is_same_v<To, bool>) {
    return v != From{};
  } else {
    return static_cast<To>(v);
  }
}

}  // namespace minidl::cpu
