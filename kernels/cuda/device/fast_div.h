// Division of 32-bit unsigned values by a divisor fixed when a kernel is launched: a multiply-high,
// an add and a shift instead of a division, which a GPU has no instruction for (a 64-bit integer
// division costs dozens of instructions). The first H100 run found the pooling kernels bound by
// their index arithmetic: the max-pool backward of ResNet-50 at batch 256 took 3.1 ms, 3.8x what
// its memory traffic needs (lab/results/bench/gpu_check_2026-11-26_4fbeebd.md), with about seven 64-bit
// divisions per element. The magic number is Granlund and Montgomery's ("Division by invariant
// integers using multiplication", PLDI 1994): with s = ceil(log2 d) and
// m = floor(2^32 (2^s - d) / d) + 1, n / d = (mulhi(n, m) + n) >> s for every n < 2^31.
// A plain header (host and device), so a CPU test checks it against '/' on both sides of every
// power of two.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define MINIDL_FD_HD __host__ __device__ __forceinline__
#else
#define MINIDL_FD_HD inline
#endif

namespace minidl::cuda {

class FastDiv {
 public:
  // The values divided must stay below kLimit.
  static constexpr int64_t kLimit = int64_t{1} << 31;

  FastDiv() = default;
  // 1 <= d < 2^31.
  explicit FastDiv(int64_t d) : d_(static_cast<uint32_t>(d)) {
    while ((uint64_t{1} << s_) < d_) ++s_;
    m_ = static_cast<uint32_t>(((uint64_t{1} << 32) * ((uint64_t{1} << s_) - d_)) / d_ + 1);
  }
  MINIDL_FD_HD uint32_t divisor() const { return d_; }
  MINIDL_FD_HD uint32_t div(uint32_t n) const {
    const uint32_t hi = static_cast<uint32_t>((static_cast<uint64_t>(n) * m_) >> 32);
    return (hi + n) >> s_;
  }

 private:
  uint32_t d_ = 1, m_ = 1, s_ = 0;
};

}  // namespace minidl::cuda
