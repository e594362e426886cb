// minidl_bench_cpu_step: one model's CPU training step (forward, loss, backward, SGD step) timed at a
// given batch, with the CPU time split into user and system time and the page faults per step, so
// bench/compare_cpu.sh can put minidl beside PyTorch and Keras and say where the time goes; --peak
// measures the machine's FMA peak with the same threads, the denominator of its "share of peak".
#include <immintrin.h>
#include <omp.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "core/allocator.h"
#include "core/ops.h"
#include "train/config.h"
#include "train/model.h"

namespace {

using Clock = std::chrono::steady_clock;

struct Usage {
  double user = 0, sys = 0;
  long minor_faults = 0;
};

Usage usage_now() {
  rusage r{};
  getrusage(RUSAGE_SELF, &r);
  return {static_cast<double>(r.ru_utime.tv_sec) + 1e-6 * static_cast<double>(r.ru_utime.tv_usec),
          static_cast<double>(r.ru_stime.tv_sec) + 1e-6 * static_cast<double>(r.ru_stime.tv_usec), r.ru_minflt};
}

// Independent fused multiply-add chains per thread, enough of them to cover the FMA latency on
// every port, written with intrinsics so each is one FMA instruction of the widest vector the
// build targets (-march=native): AVX-512, else AVX2 + FMA.
constexpr int kChains = 12;
#if defined(__AVX512F__)
using Vec = __m512;
constexpr int kLanes = 16;
inline Vec vset(float v) { return _mm512_set1_ps(v); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm512_fmadd_ps(a, b, c); }
inline float vsum(Vec a) {   // not _mm512_reduce_add_ps: GCC 12 warns inside it (-Wuninitialized)
  alignas(64) float f[16];
  _mm512_store_ps(f, a);
  float s = 0;
  for (float x : f) s += x;
  return s;
}
#elif defined(__FMA__)
using Vec = __m256;
constexpr int kLanes = 8;
inline Vec vset(float v) { return _mm256_set1_ps(v); }
inline Vec vfma(Vec a, Vec b, Vec c) { return _mm256_fmadd_ps(a, b, c); }
inline float vsum(Vec a) {
  alignas(32) float f[8];
  _mm256_store_ps(f, a);
  return f[0] + f[1] + f[2] + f[3] + f[4] + f[5] + f[6] + f[7];
}
#else
#error "minidl_bench_cpu_step --peak needs FMA (build with MINIDL_NATIVE=ON on an FMA machine)"
#endif

// One thread's chains, outside the OpenMP region and not inlined into it. Inside the outlined
// region GCC 12 kept the accumulator array in memory and stored all twelve every iteration, so the
// loop ran at the store rate, half the FMA rate: 183.8 GFLOP/s on the 2 cores of the development
// VM, below what every framework's ResNet steps sustained there (110-130% of it). Here the
// array is a plain local that GCC keeps in registers; tests/tools/fma_loop_test.sh (ctest
// bench.fma_peak_loop) fails if a store ever comes back into the loop.
__attribute__((noinline)) float fma_chains(int64_t iters, float seed) {
  Vec acc[kChains];
  for (int c = 0; c < kChains; ++c) acc[c] = vset(seed + 1e-3f * static_cast<float>(c));
  const Vec a = vset(0.999999f), b = vset(1e-7f);
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int c = 0; c < kChains; ++c) acc[c] = vfma(acc[c], a, b);
  }
  float sum = 0;
  for (int c = 0; c < kChains; ++c) sum += vsum(acc[c]);
  return sum;
}

// The best of three measurements of `seconds` / 3 each, in GFLOP/s (an FMA is 2 FLOP).
double fma_peak_gflops(int threads, double seconds) {
  constexpr int64_t kIters = 1'000'000;
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    const auto t0 = Clock::now();
    double elapsed = 0;
    int64_t rounds = 0;
    float sink = 0;
    while (elapsed < seconds / 3) {
#pragma omp parallel num_threads(threads) reduction(+ : sink)
      sink += fma_chains(kIters, 1e-2f * static_cast<float>(omp_get_thread_num()));
      ++rounds;
      elapsed = std::chrono::duration<double>(Clock::now() - t0).count();
    }
    if (sink == 12345.0f) std::puts("");  // keeps the chains alive
    const double flops = 2.0 * kChains * kLanes * static_cast<double>(kIters) * threads * static_cast<double>(rounds);
    best = std::max(best, flops / elapsed / 1e9);
  }
  return best;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace minidl;
  std::string model = "smallcnn";
  int64_t image_size = 0, batch = 16;
  int steps = 5, warmup = 1, threads = 0;
  bool peak = false;
  double peak_seconds = 1.5;
  CLI::App app{"minidl_bench_cpu_step: time training steps of one model on the CPU (SGD lr 0.01, random inputs)"};
  app.add_option("--model", model, "smallcnn, resnet18, resnet50, resnet18-small, ... (as minidl-train --model)");
  app.add_option("--image-size", image_size, "input height and width; 0: the model's default");
  app.add_option("--batch-size", batch, "images per step");
  app.add_option("--steps", steps, "timed steps");
  app.add_option("--warmup", warmup, "untimed steps first");
  app.add_option("--threads", threads, "OpenMP threads; 0: OMP_NUM_THREADS or all cores");
  app.add_flag("--peak", peak, "only measure the FMA peak (GFLOP/s) with --threads threads and print it");
  app.add_option("--peak-seconds", peak_seconds, "how long --peak measures");
  CLI11_PARSE(app, argc, argv);
  if (threads > 0) omp_set_num_threads(threads);
  const int nt = omp_get_max_threads();
  if (peak) {
    std::printf("{\"threads\": %d, \"fma_peak_gflops\": %.1f}\n", nt, fma_peak_gflops(nt, peak_seconds));
    return 0;
  }
  train::TrainConfig c;
  c.model = model;
  c.image_size = image_size;
  c.batch_size = batch;
  train::Model m = train::make_model(c, 0);
  auto opt = train::make_optimizer(c, *m.module, 0.01);
  m.module->train();
  const Tensor x = randn(m.input_shape(batch));
  const Tensor labels = gt(rand({batch}), full({1}, 0.5)).to(DType::i64);
  // Phase times of the last timed step: forward (with the loss), backward, optimizer step.
  double t_fwd = 0, t_bwd = 0, t_opt = 0;
  auto one_step = [&] {
    const auto t0 = Clock::now();
    const Tensor loss = m.loss(m.forward(x), labels);
    const auto t1 = Clock::now();
    loss.backward();
    const auto t2 = Clock::now();
    opt->step();
    opt->zero_grad();
    const auto t3 = Clock::now();
    t_fwd = std::chrono::duration<double>(t1 - t0).count();
    t_bwd = std::chrono::duration<double>(t2 - t1).count();
    t_opt = std::chrono::duration<double>(t3 - t2).count();
  };
  for (int i = 0; i < warmup; ++i) one_step();
  reset_peak_stats();
  const Usage u0 = usage_now();
  std::vector<double> times;
  for (int i = 0; i < steps; ++i) {
    const auto t0 = Clock::now();
    one_step();
    times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  const Usage u1 = usage_now();
  std::sort(times.begin(), times.end());
  const double median = times[times.size() / 2], best = times.front();
  const MemoryStats ms = memory_stats();
  std::printf(
      "{\"framework\": \"minidl\", \"model\": \"%s\", \"image_size\": %lld, \"batch\": %lld, \"threads\": %d, "
      "\"steps\": %d, \"step_s_median\": %.5f, \"step_s_best\": %.5f, \"images_per_s\": %.2f, "
      "\"user_s_per_step\": %.4f, \"sys_s_per_step\": %.4f, \"minor_faults_per_step\": %.0f, "
      "\"peak_allocated_mib\": %.1f, \"peak_reserved_mib\": %.1f, \"last_step_forward_s\": %.4f, "
      "\"last_step_backward_s\": %.4f, \"last_step_optimizer_s\": %.4f}\n",
      model.c_str(), static_cast<long long>(m.image_size), static_cast<long long>(batch), nt, steps, median, best,
      static_cast<double>(batch) / median, (u1.user - u0.user) / steps, (u1.sys - u0.sys) / steps,
      static_cast<double>(u1.minor_faults - u0.minor_faults) / steps, ms.peak_allocated_bytes / 1048576.0,
      ms.peak_reserved_bytes / 1048576.0, t_fwd, t_bwd, t_opt);
  return 0;
}
