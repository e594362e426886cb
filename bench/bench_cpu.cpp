// CPU benchmarks: GEMM, the convolutions of a ResNet-18 at 64x64 / batch 32, and a whole ResNet-18
// training step, with FLOP/s and images/s counters, so each kernel change can be weighed against
// PyTorch on the same machine (bench/pytorch_resnet18_cpu.py; results in lab/results/bench/).
#include <benchmark/benchmark.h>

#include <cstdint>
#include <vector>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/generator.h"
#include "core/ops.h"
#include "nn/functional_cnn.h"
#include "resnet18_functional.h"

namespace minidl {
namespace {

// Wall time, not the main thread's CPU time: the kernels run on OpenMP threads.
void set_rate(benchmark::State& state, const char* name, double per_iteration) {
  state.counters[name] = benchmark::Counter(per_iteration * static_cast<double>(state.iterations()),
                                            benchmark::Counter::kIsRate);
}

// ---- GEMM: [M,K] x [K,N] ----
void BM_matmul(benchmark::State& state) {
  const int64_t m = state.range(0), n = state.range(1), k = state.range(2);
  Generator gen(1);
  const Tensor a = randn({m, k}, {}, &gen);
  const Tensor b = randn({k, n}, {}, &gen);
  NoGradGuard no_grad;
  for (auto _ : state) {
    Tensor c = matmul(a, b);
    benchmark::DoNotOptimize(c.data_ptr());
  }
  set_rate(state, "FLOP/s", 2.0 * static_cast<double>(m * n * k));
}
// Square sizes, then the im2col GEMMs of ResNet-18 3x3 convolutions at 64x64 / batch 32
// ([out_c, in_c*9] x [in_c*9, batch*H*W]): the shapes a conv lowered to one GEMM per batch runs.
BENCHMARK(BM_matmul)
    ->ArgNames({"M", "N", "K"})
    ->Args({256, 256, 256})
    ->Args({512, 512, 512})
    ->Args({1024, 1024, 1024})
    ->Args({64, 8192, 576})     // layer1 64->64 at 16x16
    ->Args({128, 2048, 1152})   // layer2 128->128 at 8x8
    ->Args({256, 512, 2304})    // layer3 256->256 at 4x4
    ->Args({512, 128, 4608})    // layer4 512->512 at 2x2
    ->Args({64, 256, 576})      // layer1 per image (one GEMM per image)
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// ---- Convolution: args {N, C, H, W, O, k, stride, pad} ----
struct ConvCase {
  Tensor x, w, gy;
  Conv2dOptions opts;
  double flops = 0.0;  // forward multiply-adds x 2
  int64_t batch = 0;
};

ConvCase make_conv_case(const benchmark::State& state, bool with_grad) {
  ConvCase c;
  const int64_t n = state.range(0), ch = state.range(1), h = state.range(2), w = state.range(3);
  const int64_t o = state.range(4), k = state.range(5), s = state.range(6), p = state.range(7);
  Generator gen(2);
  c.x = randn({n, ch, h, w}, {}, &gen);
  c.w = randn({o, ch, k, k}, {}, &gen);
  // The stem's input is the image batch: no gradient wanted, as in training.
  if (with_grad) {
    if (ch != 3) c.x.set_requires_grad(true);
    c.w.set_requires_grad(true);
  }
  c.opts.stride = {s, s};
  c.opts.padding = {p, p};
  const int64_t ho = conv_output_size(h, k, s, p, 1, false, "bench");
  const int64_t wo = conv_output_size(w, k, s, p, 1, false, "bench");
  c.gy = randn({n, o, ho, wo}, {}, &gen);
  c.flops = 2.0 * static_cast<double>(n * o * ho * wo * ch * k * k);
  c.batch = n;
  return c;
}

void BM_conv2d_forward(benchmark::State& state) {
  const ConvCase c = make_conv_case(state, false);
  NoGradGuard no_grad;
  for (auto _ : state) {
    Tensor y = conv2d(c.x, c.w, Tensor(), c.opts);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  set_rate(state, "FLOP/s", c.flops);
  set_rate(state, "images/s", static_cast<double>(c.batch));
}

void BM_conv2d_forward_backward(benchmark::State& state) {
  ConvCase c = make_conv_case(state, true);
  // Backward costs one forward-sized GEMM per wanted gradient (input and weight).
  const double passes = c.x.requires_grad() ? 3.0 : 2.0;
  for (auto _ : state) {
    c.x.zero_grad();
    c.w.zero_grad();
    Tensor y = conv2d(c.x, c.w, Tensor(), c.opts);
    y.backward(c.gy);
    benchmark::DoNotOptimize(c.w.grad().data_ptr());
  }
  set_rate(state, "FLOP/s", passes * c.flops);
  set_rate(state, "images/s", static_cast<double>(c.batch));
}

// ResNet-18 at 64x64, batch 32: every distinct convolution shape of the network.
void resnet18_conv_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"N", "C", "H", "W", "O", "k", "s", "p"});
  b->Args({32, 3, 64, 64, 64, 7, 2, 3});      // stem
  b->Args({32, 64, 16, 16, 64, 3, 1, 1});     // layer1
  b->Args({32, 64, 16, 16, 128, 3, 2, 1});    // layer2 first conv
  b->Args({32, 128, 8, 8, 128, 3, 1, 1});     // layer2
  b->Args({32, 64, 16, 16, 128, 1, 2, 0});    // layer2 downsample
  b->Args({32, 128, 8, 8, 256, 3, 2, 1});     // layer3 first conv
  b->Args({32, 256, 4, 4, 256, 3, 1, 1});     // layer3
  b->Args({32, 128, 8, 8, 256, 1, 2, 0});     // layer3 downsample
  b->Args({32, 256, 4, 4, 512, 3, 2, 1});     // layer4 first conv
  b->Args({32, 512, 2, 2, 512, 3, 1, 1});     // layer4
  b->Args({32, 256, 4, 4, 512, 1, 2, 0});     // layer4 downsample
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}
BENCHMARK(BM_conv2d_forward)->Apply(resnet18_conv_shapes);
BENCHMARK(BM_conv2d_forward_backward)->Apply(resnet18_conv_shapes);

// ResNet-50 (v1.5) at 128 px, batch 16 (bench/compare_cpu.sh's case): every distinct convolution
// shape, forward and forward + backward; the comment says how many of the network's 53
// convolutions have it.
void resnet50_conv_shapes(benchmark::internal::Benchmark* b) {
  b->ArgNames({"N", "C", "H", "W", "O", "k", "s", "p"});
  b->Args({16, 3, 128, 128, 64, 7, 2, 3});     // stem (1)
  b->Args({16, 64, 32, 32, 64, 1, 1, 0});      // layer1 reduce, first block (1)
  b->Args({16, 256, 32, 32, 64, 1, 1, 0});     // layer1 reduce (2)
  b->Args({16, 64, 32, 32, 64, 3, 1, 1});      // layer1 3x3 (3)
  b->Args({16, 64, 32, 32, 256, 1, 1, 0});     // layer1 expand and downsample (4)
  b->Args({16, 256, 32, 32, 128, 1, 1, 0});    // layer2 reduce, first block (1)
  b->Args({16, 128, 32, 32, 128, 3, 2, 1});    // layer2 3x3, stride 2 (1)
  b->Args({16, 256, 32, 32, 512, 1, 2, 0});    // layer2 downsample (1)
  b->Args({16, 512, 16, 16, 128, 1, 1, 0});    // layer2 reduce (3)
  b->Args({16, 128, 16, 16, 128, 3, 1, 1});    // layer2 3x3 (3)
  b->Args({16, 128, 16, 16, 512, 1, 1, 0});    // layer2 expand (4)
  b->Args({16, 512, 16, 16, 256, 1, 1, 0});    // layer3 reduce, first block (1)
  b->Args({16, 256, 16, 16, 256, 3, 2, 1});    // layer3 3x3, stride 2 (1)
  b->Args({16, 512, 16, 16, 1024, 1, 2, 0});   // layer3 downsample (1)
  b->Args({16, 1024, 8, 8, 256, 1, 1, 0});     // layer3 reduce (5)
  b->Args({16, 256, 8, 8, 256, 3, 1, 1});      // layer3 3x3 (5)
  b->Args({16, 256, 8, 8, 1024, 1, 1, 0});     // layer3 expand (6)
  b->Args({16, 1024, 8, 8, 512, 1, 1, 0});     // layer4 reduce, first block (1)
  b->Args({16, 512, 8, 8, 512, 3, 2, 1});      // layer4 3x3, stride 2 (1)
  b->Args({16, 1024, 8, 8, 2048, 1, 2, 0});    // layer4 downsample (1)
  b->Args({16, 2048, 4, 4, 512, 1, 1, 0});     // layer4 reduce (2)
  b->Args({16, 512, 4, 4, 512, 3, 1, 1});      // layer4 3x3 (2)
  b->Args({16, 512, 4, 4, 2048, 1, 1, 0});     // layer4 expand (3)
  b->UseRealTime()->Unit(benchmark::kMillisecond);
}
BENCHMARK(BM_conv2d_forward_backward)->Apply(resnet50_conv_shapes);
BENCHMARK(BM_conv2d_forward)->Apply(resnet50_conv_shapes);

// ---- Max pooling forward (stride 2): the small CNN's 2x2 at 200 px (batch 64) and ResNet's stem
// pool, 3x3 padded, at 64 px (ResNet-18, batch 32) and 128 px (ResNet-50, batch 16) ----
void BM_max_pool2d(benchmark::State& state) {
  const int64_t n = state.range(0), c = state.range(1), s = state.range(2), k = state.range(3), p = state.range(4);
  Generator gen(6);
  const Tensor x = randn({n, c, s, s}, {}, &gen);
  const Pool2dOptions o{.kernel = {k, k}, .stride = {2, 2}, .padding = {p, p}};
  NoGradGuard no_grad;
  for (auto _ : state) {
    const Tensor y = max_pool2d(x, o);
    benchmark::DoNotOptimize(y.data_ptr());
  }
  set_rate(state, "in_bytes/s", static_cast<double>(x.numel()) * 4.0);
}
BENCHMARK(BM_max_pool2d)
    ->ArgNames({"n", "c", "hw", "k", "p"})
    ->Args({64, 32, 200, 2, 0})
    ->Args({32, 64, 32, 3, 1})
    ->Args({16, 64, 64, 3, 1})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// ---- Batch norm + ReLU (+ residual add), forward and backward, training mode ----
// The ResNet-50 shapes of bench/compare_cpu.sh's 128 px, batch 16 case: the activations after
// its first convolutions (16 x 256 x 32 x 32, 16 MiB) and a deep stage (16 x 1024 x 8 x 8). The
// counter is activation bytes per second (x once), to set against the memory bandwidth.
void BM_batch_norm_act(benchmark::State& state) {
  const int64_t n = state.range(0), c = state.range(1), s = state.range(2);
  const bool add = state.range(3) != 0;
  Generator gen(5);
  Tensor x = randn({n, c, s, s}, {}, &gen), res = add ? randn({n, c, s, s}, {}, &gen) : Tensor();
  Tensor w = ones({c}), b = zeros({c});
  for (Tensor* t : {&x, &res, &w, &b}) {
    if (t->defined()) t->set_requires_grad(true);
  }
  const Tensor rm = zeros({c}), rv = ones({c});
  const Tensor gy = randn({n, c, s, s}, {}, &gen);
  for (auto _ : state) {
    const Tensor y = add ? batch_norm_add_relu(x, res, w, b, rm, rv, true) : batch_norm_relu(x, w, b, rm, rv, true);
    for (Tensor* t : {&x, &res, &w, &b}) {
      if (t->defined()) t->zero_grad();   // assigned, not accumulated: no extra pass over x's gradient
    }
    y.backward(gy);
    benchmark::DoNotOptimize(x.grad().data_ptr());
  }
  set_rate(state, "act_bytes/s", static_cast<double>(x.numel()) * 4.0);
}
BENCHMARK(BM_batch_norm_act)
    ->ArgNames({"n", "c", "hw", "add"})
    ->Args({16, 256, 32, 0})
    ->Args({16, 256, 32, 1})
    ->Args({16, 1024, 8, 0})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

// ---- Whole ResNet-18 step at 64x64, batch 32, 10 classes ----
// Forward FLOPs of ResNet-18 at 64x64 (convolutions and the classifier): 2 x 148.05 M multiply-adds
// per image; a training step is about 3x that.
constexpr double kResNet18Flops64 = 2.0 * 148.05e6;

struct ResNetCase {
  Generator gen{3};
  bench::ResNet18Functional model{10, gen};
  Tensor x, y;
  ResNetCase(int64_t batch, int64_t size) {
    x = randn({batch, 3, size, size}, {}, &gen);
    std::vector<double> labels(static_cast<size_t>(batch));
    for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<double>(i % 10);
    y = from_vector(labels, {batch}, {.dtype = DType::i64});
  }
};

void BM_resnet18_train_step(benchmark::State& state) {
  const int64_t batch = state.range(0), size = state.range(1);
  ResNetCase c(batch, size);
  const std::vector<Tensor> params = c.model.parameters();
  std::vector<Tensor> velocities;
  reset_peak_stats();
  for (auto _ : state) {
    const Tensor loss = cross_entropy(c.model.forward(c.x, /*training=*/true), c.y);
    for (Tensor p : params) p.zero_grad();
    loss.backward();
    nn::sgd_momentum_step(params, velocities, 0.01, 0.9, 1e-4);
    benchmark::DoNotOptimize(loss.data_ptr());
  }
  set_rate(state, "images/s", static_cast<double>(batch));
  set_rate(state, "FLOP/s", 3.0 * kResNet18Flops64 * static_cast<double>(batch) * static_cast<double>(size * size) /
                                (64.0 * 64.0));
  state.counters["peak_MiB"] = static_cast<double>(memory_stats().peak_allocated_bytes) / (1024.0 * 1024.0);
}
BENCHMARK(BM_resnet18_train_step)
    ->ArgNames({"batch", "size"})
    ->Args({32, 64})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond)
    ->MinTime(5.0);

void BM_resnet18_inference(benchmark::State& state) {
  const int64_t batch = state.range(0), size = state.range(1);
  ResNetCase c(batch, size);
  NoGradGuard no_grad;
  for (auto _ : state) {
    Tensor logits = c.model.forward(c.x, /*training=*/false);
    benchmark::DoNotOptimize(logits.data_ptr());
  }
  set_rate(state, "images/s", static_cast<double>(batch));
}
BENCHMARK(BM_resnet18_inference)
    ->ArgNames({"batch", "size"})
    ->Args({32, 64})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

}  // namespace
}  // namespace minidl

BENCHMARK_MAIN();
