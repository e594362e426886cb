// AVX-512 helpers shared by the CPU kernels (sgemm.cpp, pool.cpp, conv_im2col.h): lane masks from
// counts, and the even lanes of 32 consecutive floats (a stride-2 read, which the compilers do not
// vectorise from the plain loop). Only in builds with AVX-512; the kernels keep scalar loops.
#pragma once
#if defined(__AVX512F__)
#include <immintrin.h>

#include <cstdint>

namespace minidl::cpu::avx512 {

// The first `count` of 16 lanes: none for count <= 0, all for count >= 16.
inline __mmask16 lanes(int64_t count) {
  return count >= 16 ? __mmask16(0xFFFF) : count <= 0 ? __mmask16(0) : __mmask16((1u << count) - 1);
}

// Lanes [lo, hi) of 16.
inline __mmask16 lanes(int64_t lo, int64_t hi) { return static_cast<__mmask16>(lanes(hi) & ~lanes(lo)); }

// (a0, a2, ..., a14, b0, b2, ..., b14): every other value of the 32 in a then b.
inline __m512 even_lanes(__m512 a, __m512 b) {
  const __m512i even = _mm512_set_epi32(30, 28, 26, 24, 22, 20, 18, 16, 14, 12, 10, 8, 6, 4, 2, 0);
  return _mm512_permutex2var_ps(a, even, b);
}

}  // namespace minidl::cpu::avx512
#endif
