// AVX-512 helpers shared by the CPU kernels (sgemm.cpp, pool.cpp, conv_im2col.h, winograd.cpp): lane
// masks from counts, and the even or odd lanes of 32 consecutive floats (a stride-2 read, which the
// compilers do not vectorise from the plain loop). Only in builds with AVX-512; the kernels keep scalar loops.
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

// (a1, a3, ..., a15, b1, b3, ..., b15): the odd values of the 32 in a then b.
inline __m512 odd_lanes(__m512 a, __m512 b) {
  const __m512i odd = _mm512_set_epi32(31, 29, 27, 25, 23, 21, 19, 17, 15, 13, 11, 9, 7, 5, 3, 1);
  return _mm512_permutex2var_ps(a, odd, b);
}

}  // namespace minidl::cpu::avx512
#endif
