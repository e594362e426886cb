// The autocast policy op by op (which dtype each front-end computes in, f16 and bf16), gradients
// reaching f32 masters as f32 and close to the f32 run's, and the weight cache: one f16 copy per weight per
// optimizer step however many forwards use it, never a stale one after a step.
#include <gtest/gtest.h>

#include <cmath>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/generator.h"
#include "core/ops.h"
#include "optim/sgd.h"

namespace minidl {
namespace {

// ||got - want|| / ||want||: gradients that are sums of cancelling terms have elements near zero,
// where an element-wise relative error means nothing.
double norm_rel_err(const Tensor& got, const Tensor& want) {
  const auto g = got.to_vector(), w = want.to_vector();
  double d = 0.0, n = 0.0;
  for (size_t i = 0; i < g.size(); ++i) {
    d += (g[i] - w[i]) * (g[i] - w[i]);
    n += w[i] * w[i];
  }
  return std::sqrt(d / std::max(n, 1e-30));
}

struct Net {  // conv -> bn -> relu -> global pool -> linear, f32 masters
  Tensor cw, bw, bb, rm, rv, fw, fb;
  explicit Net(uint64_t seed) {
    Generator gen(seed);
    cw = (randn(Shape{4, 3, 3, 3}, {}, &gen) * 0.3).set_requires_grad(true);
    bw = ones({4}).set_requires_grad(true);
    bb = zeros({4}).set_requires_grad(true);
    rm = zeros({4});
    rv = ones({4});
    fw = (randn(Shape{2, 4}, {}, &gen) * 0.5).set_requires_grad(true);
    fb = zeros({2}).set_requires_grad(true);
  }
  std::vector<Tensor> params() const { return {cw, bw, bb, fw, fb}; }
  Tensor forward(const Tensor& x) {
    Tensor h = conv2d(x, cw, Tensor(), {.padding = {1, 1}});
    h = relu(batch_norm(h, bw, bb, rm, rv, true));
    return linear(adaptive_avg_pool2d(h).flatten(1), fw, fb);
  }
};

void expect_op_policy(DType low) {
  SCOPED_TRACE(dtype_name(low));
  const Tensor x = randn(Shape{2, 3, 6, 6});
  const Tensor w = randn(Shape{4, 3, 3, 3});
  EXPECT_FALSE(autocast_enabled());
  EXPECT_EQ(conv2d(x, w).dtype(), DType::f32);
  AutocastGuard guard(low);
  EXPECT_TRUE(autocast_enabled());
  EXPECT_EQ(autocast_dtype(), low);
  const Tensor y = conv2d(x, w);
  EXPECT_EQ(y.dtype(), low);  // convolutions run in the low dtype
  EXPECT_EQ(matmul(randn(Shape{3, 4}), randn(Shape{4, 5})).dtype(), low);
  EXPECT_EQ(linear(randn(Shape{3, 4}), randn(Shape{5, 4}), randn(Shape{5})).dtype(), low);
  // Batch norm follows its input, statistics stay f32.
  Tensor rm = zeros({4}), rv = ones({4});
  const Tensor bn = batch_norm(y, ones({4}), zeros({4}), rm, rv, true);
  EXPECT_EQ(bn.dtype(), low);
  EXPECT_EQ(rm.dtype(), DType::f32);
  EXPECT_NE(rm.to_vector(), zeros({4}).to_vector());
  // Losses, softmax and sums in f32.
  const Tensor logits = randn(Shape{4, 3}).to(low);
  EXPECT_EQ(cross_entropy(logits, from_vector({0, 1, 2, 0}, {4}, {.dtype = DType::i64})).dtype(), DType::f32);
  EXPECT_EQ(log_softmax(logits, 1).dtype(), DType::f32);
  EXPECT_EQ(sum(logits).dtype(), DType::f32);
  EXPECT_EQ(binary_cross_entropy_with_logits(logits, ones({4, 3})).dtype(), DType::f32);
  // Other ops keep their input's dtype; mixed operands widen.
  EXPECT_EQ(relu(y).dtype(), low);
  EXPECT_EQ((y + y).dtype(), low);
  EXPECT_EQ((y + x.slice(1, 0, 1).slice(2, 0, 4).slice(3, 0, 4)).dtype(), DType::f32);
  // f64 is never touched.
  EXPECT_EQ(conv2d(x.to(DType::f64), w.to(DType::f64)).dtype(), DType::f64);
  {
    AutocastGuard off(low, false);
    EXPECT_FALSE(autocast_enabled());
    EXPECT_EQ(conv2d(x, w).dtype(), DType::f32);
  }
  EXPECT_TRUE(autocast_enabled());
}

TEST(Autocast, OpPolicy) { expect_op_policy(DType::f16); }

// bf16 autocast: the same op list, as PyTorch's CUDA autocast keeps one list for both dtypes.
TEST(Autocast, OpPolicyInBf16) { expect_op_policy(DType::bf16); }

// The reference is the f64 run on what autocast actually multiplies: the input and the cast
// weights rounded to f16 (batch norm's stay as they are). The gradient itself can be more
// sensitive to that input rounding than f16's precision (a few percent here), which is a property
// of the model, not of the arithmetic; against this reference only the arithmetic is measured.
void expect_master_gradients(DType low, double tol) {
  SCOPED_TRACE(dtype_name(low));
  autocast_clear_cache();
  const Tensor x = randn(Shape{4, 3, 8, 8});
  const Tensor target = from_vector({0, 1, 1, 0}, {4}, {.dtype = DType::i64});
  Net amp(5), ref(5);
  auto as_cast = [low](Tensor& t) {
    t = t.detach().to(low).to(DType::f64).set_requires_grad(true);
  };
  as_cast(ref.cw);
  as_cast(ref.fw);
  as_cast(ref.fb);
  ref.bw = ref.bw.detach().to(DType::f64).set_requires_grad(true);
  ref.bb = ref.bb.detach().to(DType::f64).set_requires_grad(true);
  ref.rm = ref.rm.to(DType::f64);
  ref.rv = ref.rv.to(DType::f64);
  cross_entropy(ref.forward(x.to(low).to(DType::f64)), target).backward();
  {
    AutocastGuard guard(low);
    const Tensor loss = cross_entropy(amp.forward(x), target);
    EXPECT_EQ(loss.dtype(), DType::f32);
    loss.backward();
  }
  const auto pr = ref.params(), pa = amp.params();
  for (size_t i = 0; i < pr.size(); ++i) {
    ASSERT_TRUE(pa[i].grad().defined()) << "param " << i;
    EXPECT_EQ(pa[i].dtype(), DType::f32);
    EXPECT_EQ(pa[i].grad().dtype(), DType::f32) << "param " << i;
    EXPECT_LT(norm_rel_err(pa[i].grad(), pr[i].grad()), tol) << "param " << i;
  }
  autocast_clear_cache();
}

TEST(Autocast, MasterGradientsAreF32AndMatchTheF64RunOnTheCastValues) { expect_master_gradients(DType::f16, 2e-3); }

// bf16 rounds the products' inputs and the stored activations to 8 significant bits instead of 11:
// the same reference, a looser bound.
TEST(Autocast, Bf16MasterGradientsAreF32AndMatchTheF64RunOnTheCastValues) {
  expect_master_gradients(DType::bf16, 2e-2);
}

TEST(Autocast, OneWeightCopyPerOptimizerStep) {
  autocast_clear_cache();
  reset_autocast_cache_stats();
  Net net(6);
  optim::SGD sgd(net.params(), optim::SgdOptions{.lr = 0.1});
  const Tensor target = from_vector({0, 1}, {2}, {.dtype = DType::i64});
  // The cast weights: conv weight, linear weight and bias (batch norm's stay f32).
  constexpr int64_t kCast = 3;
  AutocastGuard guard;
  for (int mb = 0; mb < 3; ++mb) {  // three micro-batches, three graphs over the same copies
    cross_entropy(net.forward(randn(Shape{2, 3, 5, 5})), target).backward();
  }
  AutocastCacheStats s = autocast_cache_stats();
  EXPECT_EQ(s.misses, kCast);
  EXPECT_EQ(s.hits, 2 * kCast);
  EXPECT_EQ(s.entries, kCast);
  EXPECT_EQ(s.bytes, (4 * 3 * 3 * 3 + 2 * 4 + 2) * 2);
  sgd.step();
  EXPECT_EQ(autocast_cache_stats().entries, 0);  // the step invalidates every copy
  // The next forward casts the updated weights, not the old ones.
  const Tensor x = randn(Shape{2, 3, 5, 5});
  const Tensor y = net.forward(x);
  EXPECT_EQ(autocast_cache_stats().misses, 2 * kCast);
  Tensor want;
  {
    AutocastGuard off(DType::f16, false);
    NoGradGuard ng;
    Tensor rm = net.rm.clone(), rv = net.rv.clone();
    Tensor h = conv2d(x.to(DType::f16), net.cw.to(DType::f16), Tensor(), {.padding = {1, 1}});
    h = relu(batch_norm(h, net.bw, net.bb, rm, rv, true));
    want = linear(adaptive_avg_pool2d(h).flatten(1), net.fw.to(DType::f16), net.fb.to(DType::f16));
  }
  EXPECT_EQ(y.to_vector(), want.to_vector());
  // zero_grad() starts a new step: the copies go (weights may change before the next forward).
  EXPECT_EQ(autocast_cache_stats().entries, kCast);
  sgd.zero_grad();
  EXPECT_EQ(autocast_cache_stats().entries, 0);
  // Without grad mode nothing is cached (evaluation does not pin copies).
  {
    NoGradGuard ng;
    net.forward(x);
  }
  EXPECT_EQ(autocast_cache_stats().entries, 0);
}

}  // namespace
}  // namespace minidl
