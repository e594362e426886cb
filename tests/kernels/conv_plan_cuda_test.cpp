// The CUDA convolutions' per-shape plans (kernels/cuda/conv.cu): cuDNN is asked which algorithms to
// run, and how much workspace each needs, once per shape, in both algorithm modes. The first GPU run
// (lab/results/bench/gpu_check_2026-11-26_bbe331e.md) found a ResNet-50 AMP step spending over a second
// of host time in those queries, asked again on every call. And the deterministic mode
// (set_cudnn_deterministic, as torch.backends.cudnn.deterministic) runs no algorithm that adds with
// atomics, so the same step gives the same bits. kernels_cuda_emu counts the emulated cuDNN's
// queries and reads the algorithms it ran from its call log; on a GPU the cache and the bits speak.
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops.h"
#include "tests/support/parity_helpers.h"

#ifdef MINIDL_WITH_CUDA
#include "kernels/cuda/conv_api.h"
#include "kernels/cuda/workspace.h"
#endif
#ifdef MINIDL_CUDA_EMU
#include <cudnn.h>

#include "cuda_emu/call_log.h"
#include "cuda_emu/emu_libs.h"
#endif

namespace minidl::testing::parity {
namespace {

#ifdef MINIDL_WITH_CUDA

struct Grads {
  std::vector<uint8_t> y, gx, gw;
};

std::vector<uint8_t> bytes(const Tensor& t) {
  const Tensor c = t.to(Device::cpu()).contiguous();
  const auto* p = static_cast<const uint8_t*>(c.data_ptr());
  return {p, p + c.nbytes()};
}

// One convolution forward and backward on the GPU: a 3x3 stride-1 layer and a strided 1x1.
Grads conv_step(DType dt, bool stride2) {
  const Shape xs = stride2 ? Shape{4, 16, 9, 9} : Shape{4, 8, 10, 10};
  const Shape ws = stride2 ? Shape{32, 16, 1, 1} : Shape{16, 8, 3, 3};
  const Conv2dOptions o{.stride = {stride2 ? 2 : 1, stride2 ? 2 : 1}, .padding = {stride2 ? 0 : 1, stride2 ? 0 : 1}};
  const Tensor x = rnd(xs, dt, 11).to(kGpu).set_requires_grad(true);
  const Tensor w = rnd(ws, dt, 12).to(kGpu).set_requires_grad(true);
  const Tensor y = conv2d(x, w, Tensor(), o);
  y.backward(rnd(y.shape(), dt, 13).to(kGpu));
  return {bytes(y.detach()), bytes(x.grad()), bytes(w.grad())};
}

class ConvPlan : public ::testing::Test {
 protected:
  void SetUp() override {
    if (self_test() || !cuda_available()) GTEST_SKIP() << "needs a CUDA device (or the emulated one)";
    cuda::clear_conv_algo_cache();
  }
  void TearDown() override {
    cuda::set_cudnn_benchmark(false);
    cuda::set_cudnn_deterministic(false);
    cuda::set_cudnn_api(cuda::CudnnApi::Graph);
  }
};

// The graph API is the path by default, and the legacy one (kept behind the switch to measure one
// against the other) computes the same convolutions.
TEST_F(ConvPlan, TheGraphApiIsTheDefaultAndTheLegacyApiAgrees) {
  if (std::getenv("MINIDL_CUDNN_API") == nullptr) {
    EXPECT_EQ(cuda::cudnn_api(), cuda::CudnnApi::Graph);
  }
  for (const DType dt : {DType::f32, DType::f16}) {
    cuda::set_cudnn_api(cuda::CudnnApi::Graph);
    const Grads graph = conv_step(dt, false);
    cuda::set_cudnn_api(cuda::CudnnApi::Legacy);
    const Grads legacy = conv_step(dt, false);
    EXPECT_EQ(graph.y, legacy.y) << dtype_name(dt);
    EXPECT_EQ(graph.gx, legacy.gx) << dtype_name(dt);
    EXPECT_EQ(graph.gw, legacy.gw) << dtype_name(dt);
  }
}

// A captured step runs by the plans its warm-up made: a shape first seen inside a capture is refused
// with the fix (building a plan asks cuDNN, which a capture forbids), and a planned one is captured
// and replays the same result.
TEST_F(ConvPlan, ACaptureRunsByPlansMadeBeforeIt) {
  const Tensor x = rnd({2, 8, 6, 6}, DType::f32, 31).to(kGpu), w = rnd({8, 8, 3, 3}, DType::f32, 32).to(kGpu);
  const Conv2dOptions o{.stride = {1, 1}, .padding = {1, 1}};
  const NoGradGuard no_grad;
  Tensor y;
  try {
    backend(kGpu).capture_graph(0, [&] { y = conv2d(x, w, Tensor(), o); });
    ADD_FAILURE() << "an unplanned shape was planned inside a capture";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("run the step once before capturing"), std::string::npos) << e.what();
  }
  const Tensor eager = conv2d(x, w, Tensor(), o);   // plans the shape
  const std::unique_ptr<Backend::Graph> graph = backend(kGpu).capture_graph(0, [&] { y = conv2d(x, w, Tensor(), o); });
  graph->replay();
  EXPECT_EQ(bytes(y), bytes(eager));
}

// Host time per convolution call once a shape is planned, graph API against legacy: what the graph
// API is for (an eager step was host-bound in the legacy calls). Printed and recorded as test
// properties for a GPU run to read (kernels_cuda); the emulated device computes each call on the
// CPU, so it only checks that both paths run. Asserts no time: machines differ.
TEST_F(ConvPlan, HostTimePerCallOfBothApis) {
#ifdef MINIDL_CUDA_EMU
  const Shape xs{2, 16, 8, 8}, ws{16, 16, 3, 3};   // small: the emulated call computes at once
  constexpr int kCalls = 5;
#else
  const Shape xs{64, 64, 56, 56}, ws{64, 64, 3, 3};   // a ResNet-50 stage-1 3x3 layer, AMP, channels-last
  constexpr int kCalls = 200;
#endif
  const Conv2dOptions o{.stride = {1, 1}, .padding = {1, 1}};
  const NoGradGuard no_grad;
  const Tensor x = to_channels_last(rnd(xs, DType::f16, 21).to(kGpu));
  const Tensor w = to_channels_last(rnd(ws, DType::f16, 22).to(kGpu));
  for (const cuda::CudnnApi api : {cuda::CudnnApi::Graph, cuda::CudnnApi::Legacy}) {
    cuda::set_cudnn_api(api);
    conv2d(x, w, Tensor(), o);   // plans the shape
    cuda::synchronize();
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < kCalls; ++i) conv2d(x, w, Tensor(), o);
    const double us = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count() / kCalls;
    cuda::synchronize();
    const std::string name = std::string("host_us_per_forward_") + cuda::cudnn_api_name(api);
    RecordProperty(name, std::to_string(us));
    std::cout << name << " " << us << "\n";
    EXPECT_GT(us, 0.0);
  }
}

#ifdef MINIDL_CUDA_EMU
// A shape's later calls are what the graph API promises to be cheap: a variant pack and an execute.
// The emulated library logs every backend call; the first step of a shape builds graphs,
// heuristics and plans, the second asks for nothing else, in both modes and both layouts.
TEST_F(ConvPlan, ASecondCallOfAShapeAsksTheLibraryNothingButAnExecute) {
  for (const bool benchmark : {false, true}) {
    cuda::set_cudnn_benchmark(benchmark);
    for (const DType dt : {DType::f32, DType::f16}) {
      const std::string tag = std::string(benchmark ? "benchmark " : "heuristic ") + dtype_name(dt);
      conv_step(dt, false);
      cuda::emu::clear_cudnn_backend_calls();
      conv_step(dt, false);
      const std::vector<std::string> calls = cuda::emu::cudnn_backend_calls();
      int executes = 0;
      for (const std::string& c : calls) {
        executes += c == "cudnnBackendExecute(EXECUTION_PLAN)";
        EXPECT_TRUE(c.find("(VARIANT_PACK)") != std::string::npos || c == "cudnnBackendExecute(EXECUTION_PLAN)")
            << tag << ": a planned shape called " << c;
      }
      EXPECT_EQ(executes, 3) << tag << ": forward, data and filter gradients";
    }
  }
}
#endif

TEST_F(ConvPlan, CuDnnIsAskedOncePerShapeInBothModes) {
  for (const bool benchmark : {false, true}) {
    cuda::set_cudnn_benchmark(benchmark);
    for (const DType dt : {DType::f32, DType::f16}) {
      const std::string tag = std::string(benchmark ? "benchmark " : "heuristic ") + dtype_name(dt);
      const Grads first = conv_step(dt, false);
      conv_step(dt, true);
      const size_t plans = cuda::conv_algo_cache_size();
#ifdef MINIDL_CUDA_EMU
      const long long queries = cuda::emu::cudnn_algorithm_queries();
#endif
      for (int i = 0; i < 3; ++i) {
        const Grads again = conv_step(dt, false);
        conv_step(dt, true);
        EXPECT_EQ(again.y, first.y) << tag << ": the forward under the cached plan";
      }
      EXPECT_EQ(cuda::conv_algo_cache_size(), plans) << tag << ": a repeated shape made a new plan";
#ifdef MINIDL_CUDA_EMU
      EXPECT_EQ(cuda::emu::cudnn_algorithm_queries(), queries)
          << tag << ": cuDNN was asked again for shapes it had already planned";
#endif
    }
  }
  // Three directions for two shapes, in each of the four (mode, dtype) pairs.
  EXPECT_EQ(cuda::conv_algo_cache_size(), 4u * 2u * 3u);
}

// The meta device's dry run (conv_workspace_candidates, kernels/meta/cuda_model.cpp) asks for the
// same shapes at every trial of a max-batch search: it shares the heuristic-mode plan that the
// convolution itself runs by, so cuDNN is asked once per shape there too.
TEST_F(ConvPlan, TheDryRunsWorkspaceCandidatesShareThePlan) {
  const Shape x{4, 8, 10, 10}, w{16, 8, 3, 3}, y{4, 16, 10, 10};
  const Conv2dOptions o{.stride = {1, 1}, .padding = {1, 1}};
  for (const DType dt : {DType::f32, DType::f16}) {
    const std::vector<size_t> first = cuda::conv_workspace_candidates(cuda::ConvDir::Forward, x, w, y, o, dt);
    ASSERT_FALSE(first.empty()) << dtype_name(dt);
    const size_t plans = cuda::conv_algo_cache_size();
#ifdef MINIDL_CUDA_EMU
    const long long queries = cuda::emu::cudnn_algorithm_queries();
#endif
    EXPECT_EQ(cuda::conv_workspace_candidates(cuda::ConvDir::Forward, x, w, y, o, dt), first) << dtype_name(dt);
    conv_step(dt, false);   // the same 3x3 layer's forward runs by that plan: no new one for it
    EXPECT_EQ(cuda::conv_algo_cache_size(), plans + 2) << dtype_name(dt) << ": only the two backward plans are new";
#ifdef MINIDL_CUDA_EMU
    conv_step(dt, false);
    const long long after_backward = cuda::emu::cudnn_algorithm_queries();
    EXPECT_EQ(cuda::conv_workspace_candidates(cuda::ConvDir::Forward, x, w, y, o, dt), first);
    EXPECT_EQ(cuda::emu::cudnn_algorithm_queries(), after_backward) << dtype_name(dt);
    EXPECT_GT(after_backward, queries) << "the backward plans were built: the counter counts";
#endif
  }
}

TEST_F(ConvPlan, DeterministicModeRunsOnlyDeterministicAlgorithms) {
#ifdef MINIDL_CUDA_EMU
  // The emulated heuristics rank backward-filter ALGO_3 (partial sums added with atomics) first for
  // the strided 1x1 layer: without the switch it runs, with it it must not.
  const auto nondeterministic = [](const cuda::emu::LibCall& c) {
    return (c.op == "conv backward filter" && (c.algo == "ALGO_0" || c.algo == "ALGO_3")) ||
           (c.op == "conv backward data" && c.algo == "ALGO_0");
  };
  cuda::emu::clear_call_log();
  cuda::emu::set_call_logging(true);
  conv_step(DType::f32, true);
  cuda::emu::set_call_logging(false);
  int picked = 0;
  for (const cuda::emu::LibCall& c : cuda::emu::call_log()) picked += nondeterministic(c);
  ASSERT_EQ(picked, 1) << "the emulated heuristics no longer pick a nondeterministic algorithm: this test checks nothing";
#endif
  cuda::set_cudnn_deterministic(true);
  for (const bool benchmark : {false, true}) {
    cuda::set_cudnn_benchmark(benchmark);
    for (const DType dt : {DType::f32, DType::f16}) {
      const std::string tag = std::string(benchmark ? "benchmark " : "heuristic ") + dtype_name(dt);
#ifdef MINIDL_CUDA_EMU
      cuda::emu::clear_call_log();
      cuda::emu::set_call_logging(true);
#endif
      for (const bool stride2 : {false, true}) {
        const Grads a = conv_step(dt, stride2), b = conv_step(dt, stride2);
        EXPECT_EQ(a.gx, b.gx) << tag;
        EXPECT_EQ(a.gw, b.gw) << tag;
      }
#ifdef MINIDL_CUDA_EMU
      cuda::emu::set_call_logging(false);
      for (const cuda::emu::LibCall& c : cuda::emu::call_log())
        EXPECT_FALSE(nondeterministic(c)) << tag << ": " << c.op << " ran " << c.algo;
#endif
    }
  }
}

#ifdef MINIDL_CUDA_EMU
// cuDNN's Find times each algorithm once, and an algorithm's first run in a process also loads its
// kernels, so one Find can rank an algorithm by its load time. The backend runs Find
// cudnn_find_trials() times (default 1) and keeps each algorithm's best. The emulated Find adds a
// delay to the fastest algorithm in one of its calls: one trial picks another algorithm; two or
// three pick the fastest, whichever trial is delayed.
TEST_F(ConvPlan, AutotuningKeepsEachAlgorithmsBestTimeOverItsTrials) {
  cuda::set_cudnn_benchmark(true);
  auto forward_algorithm = [] {
    cuda::clear_conv_algo_cache();
    cuda::emu::clear_call_log();
    cuda::emu::set_call_logging(true);
    conv_step(DType::f16, false);
    cuda::emu::set_call_logging(false);
    std::string algo;
    for (const cuda::emu::LibCall& c : cuda::emu::call_log())
      if (c.op == "conv forward") algo = c.algo;
    return algo;
  };
  const int trials_before = cuda::cudnn_find_trials();
  EXPECT_EQ(trials_before, 1) << "the default (or MINIDL_CUDNN_FIND_TRIALS in the environment)";
  const std::string fastest = forward_algorithm();
  ASSERT_FALSE(fastest.empty());
  int fastest_id = -1;   // the forward enum value whose name the call log wrote
  for (int a = 0; a < CUDNN_CONVOLUTION_FWD_ALGO_COUNT && fastest_id < 0; ++a) {
    cuda::emu::set_cudnn_find_delay([a](long long, int algo) { return algo == a ? 1e6f : 0.0f; });
    if (forward_algorithm() != fastest) fastest_id = a;
  }
  ASSERT_GE(fastest_id, 0) << "no delay moved the pick off " << fastest;
  // Delayed in one Find only: the forward's first (call 0: it runs first), or its last.
  for (const int trials : {1, 2, 3}) {
    for (const long long delayed : {0LL, trials - 1LL}) {
      cuda::set_cudnn_find_trials(trials);
      cuda::emu::set_cudnn_find_delay([fastest_id, delayed](long long call, int algo) {
        return call == delayed && algo == fastest_id ? 1e6f : 0.0f;
      });
      const long long queries = cuda::emu::cudnn_algorithm_queries();
      const std::string picked = forward_algorithm();
      if (trials == 1) EXPECT_NE(picked, fastest) << "one trial: the first-run delay should have cost it the pick";
      else EXPECT_EQ(picked, fastest) << trials << " trials, trial " << delayed << " delayed";
      // Per direction: the ranking, then `trials` Finds, then a workspace query per candidate.
      EXPECT_GE(cuda::emu::cudnn_algorithm_queries() - queries, 3LL * (1 + trials)) << trials << " trials";
    }
  }
  cuda::emu::set_cudnn_find_delay({});
  cuda::set_cudnn_find_trials(trials_before);
  EXPECT_THROW(cuda::set_cudnn_find_trials(0), Error);
}
#endif

#endif  // MINIDL_WITH_CUDA

}  // namespace
}  // namespace minidl::testing::parity
