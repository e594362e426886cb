// GPU benchmarks of the CUDA backend (Google Benchmark, manual time from CUDA events after a
// warm-up, inputs far larger than L2): elementwise and reduction bandwidth against a
// device-to-device copy measured in the same run (the target is >= 85% of it), GEMM TFLOP/s
// (f32, TF32, f16) and every distinct ResNet-50 convolution shape, forward and both backwards, at
// batch 64 and 256 in NCHW and NHWC. Exits 1 with a one-line message when no GPU is usable.
#include <benchmark/benchmark.h>

#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/backend.h"
#include "core/ops.h"
#include "kernels/cuda/context.cuh"
#include "kernels/cuda/conv.cuh"
#include "kernels/cuda/runtime.h"

namespace minidl::cuda {
namespace {

const Device kGpu = Device::cuda(0);
double g_copy_gbps = 0;   // the D2D copy baseline of this run (bytes read + written per second)

// Times `iters` calls of fn on the context's stream with a pair of events (cuda::EventTimer);
// returns seconds per call.
template <typename F>
double time_on_stream(DeviceContext& ctx, int iters, F&& fn) {
  for (int i = 0; i < 3; ++i) fn();   // warm-up: lazy handles, algorithm choice, caches
  EventTimer timer(ctx.index());
  timer.start();
  for (int i = 0; i < iters; ++i) fn();
  timer.stop();
  return timer.elapsed_seconds() / iters;
}

// Runs one timed batch per benchmark iteration and reports bytes/s (and the ratio to the copy).
template <typename F>
void run_bandwidth(benchmark::State& st, double bytes, bool is_copy, F&& fn) {
  DeviceContext& ctx = context(0);
  double secs = 0;
  for (auto _ : st) {
    secs = time_on_stream(ctx, 20, fn);
    st.SetIterationTime(secs);
  }
  const double gbps = bytes / secs / 1e9;
  st.counters["GB/s"] = gbps;
  if (is_copy) g_copy_gbps = gbps;
  if (!is_copy && g_copy_gbps > 0) st.counters["vs_copy"] = gbps / g_copy_gbps;
}

constexpr int64_t kElems = int64_t{64} << 20;   // 64 Mi f32 = 256 MiB per operand (>> 50 MB L2)

void BM_D2DCopy(benchmark::State& st) {
  Tensor a = rand({kElems}, {DType::f32, kGpu}), b = empty({kElems}, {DType::f32, kGpu});
  DeviceContext& ctx = context(0);
  run_bandwidth(st, 2.0 * kElems * 4, true, [&] {
    MINIDL_CUDA_CHECK(cudaMemcpyAsync(b.data_ptr(), a.data_ptr(), kElems * 4, cudaMemcpyDeviceToDevice, ctx.stream()));
  });
}

void BM_Add(benchmark::State& st, DType dt) {
  Tensor a = rand({kElems}, {DType::f32, kGpu}).to(dt), b = rand({kElems}, {DType::f32, kGpu}).to(dt);
  Tensor c = empty({kElems}, {dt, kGpu});
  run_bandwidth(st, 3.0 * kElems * dtype_size(dt), false,
                [&] { cuda_backend().binary(BinaryOp::Add, a, b, c, 1.0); });
}

void BM_AddScalarInPlace(benchmark::State& st) {
  Tensor a = rand({kElems}, {DType::f32, kGpu});
  Tensor s = full({1}, 0.5, {DType::f32, kGpu}).expand({kElems});
  run_bandwidth(st, 2.0 * kElems * 4, false, [&] { cuda_backend().binary(BinaryOp::Mul, a, s, a, 1.0); });
}

void BM_Relu(benchmark::State& st, DType dt) {
  Tensor a = rand({kElems}, {DType::f32, kGpu}).to(dt), c = empty({kElems}, {dt, kGpu});
  run_bandwidth(st, 2.0 * kElems * dtype_size(dt), false,
                [&] { cuda_backend().unary(UnaryOp::Relu, a, c, 0.0); });
}

void BM_Cast(benchmark::State& st) {
  Tensor a = rand({kElems}, {DType::f32, kGpu}), c = empty({kElems}, {DType::f16, kGpu});
  run_bandwidth(st, kElems * 6.0, false, [&] { cuda_backend().copy(a, c); });
}

void BM_SumAll(benchmark::State& st) {
  Tensor a = rand({kElems}, {DType::f32, kGpu}), c = empty({1}, {DType::f32, kGpu});
  run_bandwidth(st, kElems * 4.0, false, [&] { cuda_backend().reduce(ReduceOp::Sum, a, {0}, c); });
}

void BM_SumRows(benchmark::State& st) {
  Tensor a = rand({4096, kElems / 4096}, {DType::f32, kGpu}), c = empty({4096, 1}, {DType::f32, kGpu});
  run_bandwidth(st, kElems * 4.0, false, [&] { cuda_backend().reduce(ReduceOp::Sum, a, {1}, c); });
}

void BM_Gemm(benchmark::State& st, DType dt, bool tf32) {
  const int64_t n = st.range(0);
  Tensor a = rand({1, n, n}, {DType::f32, kGpu}).to(dt), b = rand({1, n, n}, {DType::f32, kGpu}).to(dt);
  Tensor c = empty({1, n, n}, {dt, kGpu});
  set_allow_tf32_matmul(tf32);
  DeviceContext& ctx = context(0);
  double secs = 0;
  for (auto _ : st) {
    secs = time_on_stream(ctx, 10, [&] { cuda_backend().matmul(a, b, c); });
    st.SetIterationTime(secs);
  }
  set_allow_tf32_matmul(false);
  st.counters["TFLOP/s"] = 2.0 * n * n * n / secs / 1e12;
}

// ---- ResNet-50 convolutions ----

struct ConvSpec {
  const char* name;
  int64_t c, hw, k, r, stride, pad;
};

// Every distinct convolution of torchvision's ResNet-50 (v1.5: the stride sits on the 3x3).
const std::vector<ConvSpec>& resnet50_convs() {
  static const std::vector<ConvSpec> v{
      {"stem7x7", 3, 224, 64, 7, 2, 3},
      {"l1_1x1_64_64", 64, 56, 64, 1, 1, 0},      {"l1_3x3_64", 64, 56, 64, 3, 1, 1},
      {"l1_1x1_64_256", 64, 56, 256, 1, 1, 0},    {"l1_1x1_256_64", 256, 56, 64, 1, 1, 0},
      {"l2_1x1_256_128", 256, 56, 128, 1, 1, 0},  {"l2_3x3_128_s2", 128, 56, 128, 3, 2, 1},
      {"l2_1x1_128_512", 128, 28, 512, 1, 1, 0},  {"l2_down_256_512_s2", 256, 56, 512, 1, 2, 0},
      {"l2_1x1_512_128", 512, 28, 128, 1, 1, 0},  {"l2_3x3_128", 128, 28, 128, 3, 1, 1},
      {"l3_1x1_512_256", 512, 28, 256, 1, 1, 0},  {"l3_3x3_256_s2", 256, 28, 256, 3, 2, 1},
      {"l3_1x1_256_1024", 256, 14, 1024, 1, 1, 0}, {"l3_down_512_1024_s2", 512, 28, 1024, 1, 2, 0},
      {"l3_1x1_1024_256", 1024, 14, 256, 1, 1, 0}, {"l3_3x3_256", 256, 14, 256, 3, 1, 1},
      {"l4_1x1_1024_512", 1024, 14, 512, 1, 1, 0}, {"l4_3x3_512_s2", 512, 14, 512, 3, 2, 1},
      {"l4_1x1_512_2048", 512, 7, 2048, 1, 1, 0},  {"l4_down_1024_2048_s2", 1024, 14, 2048, 1, 2, 0},
      {"l4_1x1_2048_512", 2048, 7, 512, 1, 1, 0},  {"l4_3x3_512", 512, 7, 512, 3, 1, 1},
  };
  return v;
}

void BM_Conv(benchmark::State& st, ConvSpec spec, int64_t batch, bool nhwc, int dir, DType dt) {
  ConvShape cs;
  cs.n = batch;
  cs.c = spec.c;
  cs.h = cs.w = spec.hw;
  cs.k = spec.k;
  cs.r = cs.s = spec.r;
  cs.o.stride = {spec.stride, spec.stride};
  cs.o.padding = {spec.pad, spec.pad};
  cs.oh = cs.ow = (spec.hw + 2 * spec.pad - spec.r) / spec.stride + 1;
  cs.dtype = dt;
  cs.nhwc = nhwc;
  // Only the memory layout matters for timing: buffers of the right sizes, random contents.
  Tensor x = rand({cs.n * cs.c * cs.h * cs.w}, {DType::f32, kGpu}).to(dt);
  Tensor w = rand({cs.k * cs.c * cs.r * cs.s}, {DType::f32, kGpu}).to(dt);
  Tensor y = rand({cs.n * cs.k * cs.oh * cs.ow}, {DType::f32, kGpu}).to(dt);
  DeviceContext& ctx = context(0);
  auto fn = [&] {
    if (dir == 0) conv_forward_raw(ctx, cs, x.data_ptr(), w.data_ptr(), y.data_ptr());
    else if (dir == 1) conv_backward_data_raw(ctx, cs, y.data_ptr(), w.data_ptr(), x.data_ptr());
    else conv_backward_filter_raw(ctx, cs, x.data_ptr(), y.data_ptr(), w.data_ptr());
  };
  double secs = 0;
  for (auto _ : st) {
    secs = time_on_stream(ctx, 5, fn);
    st.SetIterationTime(secs);
  }
  st.counters["TFLOP/s"] = 2.0 * cs.n * cs.k * cs.oh * cs.ow * cs.c * cs.r * cs.s / secs / 1e12;
  st.counters["img/s"] = static_cast<double>(batch) / secs;
}

void register_all() {
  benchmark::RegisterBenchmark("D2DCopy/f32", BM_D2DCopy)->UseManualTime()->Iterations(3);
  benchmark::RegisterBenchmark("Add/f32", BM_Add, DType::f32)->UseManualTime()->Iterations(3);
  benchmark::RegisterBenchmark("Add/f16", BM_Add, DType::f16)->UseManualTime()->Iterations(3);
  benchmark::RegisterBenchmark("MulScalarInPlace/f32", BM_AddScalarInPlace)->UseManualTime()->Iterations(3);
  benchmark::RegisterBenchmark("Relu/f32", BM_Relu, DType::f32)->UseManualTime()->Iterations(3);
  benchmark::RegisterBenchmark("Relu/f16", BM_Relu, DType::f16)->UseManualTime()->Iterations(3);
  benchmark::RegisterBenchmark("Cast/f32_to_f16", BM_Cast)->UseManualTime()->Iterations(3);
  benchmark::RegisterBenchmark("SumAll/f32", BM_SumAll)->UseManualTime()->Iterations(3);
  benchmark::RegisterBenchmark("SumRows/f32", BM_SumRows)->UseManualTime()->Iterations(3);
  for (int64_t n : {2048, 8192}) {
    benchmark::RegisterBenchmark("Gemm/f32", BM_Gemm, DType::f32, false)->Arg(n)->UseManualTime()->Iterations(2);
    benchmark::RegisterBenchmark("Gemm/tf32", BM_Gemm, DType::f32, true)->Arg(n)->UseManualTime()->Iterations(2);
    benchmark::RegisterBenchmark("Gemm/f16", BM_Gemm, DType::f16, false)->Arg(n)->UseManualTime()->Iterations(2);
  }
  const char* dirs[] = {"fwd", "bwd_data", "bwd_filter"};
  for (const ConvSpec& s : resnet50_convs()) {
    for (int64_t batch : {64, 256}) {
      for (bool nhwc : {false, true}) {
        for (int dir = 0; dir < 3; ++dir) {
          const std::string name = std::string("ResNet50Conv/") + s.name + "/b" + std::to_string(batch) +
                                   (nhwc ? "/nhwc/" : "/nchw/") + dirs[dir];
          benchmark::RegisterBenchmark(name.c_str(), BM_Conv, s, batch, nhwc, dir, DType::f32)
              ->UseManualTime()
              ->Iterations(1);
        }
      }
    }
  }
}

}  // namespace
}  // namespace minidl::cuda

int main(int argc, char** argv) {
  if (minidl::cuda_device_count() == 0) {
    std::fprintf(stderr, "minidl_bench_cuda: no CUDA device (%s)\n", minidl::cuda::runtime_status().c_str());
    return 1;
  }
  // MINIDL_BENCH_CUDNN_BENCHMARK=1 times the convolutions with cuDNN autotuning (benchmark mode).
  const char* tune = std::getenv("MINIDL_BENCH_CUDNN_BENCHMARK");
  minidl::cuda::set_cudnn_benchmark(tune != nullptr && std::string(tune) == "1");
  benchmark::AddCustomContext("device", minidl::cuda::device_description(0));
  benchmark::AddCustomContext("cudnn_benchmark", minidl::cuda::cudnn_benchmark() ? "on" : "off");
  benchmark::AddCustomContext("conv_tf32", minidl::cuda::allow_tf32_cudnn() ? "on" : "off");
  minidl::cuda::register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
