// The fused multi-tensor optimizer kernels (kernels/cuda/optim_fused.cu) against the CPU
// per-tensor path: 20 steps of SGD (momentum, dampening, nesterov, weight decay, maximize) and
// Adam/AdamW (weight decay, amsgrad) on the same fixed gradients, parameters and state within
// 4e-6 relative in f32 (kTol), the step counters, and a state_dict round trip in the middle of the run.
// The optimizer's device state (CUDA graphs: the rates and Adam's step counts on the device) gives
// the host state's results bit for bit, with a rate that changes every step.
// MINIDL_PARITY_SELF_TEST=1 runs it CPU against CPU to check the harness without a GPU.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>
#include <string>

#include "core/backend.h"
#include "core/generator.h"
#include "core/ops.h"
#include "optim/adam.h"
#include "optim/sgd.h"
#include "tests/support/cuda_target.h"

namespace minidl::optim {
namespace {

const Device kGpu = testing::parity_target();
using FusedOptim = testing::CudaTargetTest;

// Shapes: tiny, odd, and one past a 65536-element chunk so a tensor spans several blocks.
const std::vector<Shape> kShapes{{3}, {17, 9}, {70003}, {1}, {4, 3, 5}};

// max|a - b| / max(1e-3, max|b|), naming the worst element.
::testing::AssertionResult close(const Tensor& cpu, const Tensor& gpu, double tol, const std::string& what) {
  if (cpu.shape() != gpu.shape()) return ::testing::AssertionFailure() << what << ": shapes " << cpu.meta() << " vs " << gpu.meta();
  if (gpu.device() != kGpu) return ::testing::AssertionFailure() << what << ": not on the device under test: " << gpu.meta();
  const std::vector<double> a = cpu.to_vector(), b = gpu.to(Device::cpu()).to_vector();
  double diff = 0, scale = 1e-3;
  size_t wi = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::abs(a[i] - b[i]);
    if (std::isnan(d)) return ::testing::AssertionFailure() << what << ": NaN at " << i << " (cpu " << a[i] << ", cuda " << b[i] << ")";
    if (d > diff) {
      diff = d;
      wi = i;
    }
    scale = std::max(scale, std::abs(a[i]));
  }
  if (diff / scale <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << ": relative error " << diff / scale << " > " << tol
                                       << "; worst at flat index " << wi << ": cpu " << a[wi] << ", cuda " << b[wi];
}

struct Run {
  std::vector<Tensor> params;
  std::unique_ptr<Optimizer> opt;
};

using Factory = std::function<std::unique_ptr<Optimizer>(std::vector<Tensor>)>;

Run make_run(Device dev, const Factory& make, const std::vector<Tensor>* from = nullptr) {
  Run r;
  for (size_t i = 0; i < kShapes.size(); ++i) {
    Tensor p;
    if (from != nullptr) {
      p = (*from)[i].detach().clone();
    } else {
      Generator g(100 + i);
      p = randn(kShapes[i], {}, &g);
      if (dev != Device::cpu() || testing::parity_self_test()) p = p.to(dev).clone();
    }
    p.set_requires_grad(true);
    r.params.push_back(p);
  }
  r.opt = make(r.params);
  return r;
}

// The gradients of step s (1-based): fixed by (s, i); parameter 3 gets none on every third step,
// so a parameter's own step count falls behind the optimizer's (Adam's bias correction).
void set_grads(Run& r, int s) {
  for (size_t i = 0; i < r.params.size(); ++i) {
    if (i == 3 && s % 3 == 0) {
      r.params[i].zero_grad();
      continue;
    }
    Generator g(1000 * static_cast<uint64_t>(s) + i);
    const Tensor grad = randn(kShapes[i], {}, &g);
    r.params[i].set_grad(grad.to(r.params[i].device()));
  }
}

// The fused kernels round every operation (__fadd_rn, __fmul_rn); the CPU's per-tensor path may
// fuse `a + alpha * b` into one FMA (GCC contracts by default with -march=native). Over 20 steps a
// one-element tensor, where the normalised error is not averaged, drifts ~16 ulp (1.05e-6 seen on
// the emulated device for Adam's exp_avg), so the bound is 4e-6 relative.
constexpr double kTol = 4e-6;

void compare(const Run& cpu, const Run& gpu, const std::string& what) {
  ASSERT_EQ(cpu.opt->step_count(), gpu.opt->step_count()) << what;
  for (size_t i = 0; i < cpu.params.size(); ++i) {
    const std::string w = what + ", parameter " + std::to_string(i) + " " + cpu.params[i].meta();
    ASSERT_TRUE(close(cpu.params[i].detach(), gpu.params[i].detach(), kTol, w));
    const ParamState& sc = cpu.opt->state(0, i);
    const ParamState& sg = gpu.opt->state(0, i);
    ASSERT_EQ(sc.step, sg.step) << w << ": per-parameter step count";
    ASSERT_EQ(sc.buffers.size(), sg.buffers.size()) << w << ": state buffers";
    for (const auto& [k, buf] : sc.buffers) {
      ASSERT_TRUE(sg.buffers.count(k)) << w << ": no state '" << k << "' on the device";
      ASSERT_TRUE(close(buf, sg.buffers.at(k), kTol, w + ", state " + k));
    }
  }
}

// Every parameter, state buffer and step count of two runs on the device, bit for bit.
void expect_same_bits(const Run& a, const Run& b, const std::string& what) {
  for (size_t i = 0; i < a.params.size(); ++i) {
    const std::string w = what + ": parameter " + std::to_string(i);
    ASSERT_EQ(a.params[i].to(Device::cpu()).to_vector(), b.params[i].to(Device::cpu()).to_vector()) << w;
    const ParamState& sa = a.opt->state(0, i);
    const ParamState& sb = b.opt->state(0, i);
    ASSERT_EQ(sa.step, sb.step) << w << ": per-parameter step count";
    for (const auto& [k, buf] : sa.buffers)
      ASSERT_EQ(buf.to(Device::cpu()).to_vector(), sb.buffers.at(k).to(Device::cpu()).to_vector()) << w << ", " << k;
  }
}

// One step of every run with step s's gradients at a rate that changes every step (a schedule).
void step_all(const std::vector<Run*>& runs, int s, double base_lr) {
  for (Run* r : runs) {
    set_grads(*r, s);
    r->opt->set_lr(0, base_lr * (0.5 + 0.05 * s));
    r->opt->step();
  }
}

void check_20_steps(const std::string& name, const Factory& make) {
  Run cpu = make_run(Device::cpu(), make);
  Run gpu = make_run(kGpu, make);
  const double base_lr = cpu.opt->lr(0);
  // The device state reads the rate and (Adam) the step counts on the device: the same bits.
  const bool on_cuda = kGpu.target() == DeviceType::CUDA;
  Run dev = make_run(kGpu, make);
  if (on_cuda) dev.opt->to_device_state(kGpu);
  for (int s = 1; s <= 10; ++s) {
    step_all({&cpu, &gpu, &dev}, s, base_lr);
    compare(cpu, gpu, name + " step " + std::to_string(s));
    expect_same_bits(gpu, dev, name + " step " + std::to_string(s) + ", device state");
    if (::testing::Test::HasFatalFailure()) return;
  }
  // Resume from a state_dict in the middle: a fresh optimizer over copies of the device
  // parameters continues exactly as the original (same kernels, same state: bit for bit), also
  // when it loads in the device state (the counts and rates then go to the device).
  Run resumed = make_run(kGpu, make, &gpu.params);
  resumed.opt->load_state_dict(gpu.opt->state_dict());
  ASSERT_EQ(resumed.opt->step_count(), 10) << name << ": step counter after load_state_dict";
  Run dev_resumed = make_run(kGpu, make, &gpu.params);
  if (on_cuda) dev_resumed.opt->to_device_state(kGpu);
  dev_resumed.opt->load_state_dict(dev.opt->state_dict());
  for (int s = 11; s <= 20; ++s) {
    step_all({&cpu, &gpu, &resumed, &dev, &dev_resumed}, s, base_lr);
    compare(cpu, gpu, name + " step " + std::to_string(s));
    if (::testing::Test::HasFatalFailure()) return;
    expect_same_bits(gpu, resumed, name + " step " + std::to_string(s) + ", resumed");
    expect_same_bits(gpu, dev, name + " step " + std::to_string(s) + ", device state");
    expect_same_bits(gpu, dev_resumed, name + " step " + std::to_string(s) + ", device state resumed");
    if (::testing::Test::HasFatalFailure()) return;
  }
  ASSERT_EQ(gpu.opt->step_count(), 20) << name;
  dev.opt->to_host_state();
  expect_same_bits(gpu, dev, name + ", back in the host state");
}

TEST_F(FusedOptim, SgdVariantsMatchCpuOver20Steps) {
  struct Case {
    const char* name;
    SgdOptions o;
  };
  const std::vector<Case> cases{
      {"plain", {.lr = 0.1}},
      {"momentum", {.lr = 0.05, .momentum = 0.9}},
      {"dampening+wd", {.lr = 0.05, .momentum = 0.9, .dampening = 0.3, .weight_decay = 1e-2}},
      {"nesterov+wd", {.lr = 0.05, .momentum = 0.8, .weight_decay = 5e-4, .nesterov = true}},
      {"maximize", {.lr = 0.01, .momentum = 0.5, .weight_decay = 1e-3, .maximize = true}},
  };
  for (const Case& c : cases) {
    check_20_steps(std::string("SGD ") + c.name,
                   [&](std::vector<Tensor> ps) { return std::make_unique<SGD>(std::move(ps), c.o); });
    if (HasFatalFailure()) return;
  }
}

TEST_F(FusedOptim, AdamAndAdamWMatchCpuOver20Steps) {
  struct Case {
    const char* name;
    bool decoupled;
    AdamOptions o;
  };
  const std::vector<Case> cases{
      {"Adam", false, {.lr = 1e-2}},
      {"Adam wd+amsgrad", false, {.lr = 1e-2, .beta1 = 0.8, .beta2 = 0.99, .weight_decay = 1e-2, .amsgrad = true}},
      {"AdamW", true, {.lr = 1e-2, .weight_decay = 1e-2}},
      {"AdamW amsgrad+maximize", true, {.lr = 3e-3, .eps = 1e-6, .weight_decay = 0.1, .amsgrad = true, .maximize = true}},
      {"Adam Keras eps", false, {.lr = 1e-2, .eps = 1e-7, .keras_eps = true}},
  };
  for (const Case& c : cases) {
    check_20_steps(c.name, [&](std::vector<Tensor> ps) -> std::unique_ptr<Optimizer> {
      if (c.decoupled) return std::make_unique<AdamW>(std::move(ps), c.o);
      return std::make_unique<Adam>(std::move(ps), c.o);
    });
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace minidl::optim
