// The hand-written f16 CUDA kernels of mixed precision (kernels/cuda/amp.cu and the f16 paths of
// elementwise.cu): casts, ReLU, add / residual add and the one-launch gradient unscale, against
// the CPU backend (bit for bit where both round once to nearest even) and an f64 reference
// (relative error <= 1e-3), including values near 65504, overflow to inf and subnormals.
// MINIDL_PARITY_SELF_TEST=1 runs it CPU against CPU to check the harness without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <string>

#include "core/backend.h"
#include "core/generator.h"
#include "core/ops.h"
#include "tests/support/cuda_target.h"

namespace minidl {
namespace {

const Device kGpu = testing::parity_target();
using AmpF16 = testing::CudaTargetTest;

Tensor to_target(const Tensor& t) { return t.device() == kGpu ? t.clone() : t.to(kGpu); }

constexpr double kF16Rtol = 1e-3;            // the bound; one f16 rounding is 2^-11
constexpr double kF16MinSub = 5.960464477539063e-08;   // 2^-24, the smallest f16 subnormal
constexpr double kF16Max = 65504.0;

// What a correctly rounded f16 of the exact value `x` may be: within kF16Rtol relative, or within
// half a subnormal step absolute; inf when |x| rounds past 65504 (>= 65520).
::testing::AssertionResult f16_close(double got, double x, const std::string& what) {
  if (std::isnan(x)) {
    if (std::isnan(got)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << what << ": expected NaN, got " << got;
  }
  if (std::abs(x) >= 65520.0) {
    if (std::isinf(got) && (got > 0) == (x > 0)) return ::testing::AssertionSuccess();
    return ::testing::AssertionFailure() << what << ": exact " << x << " overflows f16, expected "
                                         << (x > 0 ? "+inf" : "-inf") << ", got " << got;
  }
  if (std::isinf(got)) return ::testing::AssertionFailure() << what << ": exact " << x << " is in range, got " << got;
  const double err = std::abs(got - x);
  if (err <= kF16Rtol * std::abs(x) || err <= 0.5 * kF16MinSub) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": exact " << x << ", got " << got << ", relative error "
                                       << err / std::abs(x) << " > " << kF16Rtol;
}

// Values that exercise the f16 range: random normals, the largest finite values and past them,
// subnormals and zeros of both signs. Odd length, so the vector kernels' scalar tails run too.
std::vector<double> edge_values(int64_t n, uint64_t seed) {
  Generator g(seed);
  std::vector<double> v = randn({n}, {.dtype = DType::f64}, &g).to_vector();
  const std::vector<double> edges{65504.0, -65504.0, 65519.0, 65520.0, -65520.0, 70000.0, 60000.0, 32768.5,
                                  kF16MinSub, -kF16MinSub, 3 * kF16MinSub, 1e-5, 6.1e-5, 6.103515625e-05,
                                  0.0, -0.0, 1.0, -1.0, 1e-8, 2.9e-8, 3.0e-8};
  for (size_t i = 0; i < edges.size() && i * 37 < v.size(); ++i) v[i * 37] = edges[i];
  for (size_t i = 0; i < v.size(); i += 11) v[i] *= 1e-6;   // a band of subnormal-sized values
  return v;
}

TEST_F(AmpF16, CastsMatchTheCpuBitForBitAndTheExactValue) {
  for (int64_t n : {int64_t{1}, int64_t{7}, int64_t{8}, int64_t{4099}, int64_t{100003}}) {
    const std::vector<double> v = edge_values(n, 10 + static_cast<uint64_t>(n));
    const Tensor c32 = from_vector(v, {n});
    const Tensor cpu16 = c32.to(DType::f16);
    for (bool aligned : {true, false}) {
      // An offset-by-one view is not 16-byte aligned: the scalar kernel must give the same bits.
      std::vector<double> shifted{0.0};
      shifted.insert(shifted.end(), v.begin(), v.end());
      const Tensor src = aligned ? to_target(c32) : to_target(from_vector(shifted, {n + 1})).slice(0, 1, n + 1);
      const Tensor g16 = src.to(DType::f16);
      ASSERT_EQ(g16.device(), kGpu);
      const std::vector<double> want = cpu16.to_vector(), got = g16.to(Device::cpu()).to_vector();
      for (int64_t i = 0; i < n; ++i) {
        const std::string what = "f32->f16 n=" + std::to_string(n) + (aligned ? "" : " (unaligned)") +
                                 " element " + std::to_string(i);
        ASSERT_TRUE(std::memcmp(&want[i], &got[i], sizeof(double)) == 0 || (std::isnan(want[i]) && std::isnan(got[i])))
            << what << ": cpu " << want[i] << ", cuda " << got[i];
        ASSERT_TRUE(f16_close(got[i], static_cast<double>(static_cast<float>(v[i])), what));
      }
      // f16 -> f32 is exact: back to the device's f16 values widened.
      const std::vector<double> back = g16.to(DType::f32).to(Device::cpu()).to_vector();
      ASSERT_EQ(back, got) << "f16->f32 n=" << n;
    }
  }
}

TEST_F(AmpF16, EveryF16BitPatternWidensExactly) {
  std::vector<double> all;
  for (uint32_t b = 0; b < 65536; ++b) {
    const float f = Half::to_float(static_cast<uint16_t>(b));
    if (!std::isnan(f)) all.push_back(f);
  }
  const auto n = static_cast<int64_t>(all.size());
  const Tensor g16 = to_target(from_vector(all, {n}, {.dtype = DType::f16}));
  EXPECT_EQ(g16.to(DType::f32).to(Device::cpu()).to_vector(), all);
}

// out computed on the device in f16 from f16 inputs; exact: the same in f64 from those inputs.
void check_f16_op(const std::string& name, const std::function<Tensor(const Tensor&, const Tensor&)>& op, int64_t n) {
  const Tensor a16 = from_vector(edge_values(n, 1), {n}).to(DType::f16);
  const Tensor b16 = from_vector(edge_values(n, 2), {n}).to(DType::f16);
  const Tensor got16 = op(to_target(a16), to_target(b16));
  ASSERT_EQ(got16.dtype(), DType::f16) << name;
  ASSERT_EQ(got16.device(), kGpu) << name;
  const std::vector<double> got = got16.to(Device::cpu()).to_vector();
  const std::vector<double> exact = op(a16.to(DType::f64), b16.to(DType::f64)).to_vector();
  const std::vector<double> cpu = op(a16, b16).to_vector();
  for (int64_t i = 0; i < n; ++i) {
    const std::string what = name + " n=" + std::to_string(n) + " element " + std::to_string(i);
    ASSERT_TRUE(f16_close(got[i], exact[i], what));
    // One rounding of the f32 result on both backends: the same f16.
    ASSERT_TRUE(got[i] == cpu[i] || (std::isnan(got[i]) && std::isnan(cpu[i])))
        << what << ": cpu " << cpu[i] << ", cuda " << got[i];
  }
}

TEST_F(AmpF16, ReluAddAndResidualAddWithinOneRounding) {
  for (int64_t n : {int64_t{5}, int64_t{4099}, int64_t{65541}}) {
    check_f16_op("relu", [](const Tensor& a, const Tensor&) { return relu(a); }, n);
    check_f16_op("add", [](const Tensor& a, const Tensor& b) { return add(a, b); }, n);
    // The residual block's tail: relu(x + shortcut), in place as nn does it.
    check_f16_op("residual add", [](const Tensor& a, const Tensor& b) {
      Tensor y = a.clone();
      y.add_(b);
      return relu(y);
    }, n);
  }
  // Near the top of the range: 60000 + 10000 overflows to inf, 32768 + 32735 stays 65503 -> 65504.
  check_f16_op("add near 65504", [](const Tensor& a, const Tensor& b) {
    return add(a * 0.0 + 60000.0, b * 0.0 + 10000.0);
  }, 9);
}

// The fused unscale: several f32 and f16 tensors (one past a 65536-element chunk, one strided)
// in one call; values as the CPU's single pass, the flag raised only when a value is not finite.
TEST_F(AmpF16, UnscaleGradsOneLaunchMatchesCpu) {
  const double inv_scale = 1.0 / 65536.0;
  for (bool poison : {false, true}) {
    std::vector<Tensor> cpu, gpu;
    std::vector<std::pair<Shape, DType>> specs{{{3, 5}, DType::f32}, {{70001}, DType::f32}, {{1}, DType::f16},
                                               {{130, 9}, DType::f16}, {{8, 6}, DType::f32}};
    for (size_t i = 0; i < specs.size(); ++i) {
      Generator g(40 + i);
      const Tensor base = (randn(specs[i].first, {}, &g) * 1000.0).to(specs[i].second);
      cpu.push_back(base.clone());
      gpu.push_back(to_target(base));
    }
    // The last one is a transposed view: the strided path writes back through the view.
    cpu.back() = cpu.back().transpose(0, 1);
    gpu.back() = gpu.back().transpose(0, 1);
    if (poison) {   // one inf deep inside the chunked tensor, one NaN in an f16 one
      cpu[1].slice(0, 66000, 66001).fill_(INFINITY);
      gpu[1].slice(0, 66000, 66001).fill_(INFINITY);
      cpu[3].slice(0, 129, 130).fill_(NAN);
      gpu[3].slice(0, 129, 130).fill_(NAN);
    }
    const Tensor fc = zeros({1}), fg = to_target(zeros({1}));
    backend(Device::cpu()).unscale_grads(cpu, inv_scale, fc);
    backend(kGpu).unscale_grads(gpu, inv_scale, fg);
    EXPECT_EQ(fg.to(Device::cpu()).item(), poison ? 1.0 : 0.0) << "found_inf (poison " << poison << ")";
    EXPECT_EQ(fc.item(), poison ? 1.0 : 0.0) << "cpu found_inf (poison " << poison << ")";
    for (size_t i = 0; i < cpu.size(); ++i) {
      const std::vector<double> want = cpu[i].to_vector(), got = gpu[i].to(Device::cpu()).to_vector();
      ASSERT_EQ(want.size(), got.size());
      for (size_t k = 0; k < want.size(); ++k) {
        ASSERT_TRUE(want[k] == got[k] || (std::isnan(want[k]) && std::isnan(got[k])))
            << "tensor " << i << " (" << cpu[i].meta() << ") element " << k << ": cpu " << want[k] << ", cuda "
            << got[k] << " (poison " << poison << ")";
      }
    }
    // A raised flag stays raised: a second clean call leaves it at 1.
    if (poison) {
      backend(kGpu).unscale_grads({gpu[0]}, 1.0, fg);
      EXPECT_EQ(fg.to(Device::cpu()).item(), 1.0) << "a clean call must not clear found_inf";
    }
  }
}

}  // namespace
}  // namespace minidl
