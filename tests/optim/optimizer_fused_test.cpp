// The fused-update dispatch seen from the CPU: Backend's fused_*_step defaults decline without
// touching anything, and SGD/Adam/AdamW on CPU parameters give bit for bit the per-tensor
// arithmetic (written out here with tensor ops as optim/sgd.cpp and optim/adam.cpp do), so adding
// the CUDA fused path changed no CPU result.
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <map>

#include "core/backend.h"
#include "core/generator.h"
#include "core/ops.h"
#include "optim/adam.h"
#include "optim/sgd.h"

namespace minidl::optim {
namespace {

const std::vector<Shape> kShapes{{5}, {7, 3}, {1}};

std::vector<Tensor> make_params(uint64_t seed, const std::vector<Shape>& shapes = kShapes) {
  std::vector<Tensor> ps;
  for (size_t i = 0; i < shapes.size(); ++i) {
    Generator g(seed + i);
    Tensor p = randn(shapes[i], {}, &g);
    p.set_requires_grad(true);
    ps.push_back(p);
  }
  return ps;
}

Tensor grad_for(int step, size_t i, const std::vector<Shape>& shapes = kShapes) {
  Generator g(500 * static_cast<uint64_t>(step) + i);
  return randn(shapes[i], {}, &g);
}

void expect_bit_equal(const Tensor& got, const Tensor& want, const std::string& what) {
  const auto a = got.to_vector(), b = want.to_vector();
  ASSERT_EQ(a.size(), b.size()) << what;
  for (size_t k = 0; k < a.size(); ++k) ASSERT_EQ(a[k], b[k]) << what << " element " << k;
}

std::vector<Tensor> zeros_like_each(const std::vector<Tensor>& ps) {
  std::vector<Tensor> z;
  for (const Tensor& p : ps) z.push_back(zeros_like(p.detach()));
  return z;
}

// Steps 1..steps of opt on ps with the gradients grad(step, i); after each step, replay(step, i)
// for every parameter i redoes the per-tensor op sequence on the test's reference copy and compares.
void step_and_replay(Optimizer& opt, std::vector<Tensor>& ps, int steps, const std::function<Tensor(int, size_t)>& grad,
                     const std::function<void(int, size_t)>& replay) {
  for (int s = 1; s <= steps; ++s) {
    for (size_t i = 0; i < ps.size(); ++i) ps[i].set_grad(grad(s, i));
    opt.step();
    for (size_t i = 0; i < ps.size(); ++i) replay(s, i);
  }
}

Tensor default_grad(int step, size_t i) { return grad_for(step, i); }

// SGD has no CPU fused step; Adam's (kernels/cpu/optim.cpp) declines what it cannot walk flat
// in f32 and the device skip flag of CUDA graphs, touching nothing.
TEST(FusedDispatch, CpuBackendDeclinesAndTouchesNothing) {
  Backend& be = backend(Device::cpu());
  const Tensor p = ones({4}), g = full({4}, 2.0, {}), b = full({4}, 3.0, {});
  const AdamHyper h{0.1, 0.0, 0.9, 0.999, 1e-8, false, false, false};
  EXPECT_FALSE(be.fused_sgd_step({p}, {g}, {b}, {1}, SgdHyper{0.1, 0.0, 0.9, 0.0, false, false}));
  const Tensor half = ones({4}, {.dtype = DType::f16}), strided = ones({4, 2}).t();
  EXPECT_FALSE(be.fused_adam_step({half}, {half}, {half}, {half}, {}, {1}, h)) << "f16";
  EXPECT_FALSE(be.fused_adam_step({strided}, {strided}, {strided}, {strided}, {}, {1}, h)) << "not contiguous";
  EXPECT_FALSE(be.fused_adam_step({p}, {g}, {b}, {b}, {}, {1, 1}, h)) << "lists of different lengths";
  EXPECT_FALSE(be.fused_adam_step({p}, {g}, {b}, {b}, {}, {1},
                                  AdamHyper{0.1, 0.0, 0.9, 0.999, 1e-8, true, false, false}))
      << "amsgrad without its buffers";
  const float skip = 0.0f;
  AdamHyper graphs = h;
  graphs.skip_if = &skip;
  EXPECT_FALSE(be.fused_adam_step({p}, {g}, {b}, {b}, {}, {1}, graphs)) << "a device skip flag (CUDA graphs)";
  EXPECT_EQ(p.to_vector(), std::vector<double>(4, 1.0));
  EXPECT_EQ(b.to_vector(), std::vector<double>(4, 3.0));
  EXPECT_TRUE(be.fused_adam_step({p}, {g}, {b}, {b}, {}, {1}, h)) << "contiguous f32 on the CPU";
  EXPECT_NE(p.to_vector(), std::vector<double>(4, 1.0));
  EXPECT_EQ(be.pinned_alloc(1024), nullptr) << "the CPU backend has no pinned memory of its own";
}

TEST(FusedDispatch, SgdOnCpuIsTheUnchangedPerTensorPath) {
  const double lr = 0.05, momentum = 0.9, wd = 1e-2;
  std::vector<Tensor> ps = make_params(1);
  SGD opt(ps, {.lr = lr, .momentum = momentum, .weight_decay = wd, .nesterov = true});
  std::vector<Tensor> ref = make_params(1), bufs(ps.size());
  step_and_replay(opt, ps, 6, default_grad, [&](int s, size_t i) {   // optim/sgd.cpp's op sequence
    Tensor d_p = grad_for(s, i).clone();
    d_p.add_(ref[i].detach(), wd);
    if (!bufs[i].defined()) {
      bufs[i] = d_p.clone();
    } else {
      bufs[i].mul_(momentum).add_(d_p, 1.0);
    }
    d_p = d_p.clone();
    d_p.add_(bufs[i], momentum);
    Tensor r = ref[i].detach();
    r.add_(d_p, -lr);
    expect_bit_equal(ps[i].detach(), ref[i].detach(), "SGD step " + std::to_string(s) + " param " + std::to_string(i));
    expect_bit_equal(opt.state(0, i).buffers.at("momentum_buffer"), bufs[i], "SGD momentum buffer");
  });
}

TEST(FusedDispatch, AdamWAmsgradOnCpuIsTheUnchangedPerTensorPath) {
  const double lr = 1e-2, wd = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-8;
  std::vector<Tensor> ps = make_params(7);
  AdamW opt(ps, {.lr = lr, .weight_decay = wd, .amsgrad = true});
  const std::vector<Tensor> ref = make_params(7);
  std::vector<Tensor> m = zeros_like_each(ref), v = zeros_like_each(ref), vmax = zeros_like_each(ref);
  step_and_replay(opt, ps, 6, default_grad, [&](int s, size_t i) {   // optim/adam.cpp's op sequence
    const Tensor g = grad_for(s, i);
    Tensor p = ref[i].detach();
    p.mul_(1.0 - lr * wd);
    m[i].mul_(b1).add_(g, 1.0 - b1);
    v[i].mul_(b2).add_(mul(g, g), 1.0 - b2);
    const double bc1 = 1.0 - std::pow(b1, s), bc2 = 1.0 - std::pow(b2, s);
    vmax[i].copy_(maximum(vmax[i], v[i]));
    const Tensor denom = sqrt(vmax[i]) / std::sqrt(bc2) + eps;
    p.add_(m[i] / denom, -(lr / bc1));
    const std::string what = "AdamW step " + std::to_string(s) + " param " + std::to_string(i);
    expect_bit_equal(ps[i].detach(), p, what);
    expect_bit_equal(opt.state(0, i).buffers.at("exp_avg"), m[i], what + " exp_avg");
    expect_bit_equal(opt.state(0, i).buffers.at("max_exp_avg_sq"), vmax[i], what + " max_exp_avg_sq");
    EXPECT_EQ(opt.state(0, i).step, s) << what;
  });
}

// The Keras study's Adam (Keras' eps, kKerasEps) with L2 weight decay and maximize, on a
// parameter large enough to be cut into slices that both threads share, and a tiny one: the
// fused CPU pass gives the per-tensor op sequence of optim/adam.cpp to the bit over 5 steps.
TEST(FusedDispatch, AdamKerasEpsOnCpuIsThePerTensorArithmeticAcrossThreads) {
  const double lr = 1e-3, wd = 1e-2, b1 = 0.9, b2 = 0.999, eps = 1e-7;
  const std::vector<Shape> shapes{{3 * 65536 + 17}, {3, 5}};
  auto grad = [&](int step, size_t i) {
    return grad_for(step, i, shapes) * 1e-2;   // Adam's second moment near eps's scale for some elements
  };
  std::vector<Tensor> ps = make_params(11, shapes);
  const std::vector<Tensor> ref = make_params(11, shapes);
  Adam opt(ps, {.lr = lr, .beta1 = b1, .beta2 = b2, .eps = eps, .weight_decay = wd, .maximize = true,
                .keras_eps = true});
  std::vector<Tensor> m = zeros_like_each(ref), v = zeros_like_each(ref);
  step_and_replay(opt, ps, 5, grad, [&](int s, size_t i) {   // optim/adam.cpp's op sequence
    Tensor p = ref[i].detach();
    Tensor g = neg(grad(s, i)).clone();
    g.add_(p, wd);
    m[i].mul_(b1).add_(g, 1.0 - b1);
    v[i].mul_(b2).add_(mul(g, g), 1.0 - b2);
    const double bc1 = 1.0 - std::pow(b1, s), bc2_sqrt = std::sqrt(1.0 - std::pow(b2, s));
    const Tensor denom = sqrt(v[i]) / bc2_sqrt + eps / bc2_sqrt;
    p.add_(m[i] / denom, -(lr / bc1));
    const std::string what = "Adam step " + std::to_string(s) + " param " + std::to_string(i);
    expect_bit_equal(ps[i].detach(), p, what);
    expect_bit_equal(opt.state(0, i).buffers.at("exp_avg_sq"), v[i], what + " exp_avg_sq");
    EXPECT_EQ(opt.state(0, i).step, s) << what;
  });
}

}  // namespace
}  // namespace minidl::optim
