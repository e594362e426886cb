// minidl_bench_step: images/s of whole training steps (forward, loss, backward, SGD step, and the
// gradient scaler under AMP) on one device-resident batch, the measurement a GPU session compares
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

int run(TrainConfig& c, const StepOptions& o) {
  if (o.precision != "amp" && o.precision != "amp-bf16" && o.precision != "tf32" && o.precision != "fp32")
    throw UsageError("--precision must be amp, amp-bf16, tf32 or fp32, got '" + o.precision + "'");
  c.amp = o.precision == "amp" || o.precision == "amp-bf16";
  c.amp_dtype = o.precision == "amp-bf16" ? "bf16" : "f16";
  c.channels_last = o.channels_last;   // weights (make_model) and the batch below
  validate(c);
  const Device dev = resolve_device(c.device);
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
  int64_t skipped = 0;
  Step train_step(m, *opt, scaler);   // minidl-train's step (train/step.h)
  auto step = [&] { skipped += train_step.run(x, labels).stepped ? 0 : 1; };

  using Clock = std::chrono::steady_clock;
  const auto w0 = Clock::now();
  for (int i = 0; i < o.warmup; ++i) step();   // cuDNN autotuning, allocator growth, the scaler's first skips
  // --cuda-graphs: the step captured once (docs/cuda/graphs.md) after the optimizer really
  // stepped (its momentum buffers or Adam's moments exist: AMP's first steps are often skipped),
  // then replayed. The scaler's device state (no host sync in a step: the fused SGD and Adam kernels
  // read the found-inf flag and skip on it, as PyTorch's fused optimizers do under its GradScaler)
  // for graphs, and by default for eager CUDA AMP; --host-scaler keeps the decision on the host (a
  // sync a step). The optimizer's device state with it: its rate and Adam's step counts on the GPU.
  const bool device_scaler = scaler.is_enabled() && dev.is_cuda() && !o.host_scaler;
  if (o.cuda_graphs) {
    if (!dev.is_cuda()) throw UsageError("--cuda-graphs needs a CUDA device, got " + dev.str());
    if (o.host_scaler) throw UsageError("--cuda-graphs keeps the scaler on the device; drop --host-scaler");
  }
  std::unique_ptr<Backend::Graph> graph;
  if (o.cuda_graphs || device_scaler) {
    for (int i = 0; i < 40 && opt->step_count() == 0; ++i) step();
    if (scaler.is_enabled()) scaler.to_device_state(dev);
    opt->to_device_state(dev);
  }
  if (o.cuda_graphs) graph = backend(dev).capture_graph(dev.index, step);
  synchronize(dev);
  const double warmup_s = std::chrono::duration<double>(Clock::now() - w0).count();
  reset_peak_stats(dev);
  skipped = 0;
  int64_t steps = 0;
  // The host's time inside the steps' calls: close to the wall time per step when the host, not
  // the GPU, sets the pace (launch overhead, library calls, a sync a step).
  double host_s = 0;
  const auto t0 = Clock::now();
  while ((o.max_steps == 0 || steps < o.max_steps) &&
         (steps == 0 || std::chrono::duration<double>(Clock::now() - t0).count() < o.seconds)) {
    const auto h0 = Clock::now();
    if (graph) graph->replay();
    else step();
    host_s += std::chrono::duration<double>(Clock::now() - h0).count();
    ++steps;
  }
  synchronize(dev);   // the host runs ahead of a GPU: the span ends when the last step's kernels do
  const double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  const double ips = static_cast<double>(steps * c.batch_size) / secs;
  const auto ms = memory_stats(dev);
  // Device-state steps skip on the device: only the last one's verdict is known (read after the
  // timing).
  if (scaler.device_state()) skipped = scaler.device_found_inf().item() != 0.0 ? -1 : 0;
  std::printf("minidl %s batch %lld %dpx %s%s%s%s: %.1f images/s (%lld steps in %.2f s after %d warm-up steps in %.1f s; "
              "%lld skipped by the %s; host %.1f of %.1f ms a step; peak allocated %s, reserved %s%s)\n",
              c.model.c_str(), static_cast<long long>(c.batch_size), static_cast<int>(c.resolved_image_size()),
              o.precision.c_str(), o.channels_last ? " channels-last" : "", graph ? " cuda-graphs" : "",
              o.conv_bn_chain ? " conv-bn-chain" : "", ips,
              static_cast<long long>(steps), secs,
              o.warmup, warmup_s, static_cast<long long>(skipped),
              !scaler.is_enabled()     ? "scaler (none: no loss scaling)"
              : scaler.device_state() ? "device's scaler"
                                      : "host's scaler",
              1e3 * host_s / static_cast<double>(steps), 1e3 * secs / static_cast<double>(steps),
              format_bytes(static_cast<size_t>(ms.peak_allocated_bytes)).c_str(),
              format_bytes(static_cast<size_t>(ms.peak_reserved_bytes)).c_str(),
              graph ? " (the graph's private pool, made at the capture, is reserved, not allocated)" : "");
  if (!o.json.empty()) {
    nlohmann::json j = provenance(device_description(dev));
    j["program"] = "minidl_bench_step";
    j["framework"] = "minidl";
    j["model"] = c.model;
    j["image_size"] = c.resolved_image_size();
    j["batch"] = c.batch_size;
    j["precision"] = o.precision;
    j["channels_last"] = o.channels_last;
    j["cuda_graphs"] = o.cuda_graphs;
    j["conv_bn_chain"] = o.conv_bn_chain;
    j["scaler"] = !scaler.is_enabled() ? "off" : scaler.device_state() ? "device" : "host";
    j["cudnn_benchmark"] = c.cudnn_benchmark;
    j["optimizer"] = {{"name", c.optimizer}, {"lr", c.resolved_lr()}, {"momentum", c.momentum},
                      {"weight_decay", c.resolved_weight_decay()}};
    j["warmup_steps"] = o.warmup;
    j["warmup_seconds"] = warmup_s;
    j["steps"] = steps;
    j["seconds"] = secs;
    j["host_seconds"] = host_s;
    j["images_per_s"] = ips;
    j["skipped_steps"] = skipped;
    j["peak_allocated_bytes"] = ms.peak_allocated_bytes;
    j["peak_reserved_bytes"] = ms.peak_reserved_bytes;
    write_file_atomic(o.json, j.dump(2) + "\n");
  }
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
               "capture the step into a CUDA graph after the warm-up and replay it (SGD; AMP with the scaler's "
               "device state; skipped_steps is then -1 if the last replay skipped, else 0)");
  app.add_flag("--conv-bn-chain", o.conv_bn_chain,
               "ResNets: each convolution also sums its output's batch-norm statistics and the next one applies "
               "the normalization and ReLU to its input (cuDNN's fused graphs on a GPU; docs/conv_bn.md)");
  app.add_flag("--host-scaler", o.host_scaler,
               "AMP: the gradient scaler decides on the host (reads the found-inf flag every step, a sync); "
               "default on CUDA with SGD: on the device, as PyTorch's fused SGD (skipped_steps is then -1 if the "
               "last step skipped, else 0)");
  app.add_option("--cudnn-benchmark", c.cudnn_benchmark, "on: cuDNN autotuning (as torch.backends.cudnn.benchmark)")
      ->capture_default_str();
  app.add_option("--lr", c.lr, "SGD learning rate")->capture_default_str();
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
