// The optimizer behaviour the golden file cannot show: bad-input errors (their texts name the
// optimizer and the fix), zero_grad, skipped parameters, parameter groups and learning-rate
// changes, and a state_dict round trip through a safetensors file that must resume bit-exactly.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <cmath>
#include <functional>
#include <memory>

#include "tests/support/error_of.h"
#include "core/generator.h"
#include "core/ops.h"
#include "nn/safetensors.h"
#include "optim/adam.h"
#include "optim/sgd.h"

namespace minidl::optim {
namespace {

Tensor param(const Shape& shape, uint64_t seed, DType dtype = DType::f32) {
  Generator gen(seed);
  Tensor p = randn(shape, {.dtype = dtype}, &gen);
  p.set_requires_grad(true);
  return p;
}

// A gradient of ones on each parameter, as backward of sum(p) would leave.
void set_unit_grads(const std::vector<Tensor>& ps) {
  for (Tensor p : ps) p.set_grad(ones(p.shape()));
}

using ::minidl::testing::error_of;

#define EXPECT_ERROR(stmt, text) EXPECT_NE(error_of([&] { stmt; }).find(text), std::string::npos) << error_of([&] { stmt; })

bool bit_equal(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() && a.to_vector() == b.to_vector();
}

// ---- Bad input ----

TEST(OptimizerErrors, HyperParameters) {
  Tensor w = param({2, 3}, 1);
  EXPECT_ERROR(SGD({w}, SgdOptions{}), "SGD: lr is required");
  EXPECT_ERROR(SGD({w}, SgdOptions{.lr = -0.1}), "SGD: invalid learning rate -0.1");
  EXPECT_ERROR(SGD({w}, SgdOptions{.lr = 0.1, .weight_decay = -1e-4}), "SGD: invalid weight_decay -0.0001");
  EXPECT_ERROR(SGD({w}, SgdOptions{.lr = 0.1, .momentum = -0.9}), "SGD: invalid momentum -0.9; momentum must be >= 0");
  EXPECT_ERROR(SGD({w}, SgdOptions{.lr = 0.1, .nesterov = true}),
               "SGD: nesterov momentum requires momentum > 0 and dampening = 0");
  EXPECT_ERROR(SGD({w}, SgdOptions{.lr = 0.1, .momentum = 0.9, .dampening = 0.1, .nesterov = true}),
               "dampening 0.1); set momentum > 0 and dampening 0, or nesterov false");
  EXPECT_ERROR(Adam({w}, AdamOptions{.lr = -1e-3}), "Adam: invalid learning rate -0.001");
  EXPECT_ERROR(Adam({w}, AdamOptions{.beta1 = 1.0}), "Adam: invalid beta1 1; betas must be in [0, 1)");
  EXPECT_ERROR(Adam({w}, AdamOptions{.beta2 = -0.5}), "Adam: invalid beta2 -0.5; betas must be in [0, 1)");
  EXPECT_ERROR(Adam({w}, AdamOptions{.eps = 0.0}), "Adam: invalid eps 0; eps must be > 0");
  EXPECT_ERROR(Adam({w}, AdamOptions{.weight_decay = -0.1}), "Adam: invalid weight_decay -0.1");
  EXPECT_ERROR(AdamW({w}, AdamOptions{.beta1 = 1.5}), "AdamW: invalid beta1 1.5");
  // Valid edge values are accepted.
  EXPECT_NO_THROW(SGD({w}, SgdOptions{.lr = 0.0, .momentum = 0.9, .nesterov = true}));
  EXPECT_NO_THROW(Adam({w}, AdamOptions{.beta1 = 0.0, .beta2 = 0.0}));
}

TEST(OptimizerErrors, Parameters) {
  Tensor w = param({2, 3}, 1), b = param({3}, 2);
  EXPECT_ERROR(SGD(std::vector<Tensor>{w, b, w}, SgdOptions{.lr = 0.1}),
               "SGD: parameter 2 of group 0 (f32[2, 3] cpu) appears more than once");
  Adam opt(std::vector<Tensor>{w}, AdamOptions{});
  EXPECT_ERROR(opt.add_param_group(ParamGroup{.params = {b, w}}),
               "Adam: parameter 1 of group 1 (f32[2, 3] cpu) appears more than once (in this group or an earlier one)");
  EXPECT_EQ(opt.num_groups(), 1u);  // the failed group was not added
  Tensor frozen = randn({4});
  EXPECT_ERROR(SGD(std::vector<Tensor>{frozen}, SgdOptions{.lr = 0.1}),
               "SGD: parameter 0 of group 0 (f32[4] cpu) does not require grad; call set_requires_grad(true)");
  Tensor ints = zeros({4}, {.dtype = DType::i64});
  EXPECT_ERROR(AdamW(std::vector<Tensor>{ints}), "AdamW: parameter 0 of group 0 (i64[4] cpu) is not floating");
  Tensor non_leaf = w * 2.0;
  EXPECT_ERROR(SGD(std::vector<Tensor>{non_leaf}, SgdOptions{.lr = 0.1}), "is not a leaf");
  EXPECT_ERROR(SGD(std::vector<Tensor>{}, SgdOptions{.lr = 0.1}), "SGD: got an empty parameter list");
  EXPECT_ERROR(opt.add_param_group(ParamGroup{.params = {b}, .options = {{"momentum", 0.9}}}),
               "Adam: unknown option 'momentum'");
  EXPECT_ERROR(opt.add_param_group(ParamGroup{.params = {b}, .lr = -1.0}), "Adam: invalid learning rate -1");
  EXPECT_ERROR(opt.set_lr(0, -0.5), "Adam.set_lr: invalid learning rate -0.5");
  EXPECT_ERROR(opt.set_lr(3, 0.5), "Adam.set_lr: group 3 out of range (1 groups)");
  EXPECT_ERROR(opt.lr(1), "Adam.lr: group 1 out of range");
}

// ---- Basic behaviour ----

TEST(Optimizer, ZeroGradSetsGradsUndefined) {
  Tensor w = param({2, 2}, 1), b = param({2}, 2);
  SGD opt({w, b}, SgdOptions{.lr = 0.1});
  set_unit_grads({w, b});
  opt.zero_grad();
  EXPECT_FALSE(w.grad().defined());
  EXPECT_FALSE(b.grad().defined());
  // A backward after zero_grad writes fresh gradients, not stale + new.
  sum(w * 3.0).backward();
  EXPECT_EQ(w.grad().to_vector(), std::vector<double>(4, 3.0));
}

TEST(Optimizer, SkipsParametersWithoutGradAndKeepsNoStateForThem) {
  Tensor w = param({3}, 1), b = param({2}, 2);
  const Tensor b0 = b.detach().clone();
  Adam opt({w, b}, AdamOptions{.lr = 0.1});
  w.set_grad(ones({3}));
  opt.step();
  opt.step();
  EXPECT_TRUE(bit_equal(b, b0));
  EXPECT_TRUE(opt.state(0, 1).empty());
  EXPECT_EQ(opt.state(0, 0).step, 2);
  b.set_grad(ones({2}));
  opt.step();
  EXPECT_EQ(opt.state(0, 0).step, 3);
  EXPECT_EQ(opt.state(0, 1).step, 1);  // per-parameter steps, as PyTorch keeps them
  EXPECT_EQ(opt.step_count(), 3);
  // Adam's first step moves every element by lr (m/sqrt(v) = sign(g)) up to eps.
  const auto bv = b.to_vector(), b0v = b0.to_vector();
  for (size_t i = 0; i < bv.size(); ++i) EXPECT_NEAR(bv[i], b0v[i] - 0.1, 1e-6);
}

TEST(Optimizer, StepRunsWithGradModeOnAndLeavesGradientsUntouched) {
  Tensor w = param({4}, 1);
  SGD opt({w}, SgdOptions{.lr = 0.1, .momentum = 0.9, .weight_decay = 0.5});
  sum(w * w).backward();  // grad mode is on: step must guard its in-place updates itself
  const std::vector<double> g = w.grad().to_vector();
  opt.step();
  EXPECT_EQ(w.grad().to_vector(), g);
  EXPECT_TRUE(w.requires_grad());
  EXPECT_FALSE(opt.state(0, 0).buffers.at("momentum_buffer").requires_grad());
}

TEST(Optimizer, ParamGroupsWithDifferentLearningRates) {
  Tensor w = zeros({3}), b = zeros({2});
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  SGD opt(std::vector<ParamGroup>{ParamGroup{.params = {w}}, ParamGroup{.params = {b}, .lr = 0.01}},
          SgdOptions{.lr = 0.5, .momentum = 0.9});
  EXPECT_EQ(opt.lr(0), 0.5);
  EXPECT_EQ(opt.lr(1), 0.01);
  EXPECT_EQ(opt.param_groups()[1].option("momentum"), 0.9);  // unset options take the defaults
  set_unit_grads({w, b});
  opt.step();
  EXPECT_EQ(w.to_vector(), std::vector<double>(3, static_cast<float>(-0.5)));
  EXPECT_EQ(b.to_vector(), std::vector<double>(2, static_cast<float>(-0.01)));
}

TEST(Optimizer, SetLrChangesTheNextStepOnly) {
  Tensor w = zeros({2});
  w.set_requires_grad(true);
  SGD opt({w}, SgdOptions{.lr = 1.0});
  w.set_grad(ones({2}));
  opt.step();
  opt.set_lr(0, 0.25);
  EXPECT_EQ(opt.lr(0), 0.25);
  opt.step();
  EXPECT_EQ(w.to_vector(), std::vector<double>(2, -1.25));
}

TEST(Optimizer, AddParamGroupLaterIsOptimized) {
  Tensor w = zeros({2}), extra = zeros({2});
  w.set_requires_grad(true);
  extra.set_requires_grad(true);
  AdamW opt({w}, AdamOptions{.lr = 0.1, .weight_decay = 0.0});
  opt.add_param_group(ParamGroup{.params = {extra}, .lr = 0.2});
  EXPECT_EQ(opt.num_groups(), 2u);
  EXPECT_EQ(opt.param_groups()[1].weight_decay, 0.0);
  extra.set_grad(full({2}, -3.0));
  opt.step();
  for (double v : extra.to_vector()) EXPECT_NEAR(v, 0.2, 1e-6);
  EXPECT_EQ(w.to_vector(), std::vector<double>(2, 0.0));
}

// ---- state_dict ----

TEST(OptimizerStateDict, KeyNames) {
  Tensor w = param({2}, 1), b = param({3}, 2), c = param({1}, 3);
  Adam opt(std::vector<ParamGroup>{ParamGroup{.params = {w, b}}, ParamGroup{.params = {c}}},
           AdamOptions{.amsgrad = true});
  w.set_grad(ones({2}));
  opt.step();
  std::vector<std::string> keys;
  for (const auto& [k, t] : opt.state_dict()) keys.push_back(k);
  const std::vector<std::string> want = {
      "group.0.amsgrad", "group.0.beta1", "group.0.beta2", "group.0.eps", "group.0.lr", "group.0.maximize",
      "group.0.num_params", "group.0.weight_decay",
      "group.1.amsgrad", "group.1.beta1", "group.1.beta2", "group.1.eps", "group.1.lr", "group.1.maximize",
      "group.1.num_params", "group.1.weight_decay",
      "state.0.0.exp_avg", "state.0.0.exp_avg_sq", "state.0.0.max_exp_avg_sq", "state.0.0.step", "state.step"};
  EXPECT_EQ(keys, want);
  const auto sd = opt.state_dict();
  EXPECT_EQ(sd.at("group.0.lr").dtype(), DType::f64);
  EXPECT_EQ(sd.at("group.0.lr").dim(), 0);
  EXPECT_EQ(sd.at("state.step").dtype(), DType::i64);
  EXPECT_EQ(sd.at("state.0.0.step").item(), 1.0);
  EXPECT_EQ(sd.at("group.1.num_params").item(), 1.0);

  SGD sgd({w}, SgdOptions{.lr = 0.1, .momentum = 0.9});
  sgd.step();
  const auto s = sgd.state_dict();
  EXPECT_TRUE(s.count("state.0.0.momentum_buffer"));
  EXPECT_FALSE(s.count("state.0.0.step"));
  EXPECT_EQ(s.at("group.0.nesterov").item(), 0.0);
}

TEST(OptimizerStateDict, IsACopy) {
  Tensor w = param({3}, 1);
  SGD opt({w}, SgdOptions{.lr = 0.1, .momentum = 0.9});
  w.set_grad(ones({3}));
  opt.step();
  const auto sd = opt.state_dict();
  const std::vector<double> before = sd.at("state.0.0.momentum_buffer").to_vector();
  opt.step();
  EXPECT_EQ(sd.at("state.0.0.momentum_buffer").to_vector(), before);
}

using MakeOpt = std::function<std::unique_ptr<Optimizer>(std::vector<Tensor>)>;

// 12 uninterrupted steps vs 7 steps, state_dict, a fresh optimizer (other hyper-parameters) over
// copies of the parameters, load, 5 more steps: the parameters must be bit-identical.
void check_resume(const MakeOpt& make, DType dtype) {
  const std::vector<Shape> shapes = {{3, 4}, {5}, {2, 3}};
  auto grads_for = [&](int step, size_t k) {
    Generator gen(1000 + 10 * static_cast<uint64_t>(step) + k);
    return randn(shapes[k], {.dtype = dtype}, &gen);
  };
  auto run_steps = [&](Optimizer& opt, std::vector<Tensor>& ps, int from, int to) {
    for (int s = from; s < to; ++s) {
      for (size_t k = 0; k < ps.size(); ++k) {
        // Parameter 1 misses some steps so per-parameter state (Adam's step) differs.
        ps[k].set_grad(k == 1 && (s == 2 || s == 8) ? Tensor() : grads_for(s, k));
      }
      opt.step();
      if (s == 4) opt.set_lr(0, opt.lr(0) * 0.5);  // a schedule's change must survive the resume
    }
  };
  std::vector<Tensor> a, b;
  for (size_t k = 0; k < shapes.size(); ++k) a.push_back(param(shapes[k], 7 + k, dtype));
  for (const auto& p : a) b.push_back(p.detach().clone().set_requires_grad(true));

  auto full_run = make(a);
  run_steps(*full_run, a, 0, 12);

  auto first = make(b);
  run_steps(*first, b, 0, 7);
  // The interrupted run leaves only a file: its parameters and optimizer state, as safetensors.
  // Unique per test and process: ctest runs the resume tests in parallel.
  const std::string path = ::testing::TempDir() + "minidl_resume_" +
                           ::testing::UnitTest::GetInstance()->current_test_info()->name() + "_" +
                           std::to_string(::getpid()) + ".safetensors";
  std::map<std::string, Tensor> file = first->state_dict();
  for (size_t k = 0; k < b.size(); ++k) file["param." + std::to_string(k)] = b[k];
  nn::save_safetensors(path, file);
  first.reset();
  auto loaded = nn::load_safetensors(path).tensors;
  std::remove(path.c_str());
  std::vector<Tensor> c;
  for (size_t k = 0; k < b.size(); ++k) {
    c.push_back(loaded.at("param." + std::to_string(k)).set_requires_grad(true));
    loaded.erase("param." + std::to_string(k));
  }
  const std::map<std::string, Tensor> saved = loaded;
  auto resumed = make(c);
  resumed->set_lr(0, 123.0);  // overwritten by the load
  resumed->load_state_dict(saved);
  EXPECT_EQ(resumed->step_count(), 7);
  run_steps(*resumed, c, 7, 12);
  for (size_t k = 0; k < a.size(); ++k) EXPECT_TRUE(bit_equal(a[k], c[k])) << "parameter " << k;
  EXPECT_EQ(full_run->lr(0), resumed->lr(0));
  const auto sa = full_run->state_dict(), sc = resumed->state_dict();
  ASSERT_EQ(sa.size(), sc.size());
  for (const auto& [key, t] : sa) EXPECT_TRUE(bit_equal(t, sc.at(key))) << key;
}

TEST(OptimizerStateDict, ResumeIsBitExactSgdNesterov) {
  check_resume([](std::vector<Tensor> ps) {
    return std::make_unique<SGD>(std::move(ps), SgdOptions{.lr = 0.05, .momentum = 0.9, .weight_decay = 1e-3,
                                                             .nesterov = true});
  }, DType::f32);
}

TEST(OptimizerStateDict, ResumeIsBitExactAdamAmsgrad) {
  check_resume([](std::vector<Tensor> ps) {
    return std::make_unique<Adam>(std::move(ps), AdamOptions{.lr = 1e-2, .weight_decay = 0.1, .amsgrad = true});
  }, DType::f32);
}

TEST(OptimizerStateDict, ResumeIsBitExactAdamWF64) {
  check_resume([](std::vector<Tensor> ps) {
    return std::make_unique<AdamW>(std::move(ps), AdamOptions{.lr = 1e-2, .weight_decay = 0.05});
  }, DType::f64);
}

TEST(OptimizerStateDict, LoadRestoresHyperParameters) {
  Tensor w = param({2}, 1);
  SGD src({w}, SgdOptions{.lr = 0.3, .momentum = 0.7, .dampening = 0.2});
  Tensor w2 = param({2}, 1);
  SGD dst({w2}, SgdOptions{.lr = 0.1});
  dst.load_state_dict(src.state_dict());
  EXPECT_EQ(dst.lr(0), 0.3);
  EXPECT_EQ(dst.param_groups()[0].option("momentum"), 0.7);
  EXPECT_EQ(dst.param_groups()[0].option("dampening"), 0.2);
  EXPECT_TRUE(dst.state(0, 0).empty());
}

TEST(OptimizerStateDict, LoadValidatesAndChangesNothingOnError) {
  Tensor w = param({2, 2}, 1), b = param({3}, 2);
  Adam opt({w, b}, AdamOptions{.lr = 0.01});
  set_unit_grads({w, b});
  opt.step();
  const auto good = opt.state_dict();

  Tensor w2 = param({2, 2}, 3), b2 = param({3}, 4);
  Adam other({w2, b2}, AdamOptions{.lr = 0.5});
  auto missing = good;
  missing.erase("state.0.1.exp_avg_sq");
  EXPECT_ERROR(other.load_state_dict(missing),
               "Adam.load_state_dict: incomplete state for parameter 1 of group 0: has 'state.0.1.exp_avg' but not "
               "'state.0.1.exp_avg_sq'");
  auto no_lr = good;
  no_lr.erase("group.0.lr");
  EXPECT_ERROR(other.load_state_dict(no_lr), "Adam.load_state_dict: missing key 'group.0.lr'");
  auto unknown = good;
  unknown["state.0.0.momentum_buffer"] = zeros({2, 2});
  EXPECT_ERROR(other.load_state_dict(unknown), "Adam.load_state_dict: unknown key 'state.0.0.momentum_buffer'");
  auto bad_shape = good;
  bad_shape["state.0.0.exp_avg"] = zeros({4});
  EXPECT_ERROR(other.load_state_dict(bad_shape),
               "'state.0.0.exp_avg' is f32[4] cpu but parameter 0 of group 0 is f32[2, 2] cpu");
  auto bad_dtype = good;
  bad_dtype["state.0.1.exp_avg"] = zeros({3}, {.dtype = DType::f64});
  EXPECT_ERROR(other.load_state_dict(bad_dtype), "'state.0.1.exp_avg' is f64[3] cpu but parameter 1");
  auto bad_lr = good;
  bad_lr["group.0.lr"] = scalar_tensor(-1.0, {.dtype = DType::f64});
  EXPECT_ERROR(other.load_state_dict(bad_lr), "Adam: invalid learning rate -1");
  auto lr_f32 = good;
  lr_f32["group.0.lr"] = scalar_tensor(0.1);
  EXPECT_ERROR(other.load_state_dict(lr_f32), "'group.0.lr' must be a 0-dim f64 tensor, got f32[] cpu");
  // Nothing of the failed loads was applied.
  EXPECT_EQ(other.lr(0), 0.5);
  EXPECT_TRUE(other.state(0, 0).empty());
  EXPECT_EQ(other.step_count(), 0);

  Adam fewer(std::vector<Tensor>{w2}, AdamOptions{});
  EXPECT_ERROR(fewer.load_state_dict(good),
               "group 0 was saved with 2 parameters but this optimizer's group 0 has 1");
  SGD sgd({w2, b2}, SgdOptions{.lr = 0.1});
  EXPECT_ERROR(sgd.load_state_dict(good), "SGD.load_state_dict: missing key 'group.0.dampening'");
  other.load_state_dict(good);
  EXPECT_EQ(other.lr(0), 0.01);
  EXPECT_EQ(other.state(0, 1).step, 1);
}

}  // namespace
}  // namespace minidl::optim

namespace minidl::optim {
namespace {

// Keras' Adam (keras_eps, the "epsilon hat" placement) against its own formula in double:
// lr_t = lr * sqrt(1 - beta2^t) / (1 - beta1^t); p -= lr_t * m / (sqrt(v) + eps). A large eps and
// small gradients make the placement visible (PyTorch's placement lands elsewhere); the option
// stays out of the state of a default Adam.
TEST(Optimizer, AdamKerasEpsilonFollowsKerasUpdate) {
  const std::vector<double> grads{1e-3, -2e-3, 5e-4};
  const double lr = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-3;
  Tensor w = zeros({3}, {.dtype = DType::f64});
  Tensor torch_w = zeros({3}, {.dtype = DType::f64});
  w.set_requires_grad(true);
  torch_w.set_requires_grad(true);
  Adam keras({w}, AdamOptions{.lr = lr, .eps = eps, .keras_eps = true});
  Adam torch({torch_w}, AdamOptions{.lr = lr, .eps = eps});
  std::vector<double> p(3, 0.0), m(3, 0.0), v(3, 0.0);
  for (int t = 1; t <= 3; ++t) {
    const Tensor g = from_vector(grads, {3}, {.dtype = DType::f64}) * static_cast<double>(t);
    w.set_grad(g.clone());
    torch_w.set_grad(g.clone());
    keras.step();
    torch.step();
    const double lr_t = lr * std::sqrt(1 - std::pow(b2, t)) / (1 - std::pow(b1, t));
    for (size_t i = 0; i < 3; ++i) {
      const double gi = grads[i] * t;
      m[i] = b1 * m[i] + (1 - b1) * gi;
      v[i] = b2 * v[i] + (1 - b2) * gi * gi;
      p[i] -= lr_t * m[i] / (std::sqrt(v[i]) + eps);
    }
  }
  const auto got = w.to_vector(), other = torch_w.to_vector();
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_NEAR(got[i], p[i], 1e-12 * std::abs(p[i]) + 1e-15) << i;
    EXPECT_GT(std::abs(other[i] - p[i]), 1e-3 * std::abs(p[i])) << "PyTorch's placement should differ here, " << i;
  }
  EXPECT_EQ(torch.state_dict().count("group.0.keras_eps"), 0u);
  EXPECT_EQ(keras.state_dict().count("group.0.keras_eps"), 1u);
}

}  // namespace
}  // namespace minidl::optim
