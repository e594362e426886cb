// The bf16 GEMM (bf16_gemm.h). Both paths read the same packed operands: A as one dword per pair of
// K (even element low, odd high), B as the same pairs for 16 columns side by side, K and N padded
// with zeros, bf16 subnormals already zero. The AVX-512 path is compiled with a target attribute
// and chosen at run time, so a build made here still runs on a CPU without AVX-512 BF16.
#include "kernels/cpu/bf16_gemm.h"

#include <omp.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define MINIDL_BF16_DOT 1
#endif

#include "core/error.h"

namespace minidl::cpu {
namespace {

constexpr int64_t kLanes = 16;  // f32 accumulators in one 512-bit register

// A bf16 operand's bits with subnormals made signed zeros, as the instruction reads them.
uint32_t daz(uint16_t b) { return (b & 0x7f80u) == 0 ? (b & 0x8000u) : b; }

float bits_to_float(uint32_t b16) {
  const uint32_t x = b16 << 16;
  float f;
  std::memcpy(&f, &x, 4);
  return f;
}

// The instruction's f32 result rule: a subnormal becomes the zero of its sign.
float ftz(float x) { return std::fabs(x) < FLT_MIN ? std::copysign(0.0f, x) : x; }

// One product's operands, packed: a is [M][Kh] pair dwords, b is [Kh][Np] pair dwords.
struct Packed {
  int64_t M = 0, N = 0, Kh = 0, Np = 0;
  std::vector<uint32_t> a, b;
};

void pack(const BFloat16* pa, int64_t sam, int64_t sak, const BFloat16* pb, int64_t sbk, int64_t sbn, int64_t M,
          int64_t K, int64_t N, Packed& p) {
  p.M = M;
  p.N = N;
  p.Kh = (K + 1) / 2;
  p.Np = (N + kLanes - 1) / kLanes * kLanes;
  p.a.assign(static_cast<size_t>(M * p.Kh), 0u);
  p.b.assign(static_cast<size_t>(p.Kh * p.Np), 0u);
  for (int64_t m = 0; m < M; ++m) {
    for (int64_t k = 0; k < K; ++k) {
      p.a[static_cast<size_t>(m * p.Kh + k / 2)] |= daz(pa[m * sam + k * sak].bits) << (16 * (k % 2));
    }
  }
  for (int64_t k = 0; k < K; ++k) {
    for (int64_t n = 0; n < N; ++n) {
      p.b[static_cast<size_t>((k / 2) * p.Np + n)] |= daz(pb[k * sbk + n * sbn].bits) << (16 * (k % 2));
    }
  }
}

// Row m of the product into acc[0, Np): per pair, the odd (high) product then the even one, each a
// fused multiply-add rounded to f32 and flushed, in the order vdpbf16ps adds them.
void row_scalar(const Packed& p, int64_t m, float* acc) {
  std::fill(acc, acc + p.Np, 0.0f);
  const uint32_t* ar = p.a.data() + m * p.Kh;
  for (int64_t kh = 0; kh < p.Kh; ++kh) {
    const float a_hi = bits_to_float(ar[kh] >> 16), a_lo = bits_to_float(ar[kh] & 0xffffu);
    const uint32_t* br = p.b.data() + kh * p.Np;
    for (int64_t n = 0; n < p.Np; ++n) {
      const float s = ftz(std::fma(a_hi, bits_to_float(br[n] >> 16), acc[n]));
      acc[n] = ftz(std::fma(a_lo, bits_to_float(br[n] & 0xffffu), s));
    }
  }
}

#ifdef MINIDL_BF16_DOT
// The same row with vdpbf16ps, four registers of 16 columns at a time.
__attribute__((target("avx512f,avx512bf16"))) void row_avx512(const Packed& p, int64_t m, float* acc) {
  const uint32_t* ar = p.a.data() + m * p.Kh;
  for (int64_t j0 = 0; j0 < p.Np; j0 += 4 * kLanes) {
    const int64_t regs = std::min<int64_t>(4, (p.Np - j0) / kLanes);
    __m512 c[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t kh = 0; kh < p.Kh; ++kh) {
      const __m512i av = _mm512_set1_epi32(static_cast<int>(ar[kh]));
      const uint32_t* br = p.b.data() + kh * p.Np + j0;
      for (int64_t r = 0; r < regs; ++r) {
        const __m512i bv = _mm512_loadu_si512(br + r * kLanes);
        c[r] = _mm512_dpbf16_ps(c[r], (__m512bh)av, (__m512bh)bv);
      }
    }
    for (int64_t r = 0; r < regs; ++r) _mm512_storeu_ps(acc + j0 + r * kLanes, c[r]);
  }
}
#endif

}  // namespace

bool bf16_dot_instructions() {
#ifdef MINIDL_BF16_DOT
  static const bool has = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
  return has;
#else
  return false;
#endif
}

void bf16_matmul(const Tensor& a, const Tensor& b, const Tensor& out, Bf16GemmPath path) {
  MINIDL_CHECK(a.dtype() == DType::bf16 && b.dtype() == DType::bf16 && out.dtype() == DType::bf16,
               "matmul (cpu, bf16 GEMM): needs bf16 a, b and out, got ", a.meta(), ", ", b.meta(), " and ", out.meta(),
               "; convert them with .to(DType::bf16)");
  if (path == Bf16GemmPath::Auto) path = bf16_dot_instructions() ? Bf16GemmPath::Avx512Bf16 : Bf16GemmPath::Scalar;
  MINIDL_CHECK(path != Bf16GemmPath::Avx512Bf16 || bf16_dot_instructions(),
               "matmul (cpu, bf16 GEMM): the AVX-512 BF16 path was asked for, but this CPU or build has no "
               "avx512_bf16; use Bf16GemmPath::Scalar (the same bits)");
  const int64_t B = out.shape()[0], M = out.shape()[1], N = out.shape()[2], K = a.shape()[2];
  const BFloat16* pa = a.data<BFloat16>();
  const BFloat16* pb = b.data<BFloat16>();
  BFloat16* po = out.data<BFloat16>();
  const auto& sa = a.strides();
  const auto& sb = b.strides();
  const auto& so = out.strides();
  for (int64_t i = 0; i < B; ++i) {
    Packed p;
    pack(pa + i * sa[0], sa[1], sa[2], pb + i * sb[0], sb[1], sb[2], M, K, N, p);
#pragma omp parallel if (M * p.Np * std::max<int64_t>(p.Kh, 1) > 65536)
    {
      std::vector<float> acc(static_cast<size_t>(p.Np));
#pragma omp for schedule(static)
      for (int64_t m = 0; m < M; ++m) {
#ifdef MINIDL_BF16_DOT
        if (path == Bf16GemmPath::Avx512Bf16) row_avx512(p, m, acc.data());
        else row_scalar(p, m, acc.data());
#else
        row_scalar(p, m, acc.data());
#endif
        BFloat16* orow = po + i * so[0] + m * so[1];
        for (int64_t n = 0; n < N; ++n) {
          const float v = acc[static_cast<size_t>(n)];
          orow[n * so[2]].bits = std::isnan(v) ? uint16_t{0x7fc0} : BFloat16::from_float(v);
        }
      }
    }
  }
}

}  // namespace minidl::cpu
