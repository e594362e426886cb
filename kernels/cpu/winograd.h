// Winograd F(2x2, 3x3) for the CPU convolution's 3x3 stride-1 layers. Under im2col the
// GEMM already runs at 75-90% of the FMA peak inside ResNet's convolutions, so no GEMM tuning could
// win more than a few percent there, while 3x3 stride-1 convolutions are most of a ResNet's
// arithmetic (about 80% of ResNet-18's, 45% of ResNet-50's). Winograd's minimal filtering computes
// a 2x2 output tile from a 4x4 input tile with 16 multiplications instead of 36: each tile's input
// is transformed (V = B^T d B), multiplied element-wise with the transformed filter (U = G g G^T)
// summed over input channels, which is 16 GEMMs [O x C] x [C x tiles], and transformed back
// (Y = A^T M A). The input gradient of such a layer is itself one (the flipped, transposed
// convolution, its weight read flipped in place), and the weight gradient is the same products'
// gradient: G^T (sum over tiles of (A gy A^T) x V) G, so all three passes take it.
//
// Numerics: F(2x2, 3x3)'s transforms use only 0, +-1 and 1/2, so its f32 error stays within a few
// times the direct sum's (tests/kernels/winograd_test.cpp bounds it against f64). Larger tiles
// (F(4x4, 3x3), 4x fewer products) lose digits to their 1/4 and 1/6 factors. Every output of a
// tile is computed from all 16 inputs of its window, so an infinite input can make the tile's
// other outputs NaN where the direct sum left them finite (non-finite values stay non-finite; a
// gradient scaler skips the step either way). f32 in AVX-512 builds (the transforms and sgemm are
// written for it), f16 too (the CPU widens it to f32 first); f64 and builds without AVX-512 keep
// im2col. MINIDL_CPU_WINOGRAD=0 in the environment, or set_winograd_enabled(false), turns it off:
// every convolution is then the direct sum.
#pragma once
#include <cstdint>

#include "kernels/cpu/conv_im2col.h"

namespace minidl::cpu::conv_detail {

bool winograd_enabled();
void set_winograd_enabled(bool on);

// f32 convolutions of this geometry take Winograd: 3x3, stride 1, dilation 1, at least
// kWinogradMinChannels input and output channels (fewer make GEMMs too thin to pay for the
// transforms: the small CNN's 3-channel first layer stays on im2col), and enough work for the
// transforms to pay: output planes of at least kWinogradMinPlane pixels a side, kWinogradMinTiles
// 2x2 tiles in the batch, and planes under kWinogradWidePlane only with C x O of at least
// kWinogradMinWeights. The transforms use a vector lane per tile of a tile row, so an 8x8 plane
// (4 tiles a row) fills 4 of 16 lanes and a 4x4 plane 2, and the transformed weight (16 x O x C)
// costs as much as GEMMs over few tiles. Measured on the development machine (2 threads, caches
// flushed between calls, as a training step finds them; speed of the three passes against im2col,
// runs varying by 10-15%): ResNet-50 at 128 px, batch 16: 1.3-1.6x at 32x32 (64 channels) and
// 16x16 (128), 1.1-1.3x at 8x8 (256), 0.9-1.0x at 4x4 (512); ResNet-18 at 64 px, batch 32:
// 1.2-1.3x at 16x16 (64), 0.8-1.0x at 8x8 (128), 0.75x at 4x4 and 0.6x at 2x2.
constexpr int64_t kWinogradMinChannels = 16;
constexpr int64_t kWinogradMinPlane = 8;
constexpr int64_t kWinogradWidePlane = 16;
constexpr int64_t kWinogradMinWeights = 256 * 256;
constexpr int64_t kWinogradMinTiles = 128;
bool winograd_ok(const ConvGeom& g);

// How the batch's output tiles are cut into blocks: a block is a run of whole tile rows (n, ty),
// its tiles the columns of the block's 16 GEMMs. Blocks are sized so that their transformed
// input (V: 16 x C x tiles) and products (M: 16 x O x tiles) stay near L2, and spread over
// threads; with too few tiles for that (deep stages' small planes), blocks run in order and the
// threads split each block's channels and GEMMs (inner).
struct WinogradPlan {
  int64_t th = 0, tw = 0;        // output tiles per column and per row: ceil(oH / 2), ceil(oW / 2)
  int64_t tile_rows = 0;         // n * th
  int64_t rows_per_block = 1;    // tile rows per block
  int64_t blocks = 0;
  int64_t block_tiles = 0;       // rows_per_block * tw: the leading dimension of V's and M's rows
  int threads = 1;               // threads over blocks
  bool inner = false;            // threads inside each block instead
  int64_t weight_elems = 0;      // U: 16 x O x C
  int64_t per_thread = 0;        // V then M of one block
};
WinogradPlan winograd_plan(const ConvGeom& g);

// y = conv(x, w) + bias (bias may be null) through F(2x2, 3x3), w being [O, C, 3, 3]; with
// `flipped`, w is [C, O, 3, 3] and each filter is turned by 180 degrees (the input gradient of a
// convolution with that weight: g is then transposed_geom() of the layer's). u holds
// plan.weight_elems floats, scratch plan.per_thread x plan.threads.
void winograd_forward(const float* x, const float* w, bool flipped, const float* bias, const ConvGeom& g,
                      const WinogradPlan& pl, float* u, float* scratch, float* y);

// gw = the weight gradient of conv(x, w) for output gradient gy, through the same transforms: each
// tile's input transform V and output-gradient transform W = A gy A^T, 16 GEMMs
// dU += W x V^T over the tiles, and gw = G^T dU G. scratch holds
// (plan.per_thread + plan.weight_elems) x plan.threads floats: each thread's V, W and dU.
void winograd_backward_weight(const float* gy, const float* x, const ConvGeom& g, const WinogradPlan& pl,
                               float* scratch, float* gw);

}  // namespace minidl::cpu::conv_detail
