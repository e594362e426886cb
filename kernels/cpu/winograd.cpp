// Winograd F(2x2, 3x3) (winograd.h says why): the plan, the three transforms and the 16 GEMMs.
// The transforms are vectorised across 16 tiles of a tile row: a tile's 4x4 input window starts
// at column 2 * tx - pad, so a window row's four columns for 16 tiles are the even and odd lanes
// of 32 consecutive values loaded at the window's start and 2 columns further, masked to the
// plane (the padding reads as zeros without a padded copy).
#include "kernels/cpu/winograd.h"

#include <omp.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>

#include "core/error.h"
#include "kernels/cpu/avx512.h"
#include "kernels/cpu/sgemm.h"

namespace minidl::cpu::conv_detail {

namespace {

std::atomic<int>& enabled_flag() {
  static std::atomic<int> flag{[] {
    const char* s = std::getenv("MINIDL_CPU_WINOGRAD");
    return (s && std::strcmp(s, "0") == 0) ? 0 : 1;
  }()};
  return flag;
}

// Bytes of a block's V and M together: about L2 (1 MiB a core on the development machine), so the
// GEMMs read V and write M in cache and the output transform reads M back from it.
constexpr int64_t kBlockBytes = 1 << 20;
// Tiles per block: a GEMM narrower than two of sgemm's 32-column panels wastes the packing of its
// [O x C] operand, wider than 512 gains nothing.
constexpr int64_t kMinBlockTiles = 64, kMaxBlockTiles = 512;
// Below this many multiply-adds (GEMMs of the whole batch) threads cost more than they save.
constexpr int64_t kParallelMacs = int64_t{1} << 21;

}  // namespace

bool winograd_enabled() { return enabled_flag().load(std::memory_order_relaxed) != 0; }
void set_winograd_enabled(bool on) { enabled_flag().store(on ? 1 : 0, std::memory_order_relaxed); }

bool winograd_ok(const ConvGeom& g) {
  return kSgemmAvailable && winograd_enabled() && g.kh == 3 && g.kw == 3 && g.sh == 1 && g.sw == 1 && g.dh == 1 &&
         g.dw == 1 && g.c >= kWinogradMinChannels && g.o >= kWinogradMinChannels && g.oh >= kWinogradMinPlane &&
         g.ow >= kWinogradMinPlane && g.n * ((g.oh + 1) / 2) * ((g.ow + 1) / 2) >= kWinogradMinTiles &&
         (std::min(g.oh, g.ow) >= kWinogradWidePlane || g.c * g.o >= kWinogradMinWeights);
}

WinogradPlan winograd_plan(const ConvGeom& g) {
  WinogradPlan pl;
  const int nt = std::max(1, omp_get_max_threads());
  pl.th = (g.oh + 1) / 2;
  pl.tw = (g.ow + 1) / 2;
  pl.tile_rows = g.n * pl.th;
  const int64_t target = std::clamp<int64_t>(kBlockBytes / (16 * (g.c + g.o) * 4), kMinBlockTiles, kMaxBlockTiles);
  int64_t rows = std::clamp<int64_t>(target / pl.tw, 1, std::max<int64_t>(1, pl.tile_rows));
  int64_t blocks = (pl.tile_rows + rows - 1) / rows;
  const bool big = 16 * g.o * g.c * pl.tile_rows * pl.tw >= kParallelMacs;
  if (nt > 1 && big) {
    // A multiple of the thread count, so that static scheduling balances the blocks, unless that
    // leaves blocks under kMinBlockTiles: then the threads share each block.
    const int64_t even = (blocks + nt - 1) / nt * nt;
    const int64_t even_rows = (pl.tile_rows + even - 1) / even;
    if (even_rows * pl.tw >= kMinBlockTiles) {
      rows = even_rows;
      blocks = (pl.tile_rows + rows - 1) / rows;
      pl.threads = blocks >= nt ? nt : 1;
    }
    pl.inner = pl.threads == 1;
  }
  pl.rows_per_block = rows;
  pl.blocks = blocks;
  pl.block_tiles = rows * pl.tw;
  pl.weight_elems = 16 * g.o * g.c;
  pl.per_thread = 16 * (g.c + g.o) * pl.block_tiles;
  return pl;
}

#if defined(__AVX512F__)

namespace {

using avx512::lanes;

// Block b's tile rows [r0, r1) and its GEMMs' columns.
struct BlockRows {
  int64_t r0, r1, cols;
};
BlockRows block_rows(const WinogradPlan& pl, int64_t b) {
  const int64_t r0 = b * pl.rows_per_block, r1 = std::min(pl.tile_rows, r0 + pl.rows_per_block);
  return {r0, r1, (r1 - r0) * pl.tw};
}

// Runs f(i) for i < count, over the threads when parallel.
template <typename F>
void for_range(bool parallel, int64_t count, F&& f) {
  if (parallel) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < count; ++i) f(i);
  } else {
    for (int64_t i = 0; i < count; ++i) f(i);
  }
}

// U[xi][o][c] = (G g G^T)[xi] for the 3x3 filter g of (o, c); G = [1 0 0; .5 .5 .5; .5 -.5 .5; 0 0 1].
// g is w[o][c], or with `flipped` (the input gradient's convolution) w[c][o] turned by 180 degrees.
// 16 input channels at a time, gathered tap by tap, so that each of the 16 results is one
// contiguous store (a scalar loop's stores land O x C floats apart, a page each).
void transform_weights(const float* w, const ConvGeom& g, bool flipped, bool parallel, float* u) {
  const int64_t oc = g.o * g.c;
  const __m512i taps =
      _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                         _mm512_set1_epi32(static_cast<int>(flipped ? g.o * 9 : 9)));
  const __m512 half = _mm512_set1_ps(0.5f);
  for_range(parallel, g.o, [&](int64_t o) {
    for (int64_t c0 = 0; c0 < g.c; c0 += 16) {
      const __mmask16 m = lanes(g.c - c0);
      const float* f = flipped ? w + (c0 * g.o + o) * 9 : w + (o * g.c + c0) * 9;
      __m512 k[9];
      for (int q = 0; q < 9; ++q) {
        const __m512i at = _mm512_add_epi32(taps, _mm512_set1_epi32(flipped ? 8 - q : q));
        k[q] = _mm512_mask_i32gather_ps(_mm512_setzero_ps(), m, at, f, 4);
      }
      __m512 t[4][3];  // G g
      for (int j = 0; j < 3; ++j) {
        const __m512 outer = _mm512_add_ps(k[j], k[6 + j]);
        t[0][j] = k[j];
        t[1][j] = _mm512_mul_ps(half, _mm512_add_ps(outer, k[3 + j]));
        t[2][j] = _mm512_mul_ps(half, _mm512_sub_ps(outer, k[3 + j]));
        t[3][j] = k[6 + j];
      }
      float* dst = u + o * g.c + c0;
      for (int i = 0; i < 4; ++i) {  // (G g) G^T
        const __m512 outer = _mm512_add_ps(t[i][0], t[i][2]);
        _mm512_mask_storeu_ps(dst + (4 * i + 0) * oc, m, t[i][0]);
        _mm512_mask_storeu_ps(dst + (4 * i + 1) * oc, m, _mm512_mul_ps(half, _mm512_add_ps(outer, t[i][1])));
        _mm512_mask_storeu_ps(dst + (4 * i + 2) * oc, m, _mm512_mul_ps(half, _mm512_sub_ps(outer, t[i][1])));
        _mm512_mask_storeu_ps(dst + (4 * i + 3) * oc, m, t[i][2]);
      }
    }
  });
}

// 16 values of a plane row starting at column s (may be negative), zero outside [0, w).
inline __m512 load_row(const float* row, int64_t s, int64_t w) {
  const __mmask16 m = lanes(std::max<int64_t>(0, -s), std::min<int64_t>(16, w - s));
  return _mm512_maskz_loadu_ps(m, row + s);
}

// The input transform of channel ch for tile rows [r0, r1): V[xi][ch][col] = (B^T d B)[xi] with
// B^T = [1 0 -1 0; 0 1 1 0; 0 -1 1 0; 0 1 0 -1], for the block's columns col. v_ch points at
// V[0][ch][0]; xi_stride is C x block_tiles.
void transform_input(const float* x, const ConvGeom& g, const WinogradPlan& pl, int64_t ch, int64_t r0, int64_t r1,
                     float* v_ch, int64_t xi_stride) {
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = r / pl.th, ty = r % pl.th;
    const float* plane = x + (n * g.c + ch) * g.h * g.w;
    float* dst = v_ch + (r - r0) * pl.tw;
    for (int64_t tx0 = 0; tx0 < pl.tw; tx0 += 16) {
      __m512 d[4][4];
      for (int i = 0; i < 4; ++i) {
        const int64_t yy = 2 * ty - g.ph + i;
        if (yy < 0 || yy >= g.h) {
          for (int j = 0; j < 4; ++j) d[i][j] = _mm512_setzero_ps();
          continue;
        }
        const float* row = plane + yy * g.w;
        const int64_t s = 2 * tx0 - g.pw;
        const __m512 a0 = load_row(row, s, g.w), a1 = load_row(row, s + 16, g.w);
        const __m512 b0 = load_row(row, s + 2, g.w), b1 = load_row(row, s + 18, g.w);
        d[i][0] = avx512::even_lanes(a0, a1);
        d[i][1] = avx512::odd_lanes(a0, a1);
        d[i][2] = avx512::even_lanes(b0, b1);
        d[i][3] = avx512::odd_lanes(b0, b1);
      }
      __m512 t[4][4];  // B^T d
      for (int j = 0; j < 4; ++j) {
        t[0][j] = _mm512_sub_ps(d[0][j], d[2][j]);
        t[1][j] = _mm512_add_ps(d[1][j], d[2][j]);
        t[2][j] = _mm512_sub_ps(d[2][j], d[1][j]);
        t[3][j] = _mm512_sub_ps(d[1][j], d[3][j]);
      }
      const __mmask16 m = lanes(pl.tw - tx0);
      for (int i = 0; i < 4; ++i) {  // (B^T d) B
        float* out = dst + tx0 + 4 * i * xi_stride;
        _mm512_mask_storeu_ps(out, m, _mm512_sub_ps(t[i][0], t[i][2]));
        _mm512_mask_storeu_ps(out + xi_stride, m, _mm512_add_ps(t[i][1], t[i][2]));
        _mm512_mask_storeu_ps(out + 2 * xi_stride, m, _mm512_sub_ps(t[i][2], t[i][1]));
        _mm512_mask_storeu_ps(out + 3 * xi_stride, m, _mm512_sub_ps(t[i][1], t[i][3]));
      }
    }
  }
}

// The output transform of channel o: Y = A^T M A (+ bias) with A^T = [1 1 1 0; 0 1 -1 -1], each
// tile's 2x2 outputs stored as two interleaved pairs of rows, masked to the plane. m_o points at
// M[0][o][0]; xi_stride is O x block_tiles.
void transform_output(const float* m_o, int64_t xi_stride, const ConvGeom& g, const WinogradPlan& pl, int64_t o,
                      int64_t r0, int64_t r1, float bias, float* y) {
  const __m512i lo_idx = _mm512_set_epi32(23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2, 17, 1, 16, 0);
  const __m512i hi_idx = _mm512_set_epi32(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25, 9, 24, 8);
  const __m512 b = _mm512_set1_ps(bias);
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = r / pl.th, ty = r % pl.th;
    float* plane = y + (n * g.o + o) * g.oh * g.ow;
    const float* src = m_o + (r - r0) * pl.tw;
    for (int64_t tx0 = 0; tx0 < pl.tw; tx0 += 16) {
      const __mmask16 m = lanes(pl.tw - tx0);
      __m512 s[4][2];  // M A
      for (int i = 0; i < 4; ++i) {
        const float* p = src + tx0 + 4 * i * xi_stride;
        const __m512 m0 = _mm512_maskz_loadu_ps(m, p), m1 = _mm512_maskz_loadu_ps(m, p + xi_stride);
        const __m512 m2 = _mm512_maskz_loadu_ps(m, p + 2 * xi_stride), m3 = _mm512_maskz_loadu_ps(m, p + 3 * xi_stride);
        s[i][0] = _mm512_add_ps(_mm512_add_ps(m0, m1), m2);
        s[i][1] = _mm512_sub_ps(_mm512_sub_ps(m1, m2), m3);
      }
      for (int a = 0; a < 2; ++a) {  // A^T (M A), row a of every tile
        const int64_t oy = 2 * ty + a;
        if (oy >= g.oh) break;
        __m512 out[2];
        for (int j = 0; j < 2; ++j) {
          out[j] = a == 0 ? _mm512_add_ps(_mm512_add_ps(s[0][j], s[1][j]), s[2][j])
                          : _mm512_sub_ps(_mm512_sub_ps(s[1][j], s[2][j]), s[3][j]);
          out[j] = _mm512_add_ps(out[j], b);
        }
        float* row = plane + oy * g.ow + 2 * tx0;
        const int64_t left = g.ow - 2 * tx0;
        _mm512_mask_storeu_ps(row, lanes(left), _mm512_permutex2var_ps(out[0], lo_idx, out[1]));
        _mm512_mask_storeu_ps(row + 16, lanes(left - 16), _mm512_permutex2var_ps(out[0], hi_idx, out[1]));
      }
    }
  }
}

// The output-gradient transform of channel o for tile rows [r0, r1): W[xi][o][col] = (A gy A^T)[xi],
// the gradient of the tile's products M (Y = A^T M A), from its 2x2 output gradient: rows and
// columns past the plane read as zeros. w_o points at W[0][o][0]; xi_stride is O x block_tiles.
void transform_output_grad(const float* gy, const ConvGeom& g, const WinogradPlan& pl, int64_t o, int64_t r0,
                           int64_t r1, float* w_o, int64_t xi_stride) {
  for (int64_t r = r0; r < r1; ++r) {
    const int64_t n = r / pl.th, ty = r % pl.th;
    const float* plane = gy + (n * g.o + o) * g.oh * g.ow;
    float* dst = w_o + (r - r0) * pl.tw;
    for (int64_t tx0 = 0; tx0 < pl.tw; tx0 += 16) {
      __m512 d[2][2];  // output row a, column b of every tile
      for (int a = 0; a < 2; ++a) {
        const int64_t oy = 2 * ty + a;
        if (oy >= g.oh) {
          d[a][0] = d[a][1] = _mm512_setzero_ps();
          continue;
        }
        const float* row = plane + oy * g.ow;
        const __m512 v0 = load_row(row, 2 * tx0, g.ow), v1 = load_row(row, 2 * tx0 + 16, g.ow);
        d[a][0] = avx512::even_lanes(v0, v1);
        d[a][1] = avx512::odd_lanes(v0, v1);
      }
      __m512 t[4][2];  // A gy, A = [1 0; 1 1; 1 -1; 0 -1]
      for (int b = 0; b < 2; ++b) {
        t[0][b] = d[0][b];
        t[1][b] = _mm512_add_ps(d[0][b], d[1][b]);
        t[2][b] = _mm512_sub_ps(d[0][b], d[1][b]);
        t[3][b] = _mm512_sub_ps(_mm512_setzero_ps(), d[1][b]);
      }
      const __mmask16 m = lanes(pl.tw - tx0);
      for (int i = 0; i < 4; ++i) {  // (A gy) A^T
        float* out = dst + tx0 + 4 * i * xi_stride;
        _mm512_mask_storeu_ps(out, m, t[i][0]);
        _mm512_mask_storeu_ps(out + xi_stride, m, _mm512_add_ps(t[i][0], t[i][1]));
        _mm512_mask_storeu_ps(out + 2 * xi_stride, m, _mm512_sub_ps(t[i][0], t[i][1]));
        _mm512_mask_storeu_ps(out + 3 * xi_stride, m, _mm512_sub_ps(_mm512_setzero_ps(), t[i][1]));
      }
    }
  }
}

// gw[o][c] = G^T dU[o][c] G, G^T = [1 .5 .5 0; 0 .5 -.5 0; 0 .5 .5 1]: the filter gradient from the
// gradient of its transform, 16 input channels at a time, scattered tap by tap into [O, C, 3, 3].
void inverse_transform_weights(const float* du, const ConvGeom& g, bool parallel, float* gw) {
  const int64_t oc = g.o * g.c;
  const __m512i taps = _mm512_mullo_epi32(_mm512_set_epi32(15, 14, 13, 12, 11, 10, 9, 8, 7, 6, 5, 4, 3, 2, 1, 0),
                                          _mm512_set1_epi32(9));
  const __m512 half = _mm512_set1_ps(0.5f);
  for_range(parallel, g.o, [&](int64_t o) {
    for (int64_t c0 = 0; c0 < g.c; c0 += 16) {
      const __mmask16 m = lanes(g.c - c0);
      const float* src = du + o * g.c + c0;
      __m512 r[3][4];  // G^T dU
      for (int j = 0; j < 4; ++j) {
        const __m512 d0 = _mm512_maskz_loadu_ps(m, src + j * oc), d1 = _mm512_maskz_loadu_ps(m, src + (4 + j) * oc);
        const __m512 d2 = _mm512_maskz_loadu_ps(m, src + (8 + j) * oc);
        const __m512 d3 = _mm512_maskz_loadu_ps(m, src + (12 + j) * oc);
        const __m512 sum = _mm512_mul_ps(half, _mm512_add_ps(d1, d2));
        r[0][j] = _mm512_add_ps(d0, sum);
        r[1][j] = _mm512_mul_ps(half, _mm512_sub_ps(d1, d2));
        r[2][j] = _mm512_add_ps(sum, d3);
      }
      float* f = gw + (o * g.c + c0) * 9;
      for (int a = 0; a < 3; ++a) {  // (G^T dU) G
        const __m512 sum = _mm512_mul_ps(half, _mm512_add_ps(r[a][1], r[a][2]));
        const __m512 tap[3] = {_mm512_add_ps(r[a][0], sum), _mm512_mul_ps(half, _mm512_sub_ps(r[a][1], r[a][2])),
                               _mm512_add_ps(sum, r[a][3])};
        for (int b = 0; b < 3; ++b) {
          _mm512_mask_i32scatter_ps(f, m, _mm512_add_epi32(taps, _mm512_set1_epi32(3 * a + b)), tap[b], 4);
        }
      }
    }
  });
}

}  // namespace

void winograd_forward(const float* x, const float* w, bool flipped, const float* bias, const ConvGeom& g,
                      const WinogradPlan& pl, float* u, float* scratch, float* y) {
  const bool par = pl.threads > 1 || pl.inner;
  transform_weights(w, g, flipped, par, u);
  const int64_t ld = pl.block_tiles, v_xi = g.c * ld, m_xi = g.o * ld, oc = g.o * g.c;
  const auto block = [&](int64_t b, float* buf, bool inner) {
    const auto [r0, r1, cols] = block_rows(pl, b);
    float* v = buf;
    float* m = buf + 16 * v_xi;
    for_range(inner, g.c, [&](int64_t ch) { transform_input(x, g, pl, ch, r0, r1, v + ch * ld, v_xi); });
    for_range(inner, 16, [&](int64_t xi) {
      sgemm(g.o, cols, g.c, u + xi * oc, g.c, 1, v + xi * v_xi, ld, 1, m + xi * m_xi, ld, false);
    });
    for_range(inner, g.o, [&](int64_t o) {
      transform_output(m + o * ld, m_xi, g, pl, o, r0, r1, bias ? bias[o] : 0.0f, y);
    });
  };
  if (pl.threads > 1) {
#pragma omp parallel for schedule(static) num_threads(pl.threads)
    for (int64_t b = 0; b < pl.blocks; ++b) block(b, scratch + omp_get_thread_num() * pl.per_thread, false);
  } else {
    for (int64_t b = 0; b < pl.blocks; ++b) block(b, scratch, pl.inner);
  }
}

void winograd_backward_weight(const float* gy, const float* x, const ConvGeom& g, const WinogradPlan& pl,
                               float* scratch, float* gw) {
  const int64_t ld = pl.block_tiles, v_xi = g.c * ld, w_xi = g.o * ld, oc = g.o * g.c;
  const int64_t stride = pl.per_thread + pl.weight_elems;  // a thread's V, W, then its dU
  const auto block = [&](int64_t b, float* buf, bool inner, bool first) {
    const auto [r0, r1, cols] = block_rows(pl, b);
    float* v = buf;
    float* wt = buf + 16 * v_xi;
    float* du = buf + pl.per_thread;
    for_range(inner, g.c, [&](int64_t ch) { transform_input(x, g, pl, ch, r0, r1, v + ch * ld, v_xi); });
    for_range(inner, g.o, [&](int64_t o) { transform_output_grad(gy, g, pl, o, r0, r1, wt + o * ld, w_xi); });
    for_range(inner, 16, [&](int64_t xi) {  // dU[xi] (+)= W[xi] x V[xi]^T
      sgemm(g.o, g.c, cols, wt + xi * w_xi, ld, 1, v + xi * v_xi, 1, ld, du + xi * oc, g.c, !first);
    });
  };
  const bool par = pl.threads > 1 || pl.inner;
  if (pl.threads > 1) {
    // Each thread sums its blocks into its own dU; the sums are added in thread order afterwards,
    // so the result does not depend on timing. The team can be smaller than planned (called from
    // inside another parallel region, where a nested one gets one thread): only its dUs are added.
    int team = 1;
#pragma omp parallel num_threads(pl.threads)
    {
#pragma omp single
      team = omp_get_num_threads();
      const int t = omp_get_thread_num();
      float* buf = scratch + t * stride;
      bool first = true;
#pragma omp for schedule(static)
      for (int64_t b = 0; b < pl.blocks; ++b) {
        block(b, buf, false, first);
        first = false;
      }
      if (first) std::fill(buf + pl.per_thread, buf + stride, 0.0f);  // a thread without blocks
    }
    float* du = scratch + pl.per_thread;
    for (int t = 1; t < team; ++t) {
      const float* part = scratch + t * stride + pl.per_thread;
#pragma omp parallel for schedule(static) num_threads(pl.threads)
      for (int64_t i = 0; i < pl.weight_elems; ++i) du[i] += part[i];
    }
  } else {
    for (int64_t b = 0; b < pl.blocks; ++b) block(b, scratch, pl.inner, b == 0);
  }
  inverse_transform_weights(scratch + pl.per_thread, g, par, gw);
}

#else

void winograd_backward_weight(const float*, const float*, const ConvGeom&, const WinogradPlan&, float*, float*) {
  MINIDL_FAIL("winograd_backward_weight: this build has no AVX-512 (winograd_ok is false); the caller should have "
              "used im2col");
}

void winograd_forward(const float*, const float*, bool, const float*, const ConvGeom&, const WinogradPlan&, float*,
                      float*, float*) {
  MINIDL_FAIL("winograd_forward: this build has no AVX-512 (winograd_ok is false); the caller should have used im2col");
}

#endif

}  // namespace minidl::cpu::conv_detail
