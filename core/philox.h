// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), shared by
// the CPU and CUDA kernels so both produce the same numbers for the same (seed, offset, index).
#pragma once
#include <cmath>
#include <cstdint>

#if defined(__CUDACC__)
#define MINIDL_HD __host__ __device__ __forceinline__
#else
#define MINIDL_HD inline
#endif

namespace minidl::philox {

struct U4 { uint32_t x, y, z, w; };

MINIDL_HD uint32_t mulhilo(uint32_t a, uint32_t b, uint32_t* hi) {
  const uint64_t p = static_cast<uint64_t>(a) * b;
  *hi = static_cast<uint32_t>(p >> 32);
  return static_cast<uint32_t>(p);
}

// Four 32-bit words for counter `ctr` under key `seed`.
MINIDL_HD U4 draw(uint64_t seed, uint64_t ctr) {
  U4 c{static_cast<uint32_t>(ctr), static_cast<uint32_t>(ctr >> 32), 0u, 0u};
  uint32_t k0 = static_cast<uint32_t>(seed), k1 = static_cast<uint32_t>(seed >> 32);
  for (int r = 0; r < 10; ++r) {
    uint32_t hi0, hi1;
    const uint32_t lo0 = mulhilo(0xD2511F53u, c.x, &hi0);
    const uint32_t lo1 = mulhilo(0xCD9E8D57u, c.z, &hi1);
    c = U4{hi1 ^ c.y ^ k0, lo1, hi0 ^ c.w ^ k1, lo0};
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  return c;
}

MINIDL_HD uint32_t word(const U4& u, int i) { return i == 0 ? u.x : i == 1 ? u.y : i == 2 ? u.z : u.w; }

// Uniform in [0, 1) with 24 bits (the same values for f32 and f64 tensors).
MINIDL_HD double uniform01(uint32_t w) { return static_cast<double>(w >> 8) * (1.0 / 16777216.0); }

// Element i of a uniform stream: counter offset + i/4, word i%4.
MINIDL_HD double uniform_at(uint64_t seed, uint64_t offset, uint64_t i) {
  return uniform01(word(draw(seed, offset + i / 4), static_cast<int>(i % 4)));
}

// The four normals of one counter (elements 4c .. 4c+3 of a normal stream).
MINIDL_HD void normals4(const U4& u, double out[4]) {
  for (int pair = 0; pair < 2; ++pair) {
    const double u1 = (static_cast<double>(word(u, 2 * pair) >> 8) + 1.0) * (1.0 / 16777216.0);
    const double u2 = uniform01(word(u, 2 * pair + 1));
    const double r = std::sqrt(-2.0 * std::log(u1));
    const double theta = 6.283185307179586 * u2;
    out[2 * pair] = r * std::cos(theta);
    out[2 * pair + 1] = r * std::sin(theta);
  }
}

// Element i of a standard-normal stream (Box-Muller over word pairs; 4 normals per counter).
MINIDL_HD double normal_at(uint64_t seed, uint64_t offset, uint64_t i) {
  double v[4];
  normals4(draw(seed, offset + i / 4), v);
  return v[i % 4];
}

// Counters consumed by n elements of either stream.
MINIDL_HD uint64_t counters_for(uint64_t n) { return (n + 3) / 4; }

}  // namespace minidl::philox
