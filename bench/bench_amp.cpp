// Mixed precision's memory claim, measured: peak allocated bytes of a ResNet-50 training step
// (224x224, SGD momentum) in FP32, with AMP (autocast + GradScaler) and in pure f16, from the
// allocator statistics, which are exact on the CPU. Activation memory is what the forward leaves
// allocated for backward (after the forward, minus before it, minus AMP's f16 weight copies).
// Step times are printed too but are not AMP's speed: the CPU computes f16 in f32 temporaries.
#include <CLI/CLI.hpp>

#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "core/allocator.h"
#include "core/autocast.h"
#include "core/autograd.h"
#include "core/generator.h"
#include "core/ops.h"
#include "nn/autocast.h"
#include "nn/resnet.h"
#include "optim/grad_scaler.h"
#include "optim/sgd.h"

namespace minidl {
namespace {

enum class Mode { Fp32, Amp, PureF16 };
const char* mode_name(Mode m) { return m == Mode::Fp32 ? "fp32" : m == Mode::Amp ? "amp" : "pure-f16"; }

struct Measure {
  int64_t before_forward = 0;   // parameters, optimizer state (grads are set to none)
  int64_t activations = 0;      // saved for backward
  int64_t weight_copies = 0;    // AMP's cached f16 weights
  int64_t peak = 0;             // peak allocated over the whole step
  double seconds = 0.0;
  bool stepped = false;         // false: the scaler skipped the step (inf/NaN gradients)
  double scale = 1.0;           // the loss scale the step used
};

Measure run(Mode mode, int64_t batch, int64_t size, int steps, double init_scale) {
  Generator gen(1);
  auto model = nn::resnet50(1000, &gen);
  if (mode == Mode::PureF16) nn::to_pure_f16(*model);
  // The "four ways" study's optimizer: SGD momentum 0.9, lr 0.001, weight decay 1e-4.
  optim::SGD sgd(model->parameters(), optim::SgdOptions{.lr = 0.001, .momentum = 0.9, .weight_decay = 1e-4});
  optim::GradScaler scaler({.init_scale = init_scale, .enabled = mode != Mode::Fp32});
  const DType in = mode == Mode::PureF16 ? DType::f16 : DType::f32;
  const Tensor x = randn(Shape{batch, 3, size, size}, {}, &gen).to(in);
  const Tensor y = arange(batch, {.dtype = DType::i64});  // classes 0..batch-1
  Measure m;
  for (int s = 0; s < steps; ++s) {  // the last step is measured: optimizer state exists by then
    sgd.zero_grad();
    reset_peak_stats();
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t before = memory_stats().allocated_bytes;
    // Copies made by this forward (after a skipped step the previous ones are still valid and
    // already counted in `before`).
    const int64_t copies_before = autocast_cache_stats().bytes;
    Tensor loss;
    {
      AutocastGuard amp(DType::f16, mode == Mode::Amp);
      loss = cross_entropy((*model)(x).to(DType::f32), y);
    }
    const int64_t after = memory_stats().allocated_bytes;
    const int64_t copies = autocast_cache_stats().bytes - copies_before;
    const double scale = scaler.get_scale();
    scaler.scale(loss).backward();
    const bool stepped = scaler.step(sgd);
    scaler.update();
    const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    m = {before, after - before - copies, copies, memory_stats().peak_allocated_bytes, sec, stepped, scale};
    std::fprintf(stderr, "  %s step %d: %.2f s, loss %.4f, scale %.0f, %s\n", mode_name(mode), s + 1, sec, loss.item(),
                 scale, stepped ? "stepped" : "skipped (non-finite gradients)");
  }
  return m;
}

double mib(int64_t b) { return static_cast<double>(b) / (1024.0 * 1024.0); }

}  // namespace
}  // namespace minidl

int main(int argc, char** argv) {
  using namespace minidl;
  CLI::App app{"Peak memory of a ResNet-50 training step: FP32 vs AMP vs pure f16 (CPU allocator statistics)"};
  std::vector<int64_t> batches{8};
  int64_t size = 224;
  int steps = 2;
  bool pure = true;
  // 65536 (PyTorch's default) overflows on the first steps of a freshly initialised ResNet-50 and
  // the scaler skips them; a measured step should be a real one (it creates the momentum buffers).
  double init_scale = 1024.0;
  app.add_option("--batch", batches, "batch sizes")->expected(1, 16);
  app.add_option("--size", size, "image side");
  app.add_option("--steps", steps, "training steps per run; the last one is measured")->check(CLI::Range(1, 100));
  app.add_flag("!--no-pure-f16", pure, "skip the pure-f16 run");
  app.add_option("--init-scale", init_scale, "GradScaler initial scale (AMP and pure f16)");
  CLI11_PARSE(app, argc, argv);

  std::printf("| batch | mode | before forward MiB | activations MiB | f16 weight copies MiB | peak allocated MiB "
              "| activations vs fp32 | peak vs fp32 | scale | measured step | step s |\n");
  std::printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
  for (int64_t b : batches) {
    std::vector<Mode> modes{Mode::Fp32, Mode::Amp};
    if (pure) modes.push_back(Mode::PureF16);
    Measure base;
    for (Mode mode : modes) {
      const Measure m = run(mode, b, size, steps, init_scale);
      if (mode == Mode::Fp32) base = m;
      std::printf("| %lld | %s | %.1f | %.1f | %.1f | %.1f | %.3f | %.3f | %.0f | %s | %.2f |\n",
                  static_cast<long long>(b), mode_name(mode), mib(m.before_forward), mib(m.activations),
                  mib(m.weight_copies), mib(m.peak),
                  static_cast<double>(m.activations) / static_cast<double>(base.activations),
                  static_cast<double>(m.peak) / static_cast<double>(base.peak), m.scale,
                  m.stepped ? "stepped" : "skipped", m.seconds);
      std::fflush(stdout);
    }
  }
  return 0;
}
