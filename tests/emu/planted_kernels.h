// Kernels with hand-worked counters that both builds of the emulated device run: the profiling
// one (counters_prof_test.cpp) and the tests' one, whose shared-memory counters need no
// instrumentation (shared_counters_emu_test.cpp).
#pragma once
#include "kernels/cuda/device/launch.cuh"

namespace minidl::cuda {

// A 32x32 tile written by rows and read by columns; `Pitch` 32 puts a column in one bank, 33 spreads it.
template <int Pitch>
__global__ void tile_transpose_kernel(const float* in, float* out) {
  MINIDL_SHARED_ARRAY(float, tile, 32 * Pitch);
  const unsigned tx = threadIdx.x, ty = threadIdx.y;
  tile[ty * Pitch + tx] = in[ty * 32 + tx];
  __syncthreads();
  out[ty * 32 + tx] = tile[tx * Pitch + ty];
}

}  // namespace minidl::cuda
