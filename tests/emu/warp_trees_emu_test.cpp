// The emulated device's shuffle-down trees (MINIDL_EMU_WARP_TREES, cuda_emu/device_api.h): warp_sum
// and batch norm's per-channel sums run their trees as one warp collective in the test build. Each
// lane must leave with the bits the shuffles one by one leave it, at every depth, for one value or
// several, on data whose sum depends on the order of its additions; lanes that ask for different
// depths are a fault.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/cuda/device/common.cuh"
#include "kernels/cuda/device/launch.cuh"
#include "tests/emu/emu_test_util.h"

namespace minidl::cuda {
namespace {

constexpr unsigned kFull = 0xffffffffu;
constexpr int kThreads = 64;   // two warps: each runs its own tree

// Each thread's L values after the tree down to `last`: by the shuffles one by one (a), as one
// collective (b).
template <int L>
__global__ void trees_kernel(const double* x, double* a_out, double* b_out, int last) {
  double a[L], b[L];
  for (int j = 0; j < L; ++j) a[j] = b[j] = x[threadIdx.x * L + j];
  for (int o = 16; o >= last; o >>= 1) {
    for (int j = 0; j < L; ++j) a[j] += __shfl_down_sync(kFull, a[j], o);
  }
  emu::warp_shfl_down_sums(b, last);
  for (int j = 0; j < L; ++j) {
    a_out[threadIdx.x * L + j] = a[j];
    b_out[threadIdx.x * L + j] = b[j];
  }
}

// warp_sum (common.cuh) in f32 against its shuffles one by one.
__global__ void warp_sum_kernel(const float* x, float* a_out, float* b_out) {
  float a = x[threadIdx.x];
  for (int o = 16; o > 0; o >>= 1) a += __shfl_down_sync(kFull, a, o);
  a_out[threadIdx.x] = a;
  b_out[threadIdx.x] = warp_sum(x[threadIdx.x]);
}

__global__ void uneven_depths_kernel(double* out) {
  double v[1] = {1.0};
  emu::warp_shfl_down_sums(v, threadIdx.x < 16 ? 1 : 2);   // planted: the warp's lanes disagree
  out[threadIdx.x] = v[0];
}

// Values of magnitudes 10^-decades to 10^decades and both signs: their sum depends on the order of
// the additions.
template <typename T>
std::vector<T> spread_values(size_t n, unsigned seed, int decades) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> mantissa(-1.0, 1.0);
  std::uniform_int_distribution<int> exponent(-decades, decades);
  std::vector<T> v(n);
  for (T& x : v) x = static_cast<T>(mantissa(rng) * std::pow(10.0, exponent(rng)));
  return v;
}

template <typename T>
Buf<T> on_device(const std::vector<T>& h) {
  Buf<T> d(h.size());
  EXPECT_EQ(cudaMemcpy(d.get(), h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return d;
}

template <int L>
void expect_trees_equal_the_shuffles(int last) {
  const std::vector<double> x = spread_values<double>(kThreads * L, 11u + L + 100u * last, 8);
  const Buf<double> dx = on_device(x);
  Buf<double> a(kThreads * L), b(kThreads * L);
  MINIDL_LAUNCH("test", trees_kernel<L>, 1, kThreads, 0, nullptr, dx.get(), a.get(), b.get(), last);
  const std::vector<double> ha = a.host(), hb = b.host();
  for (size_t i = 0; i < ha.size(); ++i)
    ASSERT_EQ(std::memcmp(&ha[i], &hb[i], sizeof(double)), 0)
        << "L " << L << " last " << last << " thread " << i / L << " value " << i % L << ": " << ha[i] << " vs "
        << hb[i];
}

TEST(EmuWarpTrees, EachLaneLeavesWithTheBitsOfTheShufflesOneByOne) {
  for (int last : {1, 2, 4, 8, 16, 32}) {
    expect_trees_equal_the_shuffles<1>(last);
    expect_trees_equal_the_shuffles<4>(last);
    expect_trees_equal_the_shuffles<8>(last);
  }
}

TEST(EmuWarpTrees, WarpSumIsTheShuffleTreeBitForBit) {
  std::vector<float> x = spread_values<float>(kThreads, 5u, 2);
  // Warp 0: 1 and 31 values of 2^-25, which a sum from left to right loses one by one (each is a
  // quarter of 1's last place) and a tree adds up first: the order decides the result.
  for (int l = 0; l < 32; ++l) x[static_cast<size_t>(l)] = l == 0 ? 1.0f : std::ldexp(1.0f, -25);
  const Buf<float> dx = on_device(x);
  Buf<float> a(kThreads), b(kThreads);
  MINIDL_LAUNCH("test", warp_sum_kernel, 1, kThreads, 0, nullptr, dx.get(), a.get(), b.get());
  const std::vector<float> ha = a.host(), hb = b.host();
  for (int w = 0; w < kThreads / 32; ++w) EXPECT_EQ(ha[static_cast<size_t>(32 * w)], hb[static_cast<size_t>(32 * w)]);
  float serial = 0;
  for (int l = 0; l < 32; ++l) serial += x[static_cast<size_t>(l)];
  EXPECT_EQ(serial, 1.0f);
  EXPECT_GT(hb[0], 1.0f) << "the tree's order, not a sum from left to right";
}

TEST(EmuWarpTrees, LanesAskingForDifferentDepthsAreAFault) {
  Buf<double> out(32);
  const std::string e = error_of([&] { MINIDL_LAUNCH("test", uneven_depths_kernel, 1, 32, 0, nullptr, out.get()); });
  EXPECT_NE(e.find("uneven_depths_kernel"), std::string::npos) << e;
  EXPECT_NE(e.find("shuffle-down trees to different depths (1 and 2)"), std::string::npos) << e;
}

}  // namespace
}  // namespace minidl::cuda
