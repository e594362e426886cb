// The recomputation measurement: for each mode (none, stages, sequential:N, optimal),
// the largest batch whose full training step (forward, loss, backward, SGD momentum step) fits a
// fixed allocator budget, and the time per image there and at the baseline's largest batch.
// A bisection over batch sizes, not a Google Benchmark: one number per mode, with OOMs caught.
#include <CLI/CLI.hpp>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "core/allocator.h"
#include "core/autograd.h"
#include "core/backend.h"
#include "core/error.h"
#include "core/generator.h"
#include "core/ops.h"
#include "nn/recompute.h"
#include "nn/resnet.h"
#include "optim/sgd.h"

namespace minidl {
namespace {

struct Setup {
  std::string model = "resnet18";
  std::string device = "cpu";
  int64_t image_size = 16;
  bool small_input = true;
  std::string budget = "152MiB";
  std::vector<std::string> modes{"none", "stages", "sequential:2", "sequential:4", "sequential:8", "optimal"};
  int64_t max_batch = 1024;
  int repeats = 3;
};

struct Trainer {
  Device dev;
  std::shared_ptr<nn::ResNet> model;
  std::unique_ptr<optim::SGD> opt;
};

// Seconds of CPU used by the whole process (all threads): on a CPU shared with other jobs it
// moves much less than wall time, so CPU-device slowdowns are compared with it.
double cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto sec = [](const timeval& tv) { return static_cast<double>(tv.tv_sec) + 1e-6 * static_cast<double>(tv.tv_usec); };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

struct StepTime {
  double wall = -1.0, cpu = -1.0;  // seconds per image; -1: the batch does not fit
};

void sync(const Tensor& t) {
  if (t.device().is_cuda()) (void)t.detach().to(Device::cpu());
}

// One training step at `batch`; false when the allocator refuses it (the step's tensors are then
// freed and the statistics return to where they were).
bool step(Trainer& t, const nn::RecomputeMode& mode, int64_t batch, int64_t hw, double* seconds = nullptr,
          std::string* plan = nullptr) {
  Generator data(static_cast<uint64_t>(batch));
  try {
    const Tensor x = randn({batch, 3, hw, hw}, {}, &data).to(t.dev);
    std::vector<double> labels(static_cast<size_t>(batch));
    for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<double>(i % 2);
    const Tensor y = from_vector(labels, {batch}, {.dtype = DType::i64}).to(t.dev);
    nn::Recomputer rc(*t.model, mode);  // optimal: profiled at this batch, limit from the budget
    t.model->zero_grad();
    const auto t0 = std::chrono::steady_clock::now();
    Tensor loss = cross_entropy(rc.forward(x), y);
    loss.backward();
    t.opt->step();
    sync(loss);
    if (seconds) *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (plan) *plan = rc.describe();
    return true;
  } catch (const OutOfMemoryError&) {
    t.model->zero_grad();
    return false;
  }
}

// One mode at one batch, ready to time: its data and its Recomputer (for optimal, the first step
// profiles and plans, so it is the warm-up).
class Runner {
 public:
  Runner(Trainer& t, const nn::RecomputeMode& mode, int64_t batch, int64_t hw) : t_(t), rc_(*t.model, mode), batch_(batch) {
    Generator data(7);
    x_ = randn({batch, 3, hw, hw}, {}, &data).to(t.dev);
    std::vector<double> labels(static_cast<size_t>(batch));
    for (size_t i = 0; i < labels.size(); ++i) labels[i] = static_cast<double>(i % 2);
    y_ = from_vector(labels, {batch}, {.dtype = DType::i64}).to(t.dev);
  }
  // Seconds per image of one step, wall and process CPU. Throws OutOfMemoryError.
  StepTime once() {
    t_.model->zero_grad();
    const auto t0 = std::chrono::steady_clock::now();
    const double c0 = cpu_seconds();
    Tensor loss = cross_entropy(rc_.forward(x_), y_);
    loss.backward();
    t_.opt->step();
    sync(loss);
    const double n = static_cast<double>(batch_);
    return {std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / n,
            (cpu_seconds() - c0) / n};
  }

 private:
  Trainer& t_;
  nn::Recomputer rc_;
  int64_t batch_;
  Tensor x_, y_;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? -1.0 : v[v.size() / 2];
}

// Median seconds per image after one warm-up step; -1 when the batch does not fit.
StepTime time_step(Trainer& t, const nn::RecomputeMode& mode, int64_t batch, int64_t hw, int repeats) try {
  Runner r(t, mode, batch, hw);
  (void)r.once();
  std::vector<double> walls, cpus;
  for (int i = 0; i < repeats; ++i) {
    const StepTime st = r.once();
    walls.push_back(st.wall);
    cpus.push_back(st.cpu);
  }
  return {median(walls), median(cpus)};
} catch (const OutOfMemoryError&) {
  t.model->zero_grad();
  return {};
}

// The mode's cost relative to the baseline at the same batch: steps of the two alternate, so a
// change in the machine's load hits both; the median of the per-round ratios (CPU time on the
// CPU, wall time on a GPU). Also the mode's median seconds per image. -1 when it does not fit.
std::pair<double, StepTime> paired_slowdown(Trainer& t, const nn::RecomputeMode& baseline,
                                            const nn::RecomputeMode& mode, int64_t batch, int64_t hw,
                                            int repeats) try {
  Runner rb(t, baseline, batch, hw), rm(t, mode, batch, hw);
  (void)rb.once();
  (void)rm.once();
  std::vector<double> ratios, walls, cpus;
  for (int i = 0; i < repeats; ++i) {
    const StepTime b = rb.once(), m = rm.once();
    ratios.push_back(t.dev.is_cuda() ? m.wall / b.wall : m.cpu / b.cpu);
    walls.push_back(m.wall);
    cpus.push_back(m.cpu);
  }
  return {median(ratios), StepTime{median(walls), median(cpus)}};
} catch (const OutOfMemoryError&) {
  t.model->zero_grad();
  return {-1.0, StepTime{}};
}

int64_t largest_batch(Trainer& t, const nn::RecomputeMode& mode, int64_t hw, int64_t max_batch, int* trials) {
  int64_t ok = 0, bad = max_batch + 1;
  for (int64_t b = 1; b <= max_batch; b *= 2) {  // doubling, then bisection
    ++*trials;
    if (!step(t, mode, b, hw)) {
      bad = b;
      break;
    }
    ok = b;
  }
  if (bad > max_batch && ok < max_batch) {
    ++*trials;
    if (step(t, mode, max_batch, hw)) return max_batch;
    bad = max_batch;
  }
  while (bad - ok > 1) {
    const int64_t mid = ok + (bad - ok) / 2;
    ++*trials;
    if (step(t, mode, mid, hw)) ok = mid;
    else bad = mid;
  }
  return ok;
}

int run(const Setup& s) {
  const Device dev = Device::parse(s.device);
  Trainer t{dev, nullptr, nullptr};
  Generator init(0);
  if (s.model == "resnet18") t.model = nn::resnet18(2, &init, false, s.small_input);
  else if (s.model == "resnet50") t.model = nn::resnet50(2, &init, false, s.small_input);
  else MINIDL_FAIL("bench_recompute: --model must be resnet18 or resnet50, got '", s.model, "'");
  t.model->to(dev);
  t.opt = std::make_unique<optim::SGD>(t.model->parameters(),
                                       optim::SgdOptions{.lr = 0.001, .momentum = 0.9, .weight_decay = 1e-4});
  std::vector<nn::RecomputeMode> modes;
  for (const std::string& m : s.modes) modes.push_back(nn::RecomputeMode::parse(m));
  // One step at batch 2 before the budget: the momentum buffers exist from then on, as in training.
  MINIDL_CHECK(step(t, modes.front(), 2, s.image_size), "bench_recompute: batch 2 fails without a budget");
  const size_t budget = parse_bytes(s.budget);
  set_memory_budget(dev, budget);
  const MemoryStats before_steps = memory_stats(dev);
  std::printf("# %s%s at %lldx%lld on %s, budget %s (%zu bytes); parameters + momentum + other state "
              "reserved before the steps: %lld bytes\n",
              s.model.c_str(), s.small_input ? " (small-input stem)" : "", static_cast<long long>(s.image_size),
              static_cast<long long>(s.image_size), dev.str().c_str(), s.budget.c_str(), budget,
              static_cast<long long>(before_steps.reserved_bytes));
  std::printf("| mode | largest batch | x none | peak allocated (bytes) | wall s/img at own max | CPU s/img at own max "
              "| wall s/img at none's max | CPU s/img at none's max | slowdown at none's max (%s, paired) | trials |\n"
              "|---|---|---|---|---|---|---|---|---|---|\n",
              dev.is_cuda() ? "wall" : "CPU time");
  std::fflush(stdout);
  int64_t none_batch = 0;
  std::string optimal_plan;
  for (size_t i = 0; i < modes.size(); ++i) {
    int trials = 0;
    const int64_t b = largest_batch(t, modes[i], s.image_size, s.max_batch, &trials);
    if (b == 0) {
      std::printf("| %s | 0 (batch 1 does not fit) | | | | | | %d |\n", s.modes[i].c_str(), trials);
      continue;
    }
    reset_peak_stats(dev);
    std::string plan;
    step(t, modes[i], b, s.image_size, nullptr, &plan);
    const int64_t peak = memory_stats(dev).peak_allocated_bytes;
    if (modes[i].kind == nn::RecomputeMode::Kind::Optimal) optimal_plan = plan;
    const StepTime own = time_step(t, modes[i], b, s.image_size, s.repeats);
    if (i == 0) none_batch = b;
    const int64_t at = none_batch > 0 ? none_batch : b;
    const auto [ratio, base] = i == 0 ? std::pair<double, StepTime>{1.0, own}
                                      : paired_slowdown(t, modes[0], modes[i], at, s.image_size, s.repeats);
    auto cell = [](double v) {
      char buf[32] = "does not fit";
      if (v >= 0) std::snprintf(buf, sizeof buf, "%.4f", v);
      return std::string(buf);
    };
    char slow[32] = "";
    if (ratio >= 0) std::snprintf(slow, sizeof slow, "%+.1f%%", 100.0 * (ratio - 1.0));
    std::printf("| %s | %lld | %.2f | %lld | %s | %s | %s | %s | %s | %d |\n", s.modes[i].c_str(),
                static_cast<long long>(b),
                none_batch > 0 ? static_cast<double>(b) / static_cast<double>(none_batch) : 1.0,
                static_cast<long long>(peak), cell(own.wall).c_str(), cell(own.cpu).c_str(), cell(base.wall).c_str(),
                cell(base.cpu).c_str(), slow, trials);
    std::fflush(stdout);
  }
  set_memory_budget(dev, 0);
  if (!optimal_plan.empty()) std::printf("\nThe optimal plan at its largest batch:\n```\n%s```\n", optimal_plan.c_str());
  return 0;
}

}  // namespace
}  // namespace minidl

int main(int argc, char** argv) {
  minidl::Setup s;
  CLI::App app{"Largest batch and time per image under a memory budget for each recomputation mode"};
  app.add_option("--model", s.model, "resnet18 or resnet50")->capture_default_str();
  app.add_option("--device", s.device, "cpu or cuda[:i]")->capture_default_str();
  app.add_option("--image-size", s.image_size, "square input side in pixels")->capture_default_str();
  app.add_option("--budget", s.budget, "allocator budget, e.g. 152MiB or 11GiB")->capture_default_str();
  app.add_option("--small-input", s.small_input, "3x3 stem without max-pool (for small images)")->capture_default_str();
  app.add_option("--modes", s.modes, "recompute modes, the first is the baseline")->capture_default_str();
  app.add_option("--max-batch", s.max_batch, "upper end of the search")->capture_default_str();
  app.add_option("--repeats", s.repeats, "timed steps (median; alternating with the baseline for the slowdown) after one warm-up")->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  try {
    return minidl::run(s);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_recompute: %s\n", e.what());
    return 1;
  }
}
