// minidl-gpumodel (emulated device): runs a few training steps at small shapes with the emulated
// device's counters on, extrapolates every launch to the requested shape and costs the step on a
// modelled H100 (docs/cuda/perfmodel.md). minidl-gpumodel-cuda (the same source
// against the real backend): times every launch of the same step with CUDA events and prints it
// beside the modelled table (--measure; the model phase of the lab's GPU check, lab/gpulab). On
// the emulator, --measure rehearses that path with the emulator's own (meaningless) times.
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>

#include "perfmodel/calibrate.h"
#include "perfmodel/step.h"
#include "perfmodel/train_step.h"
#include "core/error.h"
#include "kernels/cuda/runtime.h"

#ifdef MINIDL_CUDA_EMU
#include "perfmodel/emu_profile.h"
#include "perfmodel/extrapolate.h"
#include "perfmodel/report.h"
#endif

#ifndef MINIDL_KERNEL_RESOURCES_DIR
#define MINIDL_KERNEL_RESOURCES_DIR ""
#endif

namespace minidl::gpumodel {
namespace {

struct Size {
  int64_t batch = 0, image = 0;
};

Size parse_size(const std::string& s) {
  const size_t x = s.find('x');
  if (x == std::string::npos) throw UsageError("a size is BATCHxIMAGE, e.g. 2x64; got '" + s + "'");
  return {std::stoll(s.substr(0, x)), std::stoll(s.substr(x + 1))};
}

[[maybe_unused]] std::vector<Size> parse_sizes(const std::string& list) {
  std::vector<Size> out;
  std::istringstream is(list);
  for (std::string t; std::getline(is, t, ',');)
    if (!t.empty()) out.push_back(parse_size(t));
  return out;
}

// "resnet50-amp-nhwc" -> the step's configuration.
StepConfig parse_config(const std::string& name) {
  StepConfig c;
  std::istringstream is(name);
  std::string part;
  std::getline(is, c.model, '-');
  while (std::getline(is, part, '-')) {
    if (part == "amp") c.amp = true;
    else if (part == "bf16") c.amp = c.bf16 = true;
    else if (part == "fp32") c.amp = false;
    else if (part == "nhwc") c.nhwc = true;
    else if (part == "nchw") c.nhwc = false;
    else if (part == "chain") c.conv_bn_chain = true;
    else throw UsageError("--configs: '" + name + "': '" + part + "' is not amp, bf16, fp32, nhwc, nchw or chain");
  }
  if (c.model != "resnet50" && c.model != "smallcnn")
    throw UsageError("--configs: '" + name + "': the model is resnet50 or smallcnn");
  if (c.conv_bn_chain && c.model != "resnet50")
    throw UsageError("--configs: '" + name + "': 'chain' (the convolutions carry the batch norms) needs the ResNet");
  return c;
}

std::string title_of(const StepConfig& c, Size target) {
  return std::string(c.model == "resnet50" ? "ResNet-50" : "small CNN") + ", " + std::to_string(target.image) + "x" +
         std::to_string(target.image) + ", batch " + std::to_string(target.batch) + ", " + (!c.amp ? "FP32" : c.bf16 ? "AMP bf16" : "AMP") +
         ", " + (c.nhwc ? "channels-last (memory format, no transposes)" : "NCHW") +
         (c.conv_bn_chain ? ", batch norm carried by the convolutions (conv_bn_chain)" : "");
}

std::string config_key(const std::string& name, Size target) {
  return name + "-b" + std::to_string(target.batch) + "-i" + std::to_string(target.image);
}

// Saved profiles are the counters of one target (the grids were planned for it) and one mode (a
// graph replay runs other launches than the eager step).
[[maybe_unused]] std::string profile_label(const std::string& name, const StepConfig& c, Size target) {
  return config_key(name, target) + (c.graph ? "-graph" : "");
}

// The step runner, rebuilt when the small CNN needs another image size; a fresh one takes a
// warm-up step (optimizer state, AMP's first updates) before anything is measured.
class Stepper {
 public:
  explicit Stepper(StepConfig c) : c_(std::move(c)) {}
  TrainStep& at(Size s) {
    if (!step_ || (c_.model == "smallcnn" && step_->built_for() != s.image)) {
      step_ = std::make_unique<TrainStep>(c_, s.image, Device::cuda(0));
      step_->prepare(2, s.image);   // batch 2: a ResNet's last batch norm sees 1x1 pixels at 32 px
      for (int i = 0; i < 8; ++i) {
        step_->run();
        if (step_->last_stepped()) break;
      }
    }
    step_->prepare(s.batch, s.image);
    step_->ready();   // --mode graph: warm-up and capture here, so the profiled run() is one replay
    return *step_;
  }

 private:
  StepConfig c_;
  std::unique_ptr<TrainStep> step_;
};

// A kernel's raw counters, for --trace.
[[maybe_unused]] std::string counters_text(const Work& w) {
  if (w.kind != Work::Kind::Kernel) return "";
  std::string t;
  for (int f = 0; f < kKernelFields; ++f)
    if (w.v[static_cast<size_t>(f)] != 0)
      t += std::string(" ") + field_name(true, f) + "=" +
           std::to_string(static_cast<long long>(w.v[static_cast<size_t>(f)]));
  return t;
}

[[maybe_unused]] double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// ---- measure: every launch of the step timed with CUDA events, beside the modelled table ----
// Two passes over `steps` steps each. The first times the whole step (its wall on the GPU and the
// host's time in and between the calls) with ungated per-launch events. The second gates every
// launch (runtime.h, set_launch_gating): its events bracket the GPU's work alone, where the first
// pass's would also hold the host's time inside a call that the GPU waited for (an eager step is
// host-bound: a cuDNN legacy call takes 150-300 us of host time), so the per-launch table is the
// second's.
std::string measure(const std::string& name, const StepConfig& c, Size target, int warmup, int steps,
                    const std::string& modelled_tsv) {
  Stepper stepper(c);
  TrainStep& ts = stepper.at(target);
  for (int i = 0; i < warmup; ++i) ts.run();
  cuda::synchronize(0);
  cuda::take_launch_times();
  // host_ms, whole: the ungated pass's host and wall times (nullptr: not kept).
  auto timed_pass = [&](bool gated, double* host_ms, cuda::EventTimer* whole) {
    cuda::set_launch_gating(gated);
    cuda::set_launch_timing(true);
    for (int i = 0; i < steps; ++i) {
      if (whole != nullptr) whole->start();
      const auto h0 = std::chrono::steady_clock::now();
      ts.run();
      if (host_ms != nullptr)
        *host_ms += std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - h0).count();
      if (whole != nullptr) whole->stop();
    }
    cuda::synchronize(0);
    cuda::set_launch_timing(false);
    cuda::set_launch_gating(false);
    std::vector<TimedLaunch> timed;
    for (const cuda::LaunchTime& t : cuda::take_launch_times())
      timed.push_back({launch_key(t.op, t.kernel), t.ms, t.host_ms});
    return per_kernel_measured(timed, steps);
  };
  cuda::EventTimer whole(0);
  double host_ms = 0;
  const std::vector<MeasuredRow> host_rows = timed_pass(false, &host_ms, &whole);
  const size_t timeouts_before = cuda::launch_gate_timeouts();
  // An eager step only: a replay launches no timed calls.
  const std::vector<MeasuredRow> rows = c.graph ? host_rows : timed_pass(true, nullptr, nullptr);
  const size_t timeouts = cuda::launch_gate_timeouts() - timeouts_before;
  std::vector<ModelledRow> modelled;
  if (!modelled_tsv.empty()) {
    std::ifstream in(modelled_tsv);
    MINIDL_CHECK(in.good(), "gpumodel: cannot read the model table ", modelled_tsv);
    modelled = read_modelled(in, config_key(name, target));
  }
  std::ostringstream os;
  os << "### " << title_of(c, target) << ": modelled against measured (" << cuda::device_description(0)
     << "; cuDNN autotuning " << (cuda::cudnn_benchmark() ? "on" : "off") << ")\n\n";
  if (modelled.empty())
    os << "(no modelled rows for `" << config_key(name, target) << "`"
       << (modelled_tsv.empty() ? "" : " in " + modelled_tsv) << ")\n\n";
  if (!c.graph) {
    os << "Each launch's time is from gated steps (every launch held on the GPU until the host has enqueued "
          "it, so its events time the GPU alone); the step's wall and host times from as many ungated steps"
       << (timeouts > 0 ? "; " + std::to_string(timeouts) +
                              " gates opened by their timeout (a sync inside a timed call): those launches' "
                              "times hold host time"
                        : "")
       << ".\n\n";
  }
  const double wall_ms = whole.elapsed_seconds() * 1e3 / steps;
  os << comparison_table(modelled, rows, wall_ms, static_cast<double>(target.batch));
  // Eager steps only: a replay's host time is the graph launch.
  if (!c.graph) {
    os << "\nThe host's time in the ungated steps (steady clock; the scaler on the device, so no step waits "
          "for the GPU; each timed launch also records two events on the host):\n\n"
       << host_table(host_rows, host_ms / steps, wall_ms, 15, [&] {
            double us = 0;
            for (const MeasuredRow& r : rows) us += r.us;
            return timeouts == 0 ? us * 1e-3 : 0.0;   // a timed-out gate's launch holds host time
          }());
  }
  return os.str();
}

[[maybe_unused]] std::string today() {
  char b[32];
  const std::time_t t = std::time(nullptr);
  std::strftime(b, sizeof b, "%Y-%m-%d", std::gmtime(&t));
  return b;
}

#ifdef MINIDL_CUDA_EMU
// ---- model: counters at small sizes, extrapolated and costed ----
struct Modelled {
  std::string markdown, summary, tsv;
  std::vector<Work> launches;   // every sample's, for the resource table
};

Modelled model(const std::string& name, const StepConfig& c, Size target, const std::vector<Size>& samples,
               const std::vector<Size>& held_out, const std::vector<KernelResources>& table, LaunchMode mode,
               const ReportInfo& base, bool trace, const std::vector<StepProfile>& saved,
               const std::string& save_to, const H100Spec& spec) {
  Stepper stepper(c);
  auto profile = [&](Size s) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int attempt = 0; attempt < 4; ++attempt) {
      // Grids a heuristic sizes from the work are planned for the target, not this small size
      // (runtime.h, set_launch_plan_scale): every activation grows by this ratio exactly. The
      // scale holds from the warm-up on: in --mode graph the step is captured there, and a replay
      // launches the grids of its capture (GraphReplaysKeepTheGridsPlannedAtTheCapture).
      const double scale = static_cast<double>(target.batch * target.image * target.image) /
                           static_cast<double>(s.batch * s.image * s.image);
      struct Planned {
        explicit Planned(double k) { cuda::set_launch_plan_scale(std::max(k, 1.0)); }
        ~Planned() { cuda::set_launch_plan_scale(1.0); }
      } planned(scale);
      TrainStep& ts = stepper.at(s);
      StepProfile p = profile_on_emulator([&] { ts.run(); }, s.batch, s.image);
      if (ts.last_stepped()) {
        if (trace)
          for (const Work& w : p.work)
            std::fprintf(stderr, "    %s%s [%d threads] %s%s\n", w.key().c_str(), w.parameters.c_str(), w.block_threads,
                         w.shapes.c_str(), counters_text(w).c_str());
        std::fprintf(stderr, "  %s batch %lld image %lld: %zu launches and calls, %.0f s on the emulator\n",
                     name.c_str(), static_cast<long long>(s.batch), static_cast<long long>(s.image), p.work.size(),
                     seconds_since(t0));
        return p;
      }
    }
    throw Error("gpumodel: AMP skipped every update at batch " + std::to_string(s.batch));
  };
  Modelled out;
  // Saved profiles (--load-profiles) stand in for the emulated runs of the same sizes.
  auto get = [&](Size s) {
    for (const StepProfile& p : saved)
      if (p.batch == s.batch && p.image == s.image) return p;
    StepProfile p = profile(s);
    if (!save_to.empty()) {   // kept at once: an emulated ResNet-50 step takes minutes
      std::ofstream os(save_to, std::ios::app);
      write_profiles(os, profile_label(name, c, target), {p});
    }
    return p;
  };
  std::vector<StepProfile> fitted;
  for (Size s : samples) fitted.push_back(get(s));
  const Fit fit = fit_samples(fitted);
  ReportInfo info = base;
  info.title = title_of(c, target);
  info.images_per_step = static_cast<double>(target.batch);
  std::ostringstream samples_text;
  for (size_t i = 0; i < samples.size(); ++i)
    samples_text << (i ? ", " : "") << samples[i].batch << "x" << samples[i].image;
  info.samples = "batch x image " + samples_text.str() + " (counters fitted exactly in the terms " +
                 [&] {
                   std::string t;
                   for (const std::string& x : fit.terms) t += (t.empty() ? "" : ", ") + x;
                   return t;
                 }() +
                 ")";
  for (Size v : held_out) {
    // Costing saved profiles again: a held-out size that was not saved is not emulated now.
    const bool saved_v = std::any_of(saved.begin(), saved.end(),
                                     [&](const StepProfile& p) { return p.batch == v.batch && p.image == v.image; });
    if (!saved.empty() && !saved_v) continue;
    const StepProfile measured = get(v);
    const FitError e = compare(predict(fit, v.batch, v.image), measured);
    char line[512];
    std::snprintf(line, sizeof line,
                  "Held out, batch %lld x %lld px: %d of %d counters predicted exactly; step DRAM bytes off by "
                  "%.3f%%, library FLOPs by %.3f%%; the largest relative error %.2f%% (%s). ",
                  static_cast<long long>(v.batch), static_cast<long long>(v.image), e.exact_fields, e.fields,
                  100 * e.dram_bytes_relative, 100 * e.flops_relative, 100 * e.max_relative, e.worst.c_str());
    info.validation += line;
    for (const Work& w : measured.work) out.launches.push_back(w);
  }
  for (const StepProfile& p : fitted)
    for (const Work& w : p.work) out.launches.push_back(w);
  const ModelledStep m = model_step(predict(fit, target.batch, target.image), table, spec, mode);
  out.markdown = markdown_report(m, info, spec);
  out.summary = markdown_report(m, info, spec, 10);
  out.tsv = per_kernel_tsv(m, config_key(name, target));
  return out;
}

std::string spec_table(const H100Spec& s) {
  std::ostringstream os;
  os << "| figure | value | source |\n| --- | ---: | --- |\n";
  os << "| HBM bandwidth | " << s.hbm_bytes_per_s / 1e12 << " TB/s (x " << s.hbm_efficiency
     << " achievable) | datasheet; the efficiency is an assumption |\n";
  os << "| L2 | " << s.l2_bytes / 1e6 << " MB, " << s.l2_bytes_per_s / 1e12
     << " TB/s to the SMs | whitepaper; the bandwidth is an assumption |\n";
  os << "| resident warps per SM that keep HBM busy (fewer: a proportional share) | " << s.warps_to_saturate_hbm_per_sm
     << " of " << s.max_warps_per_sm << " | assumption |\n";
  os << "| FP16 / BF16 tensor, dense | " << s.f16_tensor_flops / 1e12
     << " TFLOPS | datasheet (half the sparse figure) |\n";
  os << "| TF32 tensor, dense | " << s.tf32_tensor_flops / 1e12 << " TFLOPS | datasheet (half the sparse figure) |\n";
  os << "| FP32 | " << s.fp32_flops / 1e12 << " TFLOPS | datasheet |\n";
  os << "| cuDNN / cuBLAS share of the peak | " << s.cudnn_efficiency << " / " << s.cublas_efficiency
     << " | assumption |\n";
  os << "| cuDNN's f16 convolutions on NCHW tensors, time against channels-last | x " << s.cudnn_f16_nchw_factor
     << " | measured (an H200, gated, ab67ceb; h100.h) |\n";
  os << "| launch, eager / in a CUDA graph | " << s.launch_eager_s * 1e6 << " / " << s.launch_graph_s * 1e6
     << " µs | assumption (h100.h says why) |\n";
  os << "| SMs, registers per SM, warps per SM, shared memory per SM | " << s.sms << ", " << s.regs_per_sm << ", "
     << s.max_warps_per_sm << ", " << s.smem_per_sm / 1024 << " KiB | datasheet, CUDA guide (cc 9.0) |\n";
  return os.str();
}
#endif

// The program's flags, registered by add_flags.
struct Options {
  std::string configs = "resnet50-amp";
  int64_t batch = 0, image = 0;
  std::string samples, validate, out, tsv, resources = MINIDL_KERNEL_RESOURCES_DIR, modelled_tsv, mode = "eager";
  std::string save_profiles, load_profiles;
  bool measure_mode = false, trace = false;
  std::string cudnn_benchmark = "on";
  int steps = 3, warmup = 2;
  std::string gpu = "h100";
};

void add_flags(CLI::App& app, Options& o) {
  app.add_option("--configs", o.configs,
                 "comma-separated MODEL-PRECISION[-nhwc][-chain]: resnet50-amp, resnet50-fp32-nhwc, smallcnn-fp32, "
                 "resnet50-bf16-nhwc (bf16 autocast, no gradient scaler), resnet50-amp-nhwc-chain (chain: the "
                 "convolutions carry the batch norms, cuDNN's fused graphs), ...");
  app.add_option("--batch", o.batch, "target batch (default: resnet50 256, smallcnn 64)");
  app.add_option("--image", o.image, "target image side in pixels (default: resnet50 224, smallcnn 200)");
  app.add_option("--samples", o.samples,
                 "the small sizes to run, BATCHxIMAGE,... (default: resnet50 2x64,3x64,2x96, fitting 1, N and "
                 "N*S^2, since every ResNet-50 counter is weights or activations; at 32 px its last stage is 1x1 "
                 "and the average pool takes another path; "
                 "smallcnn 2x16,3x16,2x24,3x24,2x32,3x32; "
                 "batch 1 takes other code paths, e.g. broadcasts)");
  app.add_option("--validate", o.validate,
                 "held-out sizes predicted and compared (default: resnet50 4x64, smallcnn 4x24; "
                                         "'none' to skip)");
  app.add_option("--mode", o.mode,
                 "eager, or graph: the step captured into a CUDA graph once per shape and replayed, each launch "
                 "at the graph's launch cost")->check(CLI::IsMember({"eager", "graph"}));
#ifdef MINIDL_CUDA_EMU
  app.add_option("--gpu", o.gpu,
                 "the modelled chip: h100 (H100 SXM, 3.35 TB/s of HBM3) or h200 (the same processor, 4.8 TB/s of "
                 "HBM3e); perfmodel/h100.h")
      ->check(CLI::IsMember({"h100", "h200"}))
      ->capture_default_str();
#endif
  app.add_option("--resources", o.resources, "folder of ptxas reports (the build's kernel_resources/)");
  app.add_option("--out", o.out, "write the full markdown tables here");
  app.add_option("--tsv", o.tsv, "write the per-kernel modelled times here (the calibration's input)");
  app.add_option("--save-profiles", o.save_profiles, "keep every emulated step's counters in this file");
  app.add_option("--load-profiles", o.load_profiles,
                 "use the counters saved by --save-profiles instead of emulating the same sizes again");
  app.add_flag("--trace", o.trace, "print every sample's launches and calls (stderr)");
  app.add_flag("--measure", o.measure_mode, "time every launch of the step at the target size instead of modelling it");
  app.add_option("--modelled", o.modelled_tsv, "with --measure: the model's TSV to compare with");
  app.add_option("--steps", o.steps, "with --measure: timed steps (after the warm-up)");
  app.add_option("--warmup", o.warmup, "with --measure: untimed steps first");
  app.add_option("--cudnn-benchmark", o.cudnn_benchmark,
                 "with --measure: on, cuDNN autotuning as the step runs of the lab's GPU check and PyTorch's "
                 "cudnn.benchmark use it (the warm-up steps pay for it); off, cuDNN's heuristic choice")
      ->check(CLI::IsMember({"on", "off"}))
      ->capture_default_str();
}

int run(int argc, char** argv) {
  CLI::App app{"minidl-gpumodel: a training step's time on an H100, modelled from the emulated device's counters "
               "(or, built against CUDA, measured per launch)"};
  Options o;
  add_flags(app, o);
  CLI11_PARSE(app, argc, argv);
#ifdef MINIDL_CUDA_EMU
  const H100Spec spec = o.gpu == "h200" ? h200_spec() : H100Spec{};
#endif

  std::vector<std::string> names;
  {
    std::istringstream is(o.configs);
    for (std::string t; std::getline(is, t, ',');)
      if (!t.empty()) names.push_back(t);
  }
  std::ostringstream md, summary, tsv_text;
#ifdef MINIDL_CUDA_EMU
  const std::vector<KernelResources> table = load_kernel_resources(o.resources);
  if (!o.measure_mode && table.empty())
    std::fprintf(stderr, "minidl-gpumodel: no ptxas reports in '%s': occupancy assumes 32 registers (marked ?)\n",
                 o.resources.c_str());
  std::vector<Work> all_launches;
  ReportInfo base;
  base.date = today();
#else
  if (!o.measure_mode)
    throw UsageError("minidl-gpumodel-cuda only measures (--measure); the model runs on the emulated device "
                     "(minidl-gpumodel)");
#endif
  for (const std::string& name : names) {
    StepConfig c = parse_config(name);
    // --mode graph models the step as a CUDA graph replays it: captured once per shape (with the
    // scaler's device state) and each profiled step a replay, every launch at the graph's cost.
    // --measure times the eager step's launches.
    c.graph = o.mode == "graph" && !o.measure_mode;
    const bool resnet = c.model == "resnet50";
    const Size target{o.batch > 0 ? o.batch : (resnet ? 256 : 64), o.image > 0 ? o.image : (resnet ? 224 : 200)};
    if (o.measure_mode) {
      cuda::set_cudnn_benchmark(o.cudnn_benchmark == "on");
      c.device_scaler = true;
      const std::string m = measure(name, c, target, o.warmup, o.steps, o.modelled_tsv);
      std::cout << m << "\n";
      md << m << "\n";
      continue;
    }
#ifdef MINIDL_CUDA_EMU
    const std::vector<Size> s =
        parse_sizes(!o.samples.empty() ? o.samples : resnet ? "2x64,3x64,2x96" : "2x16,3x16,2x24,3x24,2x32,3x32");
    const std::vector<Size> v =
        o.validate == "none" ? std::vector<Size>{} : parse_sizes(!o.validate.empty() ? o.validate : resnet ? "4x64" : "4x24");
    std::fprintf(stderr, "minidl-gpumodel: %s\n", name.c_str());
    std::vector<StepProfile> saved;
    if (!o.load_profiles.empty()) {
      std::ifstream in(o.load_profiles);
      MINIDL_CHECK(in.good(), "gpumodel: cannot read ", o.load_profiles);
      saved = read_profiles(in, profile_label(name, c, target));
    }
    const Modelled r = model(name, c, target, s, v, table, o.mode == "graph" ? LaunchMode::Graph : LaunchMode::Eager,
                             base, o.trace, saved, o.save_profiles, spec);
    md << r.markdown << "\n";
    summary << r.summary << "\n";
    tsv_text << r.tsv;
    all_launches.insert(all_launches.end(), r.launches.begin(), r.launches.end());
#endif
  }
#ifdef MINIDL_CUDA_EMU
  if (!o.measure_mode) {
    std::ostringstream doc;
    doc << "# " << (o.gpu == "h200" ? "H200" : "H100") << " step-time model (modelled: no GPU ran any of this), "
        << base.date << "\n\n"
        << "Every time, rate and byte count below is **modelled** from the emulated device's per-launch counters "
           "(docs/cuda/perfmodel.md), launch cost " << o.mode << ".\n\n"
        << "## The modelled " << spec.name << " (perfmodel/h100.h)\n\n" << spec_table(spec) << "\n"
        << "## Steps\n\n" << md.str()
        << "## ptxas resources (sm_90) and theoretical occupancy at each launch configuration\n\n"
        << resource_table(table, all_launches, spec);
    if (!o.out.empty()) std::ofstream(o.out) << doc.str();
    // The first line labels the table (calibrate.cpp's reader keeps only rows of its configuration).
    if (!o.tsv.empty())
      std::ofstream(o.tsv) << "# modelled, not measured: per-kernel step times of the " << spec.name
                         << " from the step-time model on the emulated device (no GPU ran any of this), "
                         << base.date << ", launch cost " << o.mode << "\n"
                         << tsv_text.str();
    std::cout << summary.str();
    return 0;
  }
#endif
  if (!o.out.empty()) std::ofstream(o.out) << md.str();
  return 0;
}

}  // namespace
}  // namespace minidl::gpumodel

int main(int argc, char** argv) {
  try {
    return minidl::gpumodel::run(argc, argv);
  } catch (const minidl::gpumodel::UsageError& e) {
    std::fprintf(stderr, "minidl-gpumodel: %s\n", e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "minidl-gpumodel: %s\n", e.what());
    return 1;
  }
}
