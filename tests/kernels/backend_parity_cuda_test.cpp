// CPU-vs-CUDA parity in the style of ggml's test-backend-ops: every op family, forward and (through
// autograd) backward, on fresh random inputs at several shapes (odd sizes, non-contiguous views),
// compared by normalised error ||cuda - cpu|| / ||cpu|| with a tolerance per dtype. Skips with
// one line when no GPU is usable, so CI compiles it and a GPU machine runs it.
// The harness (fixture, check_op, tolerances) is tests/support/parity_helpers.h; the fused losses
// have their own suite, loss_parity_cuda_test.cpp; the reductions and pooling,
// reduce_pool_parity_cuda_test.cpp.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <sstream>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/generator.h"
#include "core/ops.h"
#include "tests/support/error_of.h"
#include "tests/support/parity_helpers.h"
#ifdef MINIDL_WITH_CUDA
#include "kernels/cuda/runtime.h"
#endif

namespace minidl {
namespace {

using namespace testing::parity;   // NOLINT: the shared harness (tests/support/parity_helpers.h)

// ---- Elementwise ----

TEST_F(Parity, UnaryOpsForwardBackward) {
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> ops{
      {"neg", [](const Tensor& x) { return neg(x); }},
      {"exp", [](const Tensor& x) { return exp(x); }},
      {"log", [](const Tensor& x) { return log(abs(x) + 0.1); }},
      {"log1p", [](const Tensor& x) { return log1p(abs(x)); }},
      {"sqrt", [](const Tensor& x) { return sqrt(abs(x) + 0.1); }},
      {"abs", [](const Tensor& x) { return abs(x); }},
      {"relu", [](const Tensor& x) { return relu(x); }},
      {"sigmoid", [](const Tensor& x) { return sigmoid(x); }},
      {"tanh", [](const Tensor& x) { return tanh(x); }},
      {"square", [](const Tensor& x) { return square(x); }},
      {"pow", [](const Tensor& x) { return pow(abs(x) + 0.5, 2.5); }},
  };
  for (const auto& [name, op] : ops) {
    for (DType dt : {DType::f32, DType::f64}) {
      for (const Shape& s : {Shape{1}, Shape{7}, Shape{33, 17}, Shape{3, 5, 129}, Shape{4099}}) {
        for (bool nc : {false, true}) {
          check_op(name, [&](const std::vector<Tensor>& v) { return op(v[0]); }, {s}, dt, nc, true);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

TEST_F(Parity, BinaryOpsWithBroadcastingForwardBackward) {
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&, const Tensor&)>>> ops{
      {"add", [](const Tensor& a, const Tensor& b) { return add(a, b); }},
      {"sub", [](const Tensor& a, const Tensor& b) { return sub(a, b); }},
      {"mul", [](const Tensor& a, const Tensor& b) { return mul(a, b); }},
      {"div", [](const Tensor& a, const Tensor& b) { return div(a, abs(b) + 0.5); }},
      {"maximum", [](const Tensor& a, const Tensor& b) { return maximum(a, b); }},
      {"minimum", [](const Tensor& a, const Tensor& b) { return minimum(a, b); }},
  };
  const std::vector<std::pair<Shape, Shape>> shapes{
      {{1}, {1}}, {{37}, {37}}, {{17, 33}, {33}}, {{17, 33}, {17, 1}}, {{5, 1, 7}, {1, 6, 7}}, {{4100}, {1}},
      {{2, 3, 4, 5}, {2, 3, 4, 5}},
      // the innermost dim contiguous or broadcast, whole vectors of it (binary_inner_vec_kernel)
      {{6, 8}, {8}}, {{6, 8}, {6, 1}}, {{2, 3, 12}, {3, 1}}};
  for (const auto& [name, op] : ops) {
    for (DType dt : {DType::f32, DType::f64}) {
      for (const auto& [sa, sb] : shapes) {
        for (bool nc : {false, true}) {
          check_op(name, [&](const std::vector<Tensor>& v) { return op(v[0], v[1]); }, {sa, sb}, dt, nc, true);
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// f16 kernels (mixed precision: casts, ReLU, residual adds, reductions) against the f32 CPU result.
TEST_F(Parity, HalfElementwiseAgainstF32) {
  if (self_test()) GTEST_SKIP() << "the CPU has no f16 arithmetic to compare with";
  for (const Shape& s : {Shape{7}, Shape{33, 65}, Shape{4, 8, 9, 11}}) {
    const Tensor a = rnd(s, DType::f32, 31), b = rnd(s, DType::f32, 32);
    const Tensor ah = a.to(DType::f16).to(kGpu), bh = b.to(DType::f16).to(kGpu);
    // The reference sees the same f16-rounded inputs.
    const Tensor ar = a.to(DType::f16).to(DType::f32), br = b.to(DType::f16).to(DType::f32);
    EXPECT_TRUE(close(relu(ar + br), relu(ah + bh).to(DType::f32), 1e-3, "f16 relu(a + b)"));
    EXPECT_TRUE(close(ar * br - br, (ah * bh - bh).to(DType::f32), 1e-3, "f16 a * b - b"));
    EXPECT_TRUE(close(sigmoid(ar), sigmoid(ah).to(DType::f32), 1e-3, "f16 sigmoid"));
    EXPECT_TRUE(close(ar.transpose(0, -1), ah.transpose(0, -1).contiguous().to(DType::f32), 0, "f16 strided copy"));
    // f16 reductions (bias gradients under autocast): sums in double, one f16 rounding at the end.
    EXPECT_TRUE(close(sum(ar, {0}), sum(ah, {0}).to(DType::f32), 1e-3, "f16 sum over dim 0"));
    EXPECT_TRUE(close(max(ar), max(ah).to(DType::f32), 0, "f16 max"));
    EXPECT_TRUE(close(argmin(ar, 0).to(DType::f32), argmin(ah, 0).to(DType::f32), 0, "f16 argmin"));
  }
}

TEST_F(Parity, ComparisonsAndIntegerArithmetic) {
  for (DType dt : {DType::f32, DType::f64, DType::i32, DType::i64}) {
    Tensor a = rnd({6, 9}, DType::f32, 5).mul_(3.0).to(dt);
    Tensor b = rnd({9}, DType::f32, 6).mul_(3.0).to(dt);
    const Tensor ag = a.to(kGpu), bg = b.to(kGpu);
    EXPECT_TRUE(close(eq(a, a).to(DType::f32), eq(ag, ag).to(DType::f32), 0, "eq"));
    EXPECT_TRUE(close(lt(a, b).to(DType::f32), lt(ag, bg).to(DType::f32), 0, std::string("lt ") + dtype_name(dt)));
    EXPECT_TRUE(close(ge(a, b).to(DType::f32), ge(ag, bg).to(DType::f32), 0, "ge"));
    EXPECT_TRUE(close(ne(a, b).to(DType::f32), ne(ag, bg).to(DType::f32), 0, "ne"));
    EXPECT_TRUE(close(le(a, b).to(DType::f32), le(ag, bg).to(DType::f32), 0, "le"));
    EXPECT_TRUE(close(gt(a, b).to(DType::f32), gt(ag, bg).to(DType::f32), 0, "gt"));
    EXPECT_TRUE(close(a + b, ag + bg, 0, std::string("add ") + dtype_name(dt)));
    EXPECT_TRUE(close(a * b, ag * bg, dt == DType::f32 ? 1e-7 : 0, std::string("mul ") + dtype_name(dt)));
  }
}

TEST_F(Parity, CopiesAndCastsBetweenEveryDtype) {
  const std::vector<DType> all{DType::f32, DType::f64, DType::f16, DType::i32, DType::i64, DType::u8, DType::boolean};
  Tensor base = rnd({13, 21}, DType::f64, 9).mul_(50.0);
  for (DType from : all) {
    Tensor src = (from == DType::u8) ? abs(base).to(from) : base.to(from);
    const Tensor sg = src.to(kGpu);
    // close() wants its second tensor on the device; the round trip ends on the host: compare values.
    ASSERT_EQ(src.to_vector(), sg.to(Device::cpu()).to_vector())
        << "host->device->host round trip of " << dtype_name(from);
    for (DType to : all) {
      // Negative floating values have no defined u8 conversion in C++: cast their magnitudes.
      const bool mag = to == DType::u8 && is_floating(from);
      const Tensor s = mag ? abs(src.to(DType::f64)).to(from) : src;
      const Tensor g = mag ? to_target(s) : sg;
      // Cast on the GPU vs cast on the CPU: identical (f16 rounding included).
      ASSERT_TRUE(close(s.to(to).to(DType::f64), g.to(to).to(DType::f64), 0,
                        std::string("cast ") + dtype_name(from) + " -> " + dtype_name(to)));
      // Strided (transposed) source.
      ASSERT_TRUE(close(s.t().to(to).to(DType::f64), g.t().to(to).to(DType::f64), 0,
                        std::string("strided cast ") + dtype_name(from) + " -> " + dtype_name(to)));
    }
  }
}

TEST_F(Parity, StridedCopiesFillsAndLargeTransfers) {
  // Bigger than two pinned staging chunks (2 x 8 MiB) to exercise the chunked, double-buffered path.
  Tensor big = rnd({5, 1000, 1001}, DType::f32, 11);
  Tensor bg = big.to(kGpu);
  ASSERT_TRUE(close(big, bg, 0, "20 MB host->device->host"));
  // Copy into a strided GPU destination, and from a strided GPU source into a strided host one.
  Tensor dst = zeros({1001, 1000}, {DType::f32, kGpu});
  {
    NoGradGuard ng;
    dst.t().copy_(big.select(0, 2));
  }
  ASSERT_TRUE(close(big.select(0, 2).t().contiguous(), dst, 0, "host -> strided device copy"));
  Tensor host = zeros({1000, 1001});
  host.t().copy_(bg.select(0, 3).t());
  ASSERT_TRUE(close(big.select(0, 3), host.to(kGpu), 0, "strided device -> strided host copy"));
  Tensor f = empty({7, 9}, {DType::f32, kGpu});
  f.slice(1, 0, 9, 2).fill_(3.5);
  EXPECT_EQ(f.slice(1, 0, 9, 2).to_vector(), std::vector<double>(7 * 5, 3.5));
}

// ---- Linear algebra ----

TEST_F(Parity, MatmulLayoutsAndBatches) {
  const std::vector<std::pair<Shape, Shape>> shapes{{{1, 1}, {1, 1}},      {{7, 13}, {13, 5}},
                                                    {{65, 129}, {129, 33}}, {{3, 17, 31}, {3, 31, 9}},
                                                    {{4, 8, 16}, {16, 8}},  {{31}, {31, 6}}};
  for (DType dt : {DType::f32, DType::f64}) {
    for (const auto& [sa, sb] : shapes) {
      for (bool nc : {false, true}) {
        check_op("matmul", [](const std::vector<Tensor>& v) { return matmul(v[0], v[1]); }, {sa, sb}, dt, nc, true,
                 dt == DType::f32 ? 1e-5 : 1e-12);
        if (HasFatalFailure()) return;
      }
    }
  }
  check_op("linear", [](const std::vector<Tensor>& v) { return linear(v[0], v[1], v[2]); },
           {{8, 20}, {12, 20}, {12}}, DType::f32, false, true, 1e-5);
}

#ifdef MINIDL_WITH_CUDA
TEST_F(Parity, MatmulTf32AndHalf) {
  if (self_test()) GTEST_SKIP() << "needs the GPU";
  const Tensor a = rnd({64, 256}, DType::f32, 21), b = rnd({256, 96}, DType::f32, 22);
  const Tensor ref = matmul(a, b);
  cuda::set_allow_tf32_matmul(true);
  const Tensor t = matmul(a.to(kGpu), b.to(kGpu));
  cuda::set_allow_tf32_matmul(false);
  EXPECT_TRUE(close(ref, t, 5e-3, "matmul TF32"));
  const Tensor h = matmul(a.to(DType::f16).to(kGpu), b.to(DType::f16).to(kGpu));
  EXPECT_EQ(h.dtype(), DType::f16);
  EXPECT_TRUE(close(ref, h.to(DType::f32), 5e-3, "matmul f16 in / f32 accumulate"));
}
#endif

// ---- Random ----

TEST_F(Parity, RandomDrawsMatchTheCpuStream) {
  for (DType dt : {DType::f32, DType::f64}) {
    for (int64_t n : {1, 3, 4, 5, 1001, 100003}) {
      Generator gc(42), gg(42);
      gc.set_offset(7);
      gg.set_offset(7);
      EXPECT_TRUE(close(rand({n}, {dt}, &gc), rand({n}, {dt, kGpu}, &gg), 0, "rand n=" + std::to_string(n)));
      EXPECT_TRUE(close(uniform({n}, -3, 5, {dt}, &gc), uniform({n}, -3, 5, {dt, kGpu}, &gg), 0, "uniform"));
      EXPECT_TRUE(close(normal({n}, 1, 2, {dt}, &gc), normal({n}, 1, 2, {dt, kGpu}, &gg),
                        dt == DType::f64 ? 1e-14 : 1e-7, "normal n=" + std::to_string(n)));
      EXPECT_EQ(gc.offset(), gg.offset());
    }
  }
  // Dropout masks are Bernoulli draws of the same stream: identical outputs and gradients.
  Generator gc(3), gg(3);
  const Tensor x = rnd({33, 65}, DType::f32, 2);
  EXPECT_TRUE(close(dropout(x, 0.3, true, &gc), dropout(x.to(kGpu), 0.3, true, &gg), 0, "dropout"));
}

// ---- Convolution ----

struct ConvCase {
  Shape x, w;
  Conv2dOptions o;
  bool bias;
};

std::vector<ConvCase> conv_cases() {
  std::vector<ConvCase> cs;
  cs.push_back({{2, 3, 9, 11}, {4, 3, 3, 3}, {}, true});
  Conv2dOptions s2;
  s2.stride = {2, 2};
  s2.padding = {1, 1};
  cs.push_back({{3, 5, 17, 15}, {7, 5, 3, 3}, s2, true});
  Conv2dOptions asym;
  asym.stride = {1, 2};
  asym.padding = {2, 0};
  asym.dilation = {2, 1};
  cs.push_back({{1, 4, 12, 13}, {6, 4, 3, 2}, asym, false});
  cs.push_back({{4, 16, 7, 7}, {32, 16, 1, 1}, {}, false});   // ResNet bottleneck 1x1
  Conv2dOptions stem;
  stem.stride = {2, 2};
  stem.padding = {3, 3};
  cs.push_back({{2, 3, 32, 32}, {8, 3, 7, 7}, stem, false});   // ResNet stem shape, small
  return cs;
}

// cuDNN may pick Winograd or FFT algorithms even in FMA math: their f32 error is larger than a
// direct sum's (still 1e-6..1e-5), and any real bug gives O(1).
constexpr double kConvF32Tol = 1e-4;

void run_conv_cases(DType dt, double tol) {
  for (const ConvCase& c : conv_cases()) {
    std::vector<Shape> shapes{c.x, c.w};
    if (c.bias) shapes.push_back({c.w[0]});
    const Conv2dOptions o = c.o;
    const bool bias = c.bias;
    check_op("conv2d", [o, bias](const std::vector<Tensor>& v) { return conv2d(v[0], v[1], bias ? v[2] : Tensor(), o); },
             shapes, dt, false, true, tol);
    if (::testing::Test::HasFatalFailure()) return;
  }
}

TEST_F(Parity, Conv2dHeuristicAlgorithms) {
  run_conv_cases(DType::f32, kConvF32Tol);
  run_conv_cases(DType::f64, 1e-12);
}

#ifdef MINIDL_WITH_CUDA
TEST_F(Parity, Conv2dAutotuneNhwcAndTf32) {
  if (self_test()) GTEST_SKIP() << "needs the GPU";
  cuda::clear_conv_algo_cache();
  cuda::set_cudnn_benchmark(true);
  run_conv_cases(DType::f32, kConvF32Tol);
  EXPECT_GT(cuda::conv_algo_cache_size(), 0u) << "benchmark mode caches one algorithm per shape and direction";
  const size_t cached = cuda::conv_algo_cache_size();
  run_conv_cases(DType::f32, kConvF32Tol);
  EXPECT_EQ(cuda::conv_algo_cache_size(), cached) << "the second pass must hit the cache";
  cuda::set_cudnn_benchmark(false);
  cuda::set_conv_nhwc(true);
  run_conv_cases(DType::f32, kConvF32Tol);
  cuda::set_conv_nhwc(false);
  cuda::set_allow_tf32_cudnn(true);
  run_conv_cases(DType::f32, 5e-3);
  cuda::set_allow_tf32_cudnn(false);
  // f16 convolution (tensor cores) against the f32 CPU result.
  const ConvCase c = conv_cases()[1];
  const Tensor x = rnd(c.x, DType::f32, 1), w = rnd(c.w, DType::f32, 2);
  const Tensor ref = conv2d(x, w, Tensor(), c.o);
  const Tensor h = conv2d(x.to(DType::f16).to(kGpu), w.to(DType::f16).to(kGpu), Tensor(), c.o);
  EXPECT_TRUE(close(ref, h.to(DType::f32), 5e-3, "conv2d f16"));
}
#endif

// ---- Normalisation, softmax and losses ----

TEST_F(Parity, BatchNormTrainEvalAndRunningStats) {
  for (DType dt : {DType::f32, DType::f64}) {
    for (const Shape& s : {Shape{8, 3}, Shape{4, 5, 7, 9}, Shape{2, 16, 33}}) {
      const int64_t C = s[1];
      Tensor rm_c = rnd({C}, dt, 70), rv_c = abs(rnd({C}, dt, 71)) + 0.5;
      Tensor rm_g = to_target(rm_c), rv_g = to_target(rv_c);
      for (bool training : {true, false}) {
        const Tensor rmc = rm_c, rvc = rv_c, rmg = rm_g, rvg = rv_g;
        // The op sees the running stats of its own backend (inputs v: x, weight, bias).
        int calls = 0;
        check_op(training ? "batch_norm (train)" : "batch_norm (eval)",
                 [&](const std::vector<Tensor>& v) {
                   const bool gpu = calls++ == 1;
                   return batch_norm(v[0] * 3.0 + 5.0, v[1], v[2],
                                     gpu ? rmg : rmc, gpu ? rvg : rvc, training, 0.1, 1e-5);
                 },
                 {s, {C}, {C}}, dt, false, true, dt == DType::f64 ? 1e-10 : 1e-5);
        if (HasFatalFailure()) return;
        EXPECT_TRUE(close(rm_c, rm_g, 1e-6, "running_mean after update"));
        EXPECT_TRUE(close(rv_c, rv_g, 1e-6, "running_var after update"));
      }
    }
  }
}

TEST_F(Parity, SoftmaxLogSoftmaxOverAnyDim) {
  for (DType dt : {DType::f32, DType::f64}) {
    for (const auto& [s, d] : std::vector<std::pair<Shape, int64_t>>{
             {{1, 1}, 1}, {{7, 10}, 1}, {{5, 1000}, -1}, {{3, 7, 5}, 1}, {{2, 3, 4, 5}, 0}, {{64, 2}, 1}}) {
      check_op("softmax", [d = d](const std::vector<Tensor>& v) { return softmax(v[0] * 4.0, d); }, {s}, dt, false, true);
      check_op("log_softmax", [d = d](const std::vector<Tensor>& v) { return log_softmax(v[0] * 4.0, d); }, {s}, dt,
               false, true);
      if (HasFatalFailure()) return;
    }
  }
}

// ---- Allocator on the device ----

#ifdef MINIDL_WITH_CUDA
TEST_F(Parity, AllocatorStatsBudgetAndNoDriftAfterOoms) {
  if (self_test()) GTEST_SKIP() << "needs the GPU";
  cuda::synchronize();
  empty_cache(kGpu);
  const MemoryStats s0 = memory_stats(kGpu);
  {
    Tensor a = empty({1 << 20}, {DType::f32, kGpu});   // 4 MiB
    const MemoryStats s1 = memory_stats(kGpu);
    EXPECT_EQ(s1.allocated_bytes - s0.allocated_bytes, 4 << 20);
    // Reserved need not grow: the block may come from a partly used segment (the 20 MiB segment
    // holding cuBLAS's 8 MiB workspace has 12 MiB free once any matmul ran in this process).
    EXPECT_GE(s1.reserved_bytes, s0.reserved_bytes);
    EXPECT_GE(s1.reserved_bytes - s1.allocated_bytes, 0);
  }
  EXPECT_EQ(memory_stats(kGpu).allocated_bytes, s0.allocated_bytes);
  // Steady state: a repeated step allocates no new segments.
  auto step = [] {
    Tensor x = rnd({64, 3, 32, 32}, DType::f32, 1).to(kGpu);
    Tensor w = rnd({16, 3, 3, 3}, DType::f32, 2).to(kGpu);
    w.set_requires_grad(true);
    Tensor y = sum(relu(conv2d(x, w)));
    y.backward();
  };
  step();
  const int64_t raw = cuda::caching_stats().raw_allocs;
  for (int i = 0; i < 5; ++i) step();
  EXPECT_EQ(cuda::caching_stats().raw_allocs, raw) << "steady-state steps must be served from the cache";
  // Budget: 100 OOMs in a row leave allocated/reserved where they were. The cache is emptied
  // first so that releasing it cannot make room for the second request.
  empty_cache(kGpu);
  const MemoryStats before = memory_stats(kGpu);
  set_memory_budget(kGpu, static_cast<size_t>(before.reserved_bytes) + (64 << 20));
  for (int i = 0; i < 100; ++i) {
    bool oom = false;
    try {
      Tensor a = empty({8 << 20}, {DType::f32, kGpu});    // 32 MiB: fits
      Tensor b = empty({16 << 20}, {DType::f32, kGpu});   // 64 MiB more: does not
    } catch (const OutOfMemoryError& e) {
      oom = true;
      EXPECT_GT(e.budget(), 0u);
    }
    ASSERT_TRUE(oom) << "iteration " << i;
    const MemoryStats now = memory_stats(kGpu);
    ASSERT_EQ(now.allocated_bytes, before.allocated_bytes) << "iteration " << i;
    ASSERT_LE(now.reserved_bytes, now.budget_bytes) << "iteration " << i;
  }
  EXPECT_EQ(memory_stats(kGpu).num_ooms - before.num_ooms, 100);
  set_memory_budget(kGpu, 0);
  empty_cache(kGpu);
  const CachingStats c = cuda::caching_stats();
  EXPECT_EQ(c.fragmentation_bytes, c.base.reserved_bytes - c.base.allocated_bytes);
  EXPECT_LE(c.base.reserved_bytes, before.reserved_bytes);
}

TEST_F(Parity, AutotuneWorkspaceStaysInsideTheBudget) {
  if (self_test()) GTEST_SKIP() << "needs the GPU";
  cuda::clear_conv_algo_cache();
  cuda::set_cudnn_benchmark(true);
  const Tensor x = rnd({32, 64, 28, 28}, DType::f32, 1).to(kGpu), w = rnd({64, 64, 3, 3}, DType::f32, 2).to(kGpu);
  Conv2dOptions o;
  o.padding = {1, 1};
  reset_peak_stats(kGpu);
  const MemoryStats s = memory_stats(kGpu);
  set_memory_budget(kGpu, static_cast<size_t>(s.reserved_bytes) + (16 << 20));
  const Tensor y = conv2d(x, w, Tensor(), o);
  const MemoryStats after = memory_stats(kGpu);
  set_memory_budget(kGpu, 0);
  cuda::set_cudnn_benchmark(false);
  EXPECT_LE(after.peak_reserved_bytes, after.budget_bytes) << "autotuning must draw its workspace within the budget";
  EXPECT_TRUE(close(conv2d(x.to(Device::cpu()), w.to(Device::cpu()), Tensor(), o), y, 1e-4, "autotuned conv under budget"));
}
#endif

TEST(ParityNoDevice, CudaRequestsFailClearlyWithoutAGpu) {
  if (cuda_available() || self_test()) GTEST_SKIP() << "a CUDA device is present (or self-test mode)";
  const std::string msg = testing::error_of([] { zeros({2}, {DType::f32, Device::cuda(0)}); });
  EXPECT_NE(msg.find("CUDA"), std::string::npos) << msg;
  EXPECT_NE(msg.find("cpu"), std::string::npos) << msg;
}

}  // namespace
}  // namespace minidl
