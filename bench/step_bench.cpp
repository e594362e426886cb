// minidl_bench_step: images/s of whole training steps (forward, loss, backward, the optimizer's step,
// and the gradient scaler under AMP) on one device-resident batch, the measurement a GPU session compares
// with PyTorch's best eager loop (bench/pytorch_step.py, same model, batch, optimizer and
// precision). The model, loss, optimizer and step are the trainer library's (train/step.h), so the
// step is the one minidl-train runs, minus the data loader.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <memory>
#include <string>

#include "core/allocator.h"
#include "core/backend.h"
#include "core/ops.h"
#include "train/config.h"
#include "train/model.h"
#include "experiments/harness/results.h"
#include "train/run.h"
#include "train/step.h"
#include "optim/grad_scaler.h"
#ifdef MINIDL_WITH_CUDA
#include "kernels/cuda/runtime.h"
#endif

namespace {
using namespace minidl;
using namespace minidl::harness;

struct StepOptions {
  std::string precision = "amp";   // amp | amp-bf16 | tf32 | fp32
  bool channels_last = false;
  int warmup = 10;
  double seconds = 30.0;
  int64_t max_steps = 0;
  std::string json;
  bool cuda_graphs = false;
  bool host_scaler = false;
  bool conv_bn_chain = false;
};

// The TF32 and layout switches of a precision mode, as PyTorch's flags of the same names.
void apply_precision(const StepOptions& o, Device d) {
#ifdef MINIDL_WITH_CUDA
  if (d.is_cuda()) {
    cuda::set_allow_tf32_matmul(o.precision == "tf32");
    cuda::set_allow_tf32_cudnn(o.precision != "fp32");
  }
#else
  (void)d;
#endif
  if (!d.is_cuda() && o.precision == "tf32")
    std::fprintf(stderr, "minidl_bench_step: --precision tf32 only changes CUDA runs\n");
}

void check(const TrainConfig& c, const StepOptions& o, Device dev) {
  if (o.precision != "amp" && o.precision != "amp-bf16" && o.precision != "tf32" && o.precision != "fp32")
    throw UsageError("--precision must be amp, amp-bf16, tf32 or fp32, got '" + o.precision + "'");
  if (o.cuda_graphs) {
    if (!dev.is_cuda()) throw UsageError("--cuda-graphs needs a CUDA device, got " + dev.str());
    if (o.host_scaler) throw UsageError("--cuda-graphs keeps the scaler on the device; drop --host-scaler");
  }
  if (c.accumulation_steps < 1)
    throw UsageError("--accumulation-steps must be at least 1, got " + std::to_string(c.accumulation_steps));
}

// What the timed steps measured.
struct Timing {
  int64_t steps = 0, skipped = 0;
  double seconds = 0, host_seconds = 0, warmup_seconds = 0;
  double loss = 0;              // the last micro-batch's, read after the timing
  int64_t optimizer_steps = 0;  // updates taken by then, warm-up included
};

void print_and_save(const TrainConfig& c, const StepOptions& o, Device dev, const optim::GradScaler& scaler,
                    const Timing& t, const train::GraphedStep* graphed) {
  const int64_t images_per_step = c.batch_size * c.accumulation_steps;
  const double ips = static_cast<double>(t.steps * images_per_step) / t.seconds;
  const auto ms = memory_stats(dev);
  const std::string acc = c.accumulation_steps > 1 ? " x " + std::to_string(c.accumulation_steps) + " accumulated" : "";
  std::printf("minidl %s batch %lld%s %dpx %s %s%s%s%s: %.1f images/s (%lld steps in %.2f s after %d warm-up steps in "
              "%.1f s; %lld skipped by the %s; host %.1f of %.1f ms a step; peak allocated %s, reserved %s; loss %.4f "
              "after %lld updates)\n",
              c.model.c_str(), static_cast<long long>(c.batch_size), acc.c_str(),
              static_cast<int>(c.resolved_image_size()), o.precision.c_str(), c.optimizer.c_str(),
              o.channels_last ? " channels-last" : "", graphed ? " cuda-graphs" : "", o.conv_bn_chain ? " conv-bn-chain" : "",
              ips, static_cast<long long>(t.steps), t.seconds, o.warmup, t.warmup_seconds,
              static_cast<long long>(t.skipped),
              !scaler.is_enabled()     ? "scaler (none: no loss scaling)"
              : scaler.device_state() ? "device's scaler"
                                      : "host's scaler",
              1e3 * t.host_seconds / static_cast<double>(t.steps), 1e3 * t.seconds / static_cast<double>(t.steps),
              format_bytes(static_cast<size_t>(ms.peak_allocated_bytes)).c_str(),
              format_bytes(static_cast<size_t>(ms.peak_reserved_bytes)).c_str(), t.loss,
              static_cast<long long>(t.optimizer_steps));
  if (o.json.empty()) return;
  nlohmann::json j = provenance(device_description(dev));
  j["program"] = "minidl_bench_step";
  j["framework"] = "minidl";
  j["model"] = c.model;
  j["image_size"] = c.resolved_image_size();
  j["batch"] = c.batch_size;
  j["accumulation_steps"] = c.accumulation_steps;
  j["precision"] = o.precision;
  j["channels_last"] = o.channels_last;
  j["cuda_graphs"] = o.cuda_graphs;
  if (graphed) j["graph_replays"] = graphed->replays(), j["graph_captures"] = graphed->captures();
  j["conv_bn_chain"] = o.conv_bn_chain;
  j["scaler"] = !scaler.is_enabled() ? "off" : scaler.device_state() ? "device" : "host";
  j["cudnn_benchmark"] = c.cudnn_benchmark;
  j["optimizer"] = {{"name", c.optimizer}, {"lr", c.resolved_lr()}, {"momentum", c.momentum},
                    {"weight_decay", c.resolved_weight_decay()}};
  j["warmup_steps"] = o.warmup;
  j["warmup_seconds"] = t.warmup_seconds;
  j["steps"] = t.steps;
  j["seconds"] = t.seconds;
  j["host_seconds"] = t.host_seconds;
  j["images_per_s"] = ips;
  j["skipped_steps"] = t.skipped;
  j["loss"] = t.loss;
  j["optimizer_steps"] = t.optimizer_steps;
  j["peak_allocated_bytes"] = ms.peak_allocated_bytes;
  j["peak_reserved_bytes"] = ms.peak_reserved_bytes;
  write_file_atomic(o.json, j.dump(2) + "\n");
}

int run(TrainConfig& c, const StepOptions& o) {
  c.amp = o.precision == "amp" || o.precision == "amp-bf16";
  c.amp_dtype = o.precision == "amp-bf16" ? "bf16" : "f16";
  c.channels_last = o.channels_last;   // weights (make_model) and the batch below
  c.cuda_graphs = false;   // the bench's own switch below: graphs required, not where they fit
  validate(c);
  const Device dev = resolve_device(c.device);
  check(c, o, dev);
  apply_backend_switches(c, dev);
  apply_precision(o, dev);

  Model m = make_model(c, c.seed * 4 + 3);
  if (o.conv_bn_chain) {
    if (!m.resnet) throw UsageError("--conv-bn-chain needs a ResNet model (its blocks carry the chain), got " + c.model);
    m.resnet->set_conv_bn_chain(true);
  }
  m.module->to(dev);
  m.module->train();
  auto opt = make_optimizer(c, *m.module, c.resolved_lr());
  optim::GradScaler scaler({.init_scale = c.amp_init_scale, .enabled = c.uses_grad_scaler()});
  const TensorOptions fo{DType::f32, dev, false};
  Tensor x = randn(m.input_shape(c.batch_size), fo);
  if (o.channels_last) x = to_channels_last(x);   // as the loader writes it: no conversion per step
  const Tensor labels = gt(rand({c.batch_size}, fo), full({1}, 0.5, fo)).to(DType::i64);
  // minidl-train's step (train/step.h); --cuda-graphs: its graphed step (train/graphed_step.h), which
  // steps eagerly until the optimizer has really stepped, then captures a micro-batch (with
  // accumulation, one that adds its gradients and one that steps) and replays it, checking each
  // batch's labels and reading the scaler's skip flag on the host as training does.
  Step train_step(m, *opt, scaler, {}, o.cuda_graphs, dev);
  train_step.set_accumulation(c.accumulation_steps);
  Timing t;
  Tensor last_loss;
  auto step = [&] {   // one optimizer step: the window's micro-batches
    bool stepped = false;
    for (int64_t k = 0; k < c.accumulation_steps; ++k) {
      const optim::MicroBatch mb{.loss_weight = 1.0 / static_cast<double>(c.accumulation_steps),
                                 .steps = k + 1 == c.accumulation_steps, .samples = c.batch_size};
      const Step::Forward f = train_step.run(x, labels, mb);
      stepped = f.stepped;
      last_loss = f.loss;
    }
    t.skipped += stepped ? 0 : 1;
  };

  using Clock = std::chrono::steady_clock;
  const auto w0 = Clock::now();
  for (int i = 0; i < o.warmup; ++i) step();   // cuDNN autotuning, allocator growth, the scaler's first skips
  for (int i = 0; i < 40 && opt->step_count() == 0; ++i) step();   // one real update (AMP skips the first ones)
  if (const train::GraphedStep* g = train_step.graphed()) {
    for (int i = 0; i < 4 && g->replays() == 0; ++i) step();   // the capture happens before the timing
    if (g->replays() == 0) throw Error("--cuda-graphs: no replay after the warm-up (the step never captured)");
  } else if (scaler.is_enabled() && dev.is_cuda() && !o.host_scaler) {
    // Eager CUDA AMP: the scaler's device state (no host sync in a step: the fused SGD and Adam
    // kernels read the found-inf flag and skip on it, as PyTorch's fused optimizers do under its
    // GradScaler), and the optimizer's with it; --host-scaler keeps the decision on the host.
    scaler.to_device_state(dev);
    opt->to_device_state(dev);
  }
  synchronize(dev);
  t.warmup_seconds = std::chrono::duration<double>(Clock::now() - w0).count();
  reset_peak_stats(dev);
  t.skipped = 0;
  const auto t0 = Clock::now();
  while ((o.max_steps == 0 || t.steps < o.max_steps) &&
         (t.steps == 0 || std::chrono::duration<double>(Clock::now() - t0).count() < o.seconds)) {
    const auto h0 = Clock::now();
    step();
    // The host's time inside the steps' calls: close to the wall time per step when the host, not
    // the GPU, sets the pace (launch overhead, library calls, a sync a step).
    t.host_seconds += std::chrono::duration<double>(Clock::now() - h0).count();
    ++t.steps;
  }
  synchronize(dev);   // the host runs ahead of a GPU: the span ends when the last step's kernels do
  t.seconds = std::chrono::duration<double>(Clock::now() - t0).count();
  // Eager device-state steps skip on the device: only the last one's verdict is known (read after
  // the timing). Graphed steps read each verdict, as training does.
  if (scaler.device_state() && !train_step.graphed()) t.skipped = scaler.device_found_inf().item() != 0.0 ? -1 : 0;
  t.loss = last_loss.item();   // the same batch every step: how far the steps fitted it (compare precisions)
  t.optimizer_steps = opt->step_count();
  print_and_save(c, o, dev, scaler, t, train_step.graphed());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  TrainConfig c;
  // The utilization study's optimizer (SGD lr 0.001, momentum 0.9, no weight decay), as
  // bench/pytorch_step.py (and bench/pytorch_utilization.py) use it.
  c.model = "resnet50";
  c.batch_size = 128;
  c.momentum = 0.9;
  c.lr = 0.001;
  c.weight_decay = 0.0;
  c.device = "cuda";
  StepOptions o;
  CLI::App app{"minidl_bench_step: images/s of whole training steps on one device-resident batch "
               "(compare: bench/pytorch_step.py)"};
  app.add_option("--model", c.model, "smallcnn, resnet18/34/50, resnet18-small/34-small/50-small")->capture_default_str();
  app.add_option("--image-size", c.image_size, "input side; 0: the model's default")->capture_default_str();
  app.add_option("--batch", c.batch_size, "batch size")->capture_default_str();
  app.add_option("--device", c.device, "cuda, cuda:N or cpu")->capture_default_str();
  app.add_option("--precision", o.precision,
                 "amp (f16 autocast + gradient scaler; the f32 parts as PyTorch's defaults: TF32 convolutions), "
                 "amp-bf16 (bf16 autocast, no scaler), tf32 (f32 with TF32 GEMMs and convolutions) or fp32 (no TF32 "
                 "anywhere)")
      ->capture_default_str();
  app.add_flag("--channels-last", o.channels_last, "channels-last (NHWC) weights and batch, kept end to end");
  app.add_flag("--cuda-graphs", o.cuda_graphs,
               "minidl-train's graphed step: eager until the optimizer has really stepped, then each micro-batch "
               "replayed from its captured graph (any optimizer and accumulation; the labels checked and the "
               "scaler's skip flag read on the host every step, as training does)");
  app.add_flag("--conv-bn-chain", o.conv_bn_chain,
               "ResNets: each convolution also sums its output's batch-norm statistics and the next one applies "
               "the normalization and ReLU to its input (cuDNN's fused graphs on a GPU; docs/conv_bn.md)");
  app.add_flag("--host-scaler", o.host_scaler,
               "AMP: the gradient scaler decides on the host (reads the found-inf flag every step, a sync); "
               "default on CUDA with SGD: on the device, as PyTorch's fused SGD (skipped_steps is then -1 if the "
               "last step skipped, else 0)");
  app.add_option("--cudnn-benchmark", c.cudnn_benchmark, "on: cuDNN autotuning (as torch.backends.cudnn.benchmark)")
      ->capture_default_str();
  app.add_option("--optimizer", c.optimizer, "sgd, adam or adamw")->capture_default_str();
  app.add_option("--accumulation-steps", c.accumulation_steps,
                 "micro-batches of --batch per optimizer step; images/s counts all of them")
      ->capture_default_str();
  app.add_option("--lr", c.lr, "learning rate")->capture_default_str();
  app.add_option("--momentum", c.momentum, "SGD momentum")->capture_default_str();
  app.add_option("--weight-decay", c.weight_decay, "SGD weight decay")->capture_default_str();
  app.add_option("--warmup", o.warmup, "untimed steps first")->capture_default_str();
  app.add_option("--seconds", o.seconds, "time steps for about this long (at least one step)")->capture_default_str();
  app.add_option("--max-steps", o.max_steps, "stop after this many timed steps; 0: only --seconds")->capture_default_str();
  app.add_option("--seed", c.seed, "initialisation seed")->capture_default_str();
  app.add_option("--json", o.json, "also write the result (with provenance) to this JSON file");
  if (const int rc = parse_command_line(app, argc, argv, "minidl_bench_step"); rc >= 0) return rc;
  try {
    return run(c, o);
  } catch (const UsageError& e) {
    std::fprintf(stderr, "minidl_bench_step: error: %s\n", user_message(e, false).c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "minidl_bench_step: %s\n", user_message(e, true).c_str());
    return 1;
  }
}
