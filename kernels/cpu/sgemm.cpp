// minidl's AVX-512 SGEMM (sgemm.h says why it exists). The five loops of Goto's design:
//   jc: blocks of kNc columns of C; pc: blocks of kKc of the depth, B's block packed into
//   kKc x 32 panels (L3; one panel sits in L1 while it is used); ic: blocks of kMc rows, A's
//   block packed into 8 x kKc panels (L2); jr, ir: the 8 x 32 register tile over the panels.
// Packing reads A and B through arbitrary strides; the common layouts (row-major, or transposed
// as in the convolution's weight gradient dW = dY x col^T) are read with vector loads, transposed
// in registers 16 x 16 at a time where the layout needs it. Edges pad the panels with zeros and
// the tile stores through masks, so no shape takes a slow path.
#include "kernels/cpu/sgemm.h"

#include "kernels/cpu/avx512.h"

#include <algorithm>
#include <memory>
#include <new>

#include "core/error.h"

#if defined(__AVX512F__)
#include <immintrin.h>
// GCC 12 reports the shuffles' deliberately undefined pass-through operand (_mm512_undefined_ps
// in avx512fintrin.h) as used uninitialized once they are inlined here.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#endif

namespace minidl::cpu {

#if defined(__AVX512F__)
namespace {

// 8 x 32: 16 accumulators, 10 loads per 16 FMAs. On the Zen 5 development machine (two 512-bit
// FMA and two 512-bit load pipes) it ran the conv shapes at 77-91% of one core's FMA peak, as fast
// as 12 x 32 or 14 x 32 on large products and faster where M is 64 (a 14-row tile wastes 9%).
// kKc 512 beat 192-384 by 2-4%.
constexpr int kMr = 8, kNv = 2, kNr = 16 * kNv;
constexpr int64_t kKc = 512, kMc = kMr * 20, kNc = kNr * 64;

// Per-thread packing buffers, allocated on a thread's first product and kept (a few MiB).
struct PackBuffers {
  struct Free {
    void operator()(float* p) const { ::operator delete[](p, std::align_val_t(64)); }
  };
  std::unique_ptr<float[], Free> a{static_cast<float*>(::operator new[](sizeof(float) * kMc * kKc, std::align_val_t(64)))};
  std::unique_ptr<float[], Free> b{static_cast<float*>(::operator new[](sizeof(float) * kKc * kNc, std::align_val_t(64)))};
};

PackBuffers& buffers() {
  static thread_local PackBuffers bufs;
  return bufs;
}

using avx512::lanes;

// The first two steps of a transpose, within 128-bit lanes, on Groups groups of 4 rows: afterwards
// r[4i + q] holds, in its 128-bit lane L, rows 4i..4i+3 of column 4L + q.
template <int Groups>
inline void transpose_in_lanes(__m512* r) {
  __m512 t[4 * Groups];
  for (int i = 0; i < 2 * Groups; ++i) {
    t[2 * i] = _mm512_unpacklo_ps(r[2 * i], r[2 * i + 1]);
    t[2 * i + 1] = _mm512_unpackhi_ps(r[2 * i], r[2 * i + 1]);
  }
  for (int i = 0; i < Groups; ++i) {
    const __m512d t0 = _mm512_castps_pd(t[4 * i]), t1 = _mm512_castps_pd(t[4 * i + 1]);
    const __m512d t2 = _mm512_castps_pd(t[4 * i + 2]), t3 = _mm512_castps_pd(t[4 * i + 3]);
    r[4 * i] = _mm512_castpd_ps(_mm512_unpacklo_pd(t0, t2));
    r[4 * i + 1] = _mm512_castpd_ps(_mm512_unpackhi_pd(t0, t2));
    r[4 * i + 2] = _mm512_castpd_ps(_mm512_unpacklo_pd(t1, t3));
    r[4 * i + 3] = _mm512_castpd_ps(_mm512_unpackhi_pd(t1, t3));
  }
}

// r[c] = column c of the 16 x 16 tile whose rows are r[0..15] on entry.
inline void transpose16(__m512 r[16]) {
  transpose_in_lanes<4>(r);
  __m512 out[16];
  for (int q = 0; q < 4; ++q) {
    const __m512 u0 = _mm512_shuffle_f32x4(r[q], r[4 + q], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 u1 = _mm512_shuffle_f32x4(r[q], r[4 + q], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512 v0 = _mm512_shuffle_f32x4(r[8 + q], r[12 + q], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 v1 = _mm512_shuffle_f32x4(r[8 + q], r[12 + q], _MM_SHUFFLE(3, 2, 3, 2));
    out[q] = _mm512_shuffle_f32x4(u0, v0, _MM_SHUFFLE(2, 0, 2, 0));
    out[4 + q] = _mm512_shuffle_f32x4(u0, v0, _MM_SHUFFLE(3, 1, 3, 1));
    out[8 + q] = _mm512_shuffle_f32x4(u1, v1, _MM_SHUFFLE(2, 0, 2, 0));
    out[12 + q] = _mm512_shuffle_f32x4(u1, v1, _MM_SHUFFLE(3, 1, 3, 1));
  }
  for (int i = 0; i < 16; ++i) r[i] = out[i];
}

// Transposes a strided tile: row r < rows of the input, lane l < cols, is src[r * stride + l]
// (rows beyond `rows` read as zeros); its column l < cols is stored, 16 values, at
// dst + l * dst_stride.
inline void transpose_tile(const float* src, int64_t stride, int64_t rows, int64_t cols, float* dst, int64_t dst_stride) {
  __m512 r[16];
  const __mmask16 lm = lanes(cols);
  for (int i = 0; i < 16; ++i) r[i] = i < rows ? _mm512_maskz_loadu_ps(lm, src + i * stride) : _mm512_setzero_ps();
  transpose16(r);
  for (int l = 0; l < cols; ++l) _mm512_storeu_ps(dst + l * dst_stride, r[l]);
}

// The 8-row form of transpose_tile, for A's panels: row r < rows of the input, lane l < cols, is
// src[r * stride + l]; its column l is stored as 8 values at dst + l * 8. Half the shuffles of
// padding the rows to 16.
inline void transpose_tile8(const float* src, int64_t stride, int64_t rows, int64_t cols, float* dst) {
  static_assert(kMr == 8, "transpose_tile8 writes panels of 8 rows");
  __m512 r[8];
  const __mmask16 lm = lanes(cols);
  for (int i = 0; i < 8; ++i) r[i] = i < rows ? _mm512_maskz_loadu_ps(lm, src + i * stride) : _mm512_setzero_ps();
  transpose_in_lanes<2>(r);
  for (int q = 0; q < 4; ++q) {
    // [lane 0 of r[q], of r[4+q], lane 1 of r[q], of r[4+q]]: columns q and 4 + q, 8 rows each.
    const __m512 lo = _mm512_shuffle_f32x4(r[q], r[4 + q], _MM_SHUFFLE(1, 0, 1, 0));
    const __m512 hi = _mm512_shuffle_f32x4(r[q], r[4 + q], _MM_SHUFFLE(3, 2, 3, 2));
    const __m512 c01 = _mm512_shuffle_f32x4(lo, lo, _MM_SHUFFLE(3, 1, 2, 0));
    const __m512 c23 = _mm512_shuffle_f32x4(hi, hi, _MM_SHUFFLE(3, 1, 2, 0));
    const __m256 col[4] = {_mm512_castps512_ps256(c01), _mm512_extractf32x8_ps(c01, 1), _mm512_castps512_ps256(c23),
                           _mm512_extractf32x8_ps(c23, 1)};
    for (int h = 0; h < 4; ++h) {
      if (4 * h + q < cols) _mm256_storeu_ps(dst + (4 * h + q) * 8, col[h]);
    }
  }
}

// A's rows [i0, i0 + mr) and depth [p0, p0 + kc) into one panel: dst[p * kMr + ii], zero rows past mr.
void pack_a(const float* a, int64_t rs, int64_t cs, int64_t i0, int64_t mr, int64_t p0, int64_t kc, float* dst) {
  const __mmask16 mrow = lanes(kMr);
  if (cs == 1) {  // rows are contiguous: 16 x 16 transposes
    for (int64_t p = 0; p < kc; p += 16) {
      transpose_tile8(a + i0 * rs + p0 + p, rs, mr, std::min<int64_t>(16, kc - p), dst + p * kMr);
    }
  } else if (rs == 1) {  // columns are contiguous: one masked load per depth
    const __mmask16 mm = lanes(mr);
    for (int64_t p = 0; p < kc; ++p) {
      _mm512_mask_storeu_ps(dst + p * kMr, mrow, _mm512_maskz_loadu_ps(mm, a + i0 + (p0 + p) * cs));
    }
  } else {
    for (int64_t p = 0; p < kc; ++p) {
      for (int64_t ii = 0; ii < kMr; ++ii) dst[p * kMr + ii] = ii < mr ? a[(i0 + ii) * rs + (p0 + p) * cs] : 0.0f;
    }
  }
}

// B's columns [j0, j0 + nr) and depth [p0, p0 + kc) into one panel: dst[p * kNr + jj], zero past nr.
void pack_b(const float* b, int64_t rs, int64_t cs, int64_t j0, int64_t nr, int64_t p0, int64_t kc, float* dst) {
  if (cs == 1) {  // rows are contiguous
    __mmask16 m[kNv];
    for (int v = 0; v < kNv; ++v) m[v] = lanes(nr - 16 * v);
    for (int64_t p = 0; p < kc; ++p) {
      const float* src = b + (p0 + p) * rs + j0;
      for (int v = 0; v < kNv; ++v) _mm512_storeu_ps(dst + p * kNr + 16 * v, _mm512_maskz_loadu_ps(m[v], src + 16 * v));
    }
  } else if (rs == 1) {  // B is a transposed row-major matrix: 16 x 16 transposes
    for (int64_t h = 0; h < kNr; h += 16) {
      for (int64_t p = 0; p < kc; p += 16) {
        transpose_tile(b + (j0 + h) * cs + p0 + p, cs, std::max<int64_t>(0, nr - h), std::min<int64_t>(16, kc - p),
                       dst + p * kNr + h, kNr);
      }
    }
  } else {
    for (int64_t p = 0; p < kc; ++p) {
      for (int64_t jj = 0; jj < kNr; ++jj) dst[p * kNr + jj] = jj < nr ? b[(p0 + p) * rs + (j0 + jj) * cs] : 0.0f;
    }
  }
}

// All of B's block [jc, jc + nc) x [p0, p0 + kc) into its panels when B's rows are contiguous:
// each row of the block is read once, front to back, where packing panel by panel reads 128 bytes
// from each of kc rows, a row stride apart, for every panel. From a depth of 256 rows on it was
// faster (single core, B from memory: 64 x 1024 x 576 137 -> 178 GFLOP/s, 64 x 1024 x 256
// 172 -> 180), below it slower (64 x 1024 x 128: 201 -> 188).
constexpr int64_t kRowPackDepth = 256;
void pack_b_rows(const float* b, int64_t rs, int64_t jc, int64_t nc, int64_t p0, int64_t kc, float* dst) {
  const int64_t full = nc / kNr * kNr;
  for (int64_t p = 0; p < kc; ++p) {
    const float* src = b + (p0 + p) * rs + jc;
    float* d = dst + p * kNr;
    for (int64_t jr = 0; jr < full; jr += kNr) {
      const __m512 v0 = _mm512_loadu_ps(src + jr), v1 = _mm512_loadu_ps(src + jr + 16);
      _mm512_storeu_ps(d + jr * kc, v0);
      _mm512_storeu_ps(d + jr * kc + 16, v1);
    }
    if (full < nc) {  // the last panel, zero past nc
      const __mmask16 m0 = lanes(nc - full), m1 = lanes(nc - full - 16);
      _mm512_storeu_ps(d + full * kc, _mm512_maskz_loadu_ps(m0, src + full));
      _mm512_storeu_ps(d + full * kc + 16, _mm512_maskz_loadu_ps(m1, src + full + 16));
    }
  }
}

// The register tile: C[0..mr, 0..nr) (row stride ldc) = or += panel A x panel B over kc.
void micro_tile(int64_t kc, const float* ap, const float* bp, float* c, int64_t ldc, int64_t mr, int64_t nr,
                bool accumulate) {
  __m512 acc[kMr][kNv];
#pragma GCC unroll 16
  for (int i = 0; i < kMr; ++i) {
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) acc[i][v] = _mm512_setzero_ps();
  }
  for (int64_t p = 0; p < kc; ++p) {
    __m512 bv[kNv];
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) bv[v] = _mm512_loadu_ps(bp + 16 * v);
#pragma GCC unroll 16
    for (int i = 0; i < kMr; ++i) {
      const __m512 av = _mm512_set1_ps(ap[i]);
#pragma GCC unroll 4
      for (int v = 0; v < kNv; ++v) acc[i][v] = _mm512_fmadd_ps(av, bv[v], acc[i][v]);
    }
    ap += kMr;
    bp += kNr;
  }
  __mmask16 m[kNv];
#pragma GCC unroll 4
  for (int v = 0; v < kNv; ++v) m[v] = lanes(nr - 16 * v);
#pragma GCC unroll 16
  for (int i = 0; i < kMr; ++i) {
    if (i >= mr) break;
    float* row = c + i * ldc;
#pragma GCC unroll 4
    for (int v = 0; v < kNv; ++v) {
      __m512 r = acc[i][v];
      if (accumulate) r = _mm512_add_ps(r, _mm512_maskz_loadu_ps(m[v], row + 16 * v));
      _mm512_mask_storeu_ps(row + 16 * v, m[v], r);
    }
  }
}

}  // namespace

void sgemm(int64_t m, int64_t n, int64_t k, const float* a, int64_t a_rs, int64_t a_cs, const float* b, int64_t b_rs,
           int64_t b_cs, float* c, int64_t ldc, bool accumulate) {
  if (m <= 0 || n <= 0) return;
  if (k <= 0) {
    if (!accumulate) {
      for (int64_t i = 0; i < m; ++i) std::fill(c + i * ldc, c + i * ldc + n, 0.0f);
    }
    return;
  }
  PackBuffers& bufs = buffers();
  for (int64_t jc = 0; jc < n; jc += kNc) {
    const int64_t nc = std::min(kNc, n - jc);
    for (int64_t pc = 0; pc < k; pc += kKc) {
      const int64_t kc = std::min(kKc, k - pc);
      if (b_cs == 1 && kc >= kRowPackDepth) {
        pack_b_rows(b, b_rs, jc, nc, pc, kc, bufs.b.get());
      } else {
        for (int64_t jr = 0; jr < nc; jr += kNr) {
          pack_b(b, b_rs, b_cs, jc + jr, std::min<int64_t>(kNr, nc - jr), pc, kc, bufs.b.get() + jr * kc);
        }
      }
      const bool acc = accumulate || pc > 0;
      for (int64_t ic = 0; ic < m; ic += kMc) {
        const int64_t mc = std::min(kMc, m - ic);
        for (int64_t ir = 0; ir < mc; ir += kMr) {
          pack_a(a, a_rs, a_cs, ic + ir, std::min<int64_t>(kMr, mc - ir), pc, kc, bufs.a.get() + ir * kc);
        }
        for (int64_t jr = 0; jr < nc; jr += kNr) {
          for (int64_t ir = 0; ir < mc; ir += kMr) {
            micro_tile(kc, bufs.a.get() + ir * kc, bufs.b.get() + jr * kc, c + (ic + ir) * ldc + jc + jr, ldc,
                       std::min<int64_t>(kMr, mc - ir), std::min<int64_t>(kNr, nc - jr), acc);
          }
        }
      }
    }
  }
}

#else

void sgemm(int64_t, int64_t, int64_t, const float*, int64_t, int64_t, const float*, int64_t, int64_t, float*, int64_t,
           bool) {
  MINIDL_FAIL("sgemm: this build has no AVX-512 (kSgemmAvailable is false); the caller should have used Eigen");
}

#endif

}  // namespace minidl::cpu
