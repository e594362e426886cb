// nn::Module and the layers: the naming, ordering and state_dict behaviour that checkpoint
// interchange with PyTorch rests on, the per-layer summary the memory planner reads, and the
// PyTorch default initialisation bounds.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "tests/support/error_of.h"
#include "core/autograd.h"
#include "core/backend.h"
#include "core/ops.h"
#include "nn/init.h"
#include "nn/layers.h"
#include "nn/module.h"
#include "tests/nn/small_net.h"

namespace minidl::nn {
namespace {

using testing::small_net;

std::vector<std::string> names_of(const std::vector<std::pair<std::string, Tensor>>& v) {
  std::vector<std::string> out;
  for (const auto& [n, t] : v) out.push_back(n);
  return out;
}

using ::minidl::testing::error_of;

TEST(ModuleTest, NamesFollowPyTorchOrder) {
  Generator gen(1);
  auto net = small_net(gen);
  EXPECT_EQ(names_of(net->named_parameters()),
            (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "5.weight", "5.bias"}));
  EXPECT_EQ(names_of(net->named_buffers()),
            (std::vector<std::string>{"1.running_mean", "1.running_var", "1.num_batches_tracked"}));
  EXPECT_EQ(names_of(net->ordered_state_dict()),
            (std::vector<std::string>{"0.weight", "0.bias", "1.weight", "1.bias", "1.running_mean", "1.running_var",
                                      "1.num_batches_tracked", "5.weight", "5.bias"}));
  EXPECT_EQ(net->num_parameters(), 4 * 3 * 9 + 4 + 4 + 4 + 64 * 5 + 5);
  EXPECT_EQ(net->parameter_bytes(), 4 * net->num_parameters()) << "f32 parameters; buffers are not parameters";
  for (const Tensor& p : net->parameters()) {
    EXPECT_TRUE(p.requires_grad());
    EXPECT_TRUE(p.is_leaf());
  }
  const auto sd = net->state_dict();
  EXPECT_EQ(sd.size(), 9u);
  EXPECT_FALSE(sd.at("0.weight").requires_grad());
  EXPECT_EQ(sd.at("0.weight").storage(), net->named_parameters()[0].second.storage());
  EXPECT_EQ(sd.at("1.num_batches_tracked").dtype(), DType::i64);
  EXPECT_EQ(sd.at("1.num_batches_tracked").dim(), 0);
  const auto mods = net->named_modules();
  ASSERT_EQ(mods.size(), 7u);
  EXPECT_EQ(mods[0].first, "");
  EXPECT_EQ(mods[6].first, "5");
}

TEST(ModuleTest, RejectsBadNames) {
  Sequential s;
  s.register_buffer("a", zeros({1}));
  EXPECT_NE(error_of([&] { s.register_parameter("a", zeros({1})); }).find("already used"), std::string::npos);
  EXPECT_NE(error_of([&] { s.register_buffer("x.y", zeros({1})); }).find("contain no '.'"), std::string::npos);
  EXPECT_NE(error_of([&] { (void)s.child("nope"); }).find("no child module named 'nope'"), std::string::npos);
}

TEST(ModuleTest, TrainEvalIsRecursive) {
  Generator gen(2);
  auto net = std::make_shared<Sequential>();
  auto inner = std::make_shared<Sequential>(std::vector<std::shared_ptr<Module>>{std::make_shared<BatchNorm2d>(2)});
  net->push_back(inner);
  EXPECT_TRUE((*inner)[0]->is_training());
  net->eval();
  EXPECT_FALSE(net->is_training());
  EXPECT_FALSE((*inner)[0]->is_training());
  net->train();
  EXPECT_TRUE((*inner)[0]->is_training());
}

TEST(ModuleTest, LoadStateDictCopiesInPlace) {
  Generator g1(1), g2(2);
  auto a = small_net(g1);
  auto b = small_net(g2);
  const Tensor a_w = a->named_parameters()[0].second;
  EXPECT_FALSE(allclose(a_w, b->named_parameters()[0].second));
  a->load_state_dict(b->state_dict());
  EXPECT_TRUE(a_w.same(a->named_parameters()[0].second));  // same handle: an optimizer keeps working
  EXPECT_TRUE(a_w.requires_grad() && a_w.is_leaf());
  for (const auto& [name, t] : b->state_dict()) EXPECT_TRUE(allclose(a->state_dict().at(name), t)) << name;
}

TEST(ModuleTest, LoadStateDictListsEveryProblem) {
  Generator gen(3);
  auto net = small_net(gen);
  auto sd = net->state_dict();
  sd.erase("0.bias");
  sd.erase("1.running_var");
  sd["extra.weight"] = zeros({1});
  sd["5.weight"] = zeros({4, 4});
  sd["1.num_batches_tracked"] = zeros({});  // f32 instead of i64
  const std::string msg = error_of([&] { net->load_state_dict(sd); });
  for (const char* part : {"2 missing keys", "0.bias", "1.running_var", "1 unexpected keys", "extra.weight",
                           "2 shape/dtype mismatches", "5.weight (expected f32[5, 64], got f32[4, 4])",
                           "1.num_batches_tracked (expected i64[], got f32[])"}) {
    EXPECT_NE(msg.find(part), std::string::npos) << part << " not in: " << msg;
  }
  // Non-strict loading skips missing and unexpected keys but never a mismatch.
  EXPECT_FALSE(error_of([&] { net->load_state_dict(sd, false); }).empty());
  auto partial = net->state_dict();
  partial.erase("5.weight");
  partial["junk"] = zeros({3});
  EXPECT_EQ(error_of([&] { net->load_state_dict(partial, false); }), "");
}

// A checkpoint of another model can differ in hundreds of keys: the message stays one short line,
// the counts with the first three of each kind (issue 30: 122 keys in 3,483 characters).
TEST(ModuleTest, LoadStateDictNamesTheFirstThreeOfEachKind) {
  Generator gen(5);
  auto net = small_net(gen);
  std::map<std::string, Tensor> other;
  for (int i = 0; i < 120; ++i) other["other.layer" + std::to_string(100 + i) + ".weight"] = zeros({1});
  const std::string msg = error_of([&] { net->load_state_dict(other); });
  const StateDictDiff d = net->compare_state_dict(other);
  EXPECT_EQ(d.unexpected.size(), 120u);
  EXPECT_NE(msg.find(std::to_string(d.missing.size()) + " missing keys [" + d.missing[0] + ", " + d.missing[1] + ", " +
                     d.missing[2] + ", ...], 120 unexpected keys [other.layer100.weight, other.layer101.weight, "
                     "other.layer102.weight, ...], 0 shape/dtype mismatches []"),
            std::string::npos)
      << msg;
  EXPECT_EQ(msg.find("other.layer103"), std::string::npos) << msg;
  EXPECT_LT(msg.size(), 600u) << msg;
  EXPECT_TRUE(net->compare_state_dict(net->state_dict()).empty());
}

TEST(ModuleTest, ZeroGrad) {
  Generator gen(4);
  auto net = small_net(gen);
  Tensor x = randn({2, 3, 8, 8}, {}, &gen);
  sum((*net)(x)).backward();
  for (const Tensor& p : net->parameters()) EXPECT_TRUE(p.grad().defined());
  net->to(Device::cpu());  // same device: nothing changes
  for (const Tensor& p : net->parameters()) EXPECT_TRUE(p.grad().defined());
  net->zero_grad();
  for (const Tensor& p : net->parameters()) EXPECT_FALSE(p.grad().defined());
}

// to(DType) converts in place like to(Device): an optimizer holding parameters() before the
// conversion must update the tensors the model computes with, so the handles must stay valid.
TEST(ModuleTest, ToDTypeKeepsParameterIdentity) {
  Generator gen(4);
  auto net = small_net(gen);
  const Tensor x = randn({2, 3, 8, 8}, {}, &gen);
  sum((*net)(x)).backward();
  const auto params = net->parameters();
  const Tensor w = params[0];
  const Tensor before = w.detach().clone();
  const Tensor running_var = net->named_buffers()[1].second;
  const Tensor counter = net->named_buffers()[2].second;
  EXPECT_EQ(&net->to(DType::f64), net.get());
  for (const Tensor& p : params) {
    EXPECT_EQ(p.dtype(), DType::f64);
    EXPECT_TRUE(p.is_leaf() && p.requires_grad());
    EXPECT_EQ(p.grad().dtype(), DType::f64);  // gradients are converted, not dropped
  }
  EXPECT_EQ(net->parameters()[0].impl_ptr(), w.impl_ptr());
  EXPECT_EQ(running_var.dtype(), DType::f64);
  EXPECT_EQ(counter.dtype(), DType::i64);  // a counter, not a statistic
  EXPECT_EQ(counter.item<int64_t>(), 1);
  EXPECT_TRUE(allclose(w, before.to(DType::f64), 0, 0));  // f32 -> f64 is exact

  // Forward and backward in f64 reach the same handles.
  net->zero_grad();
  const Tensor y = (*net)(x.to(DType::f64));
  EXPECT_EQ(y.dtype(), DType::f64);
  EXPECT_EQ(y.shape(), (Shape{2, 5}));
  sum(y).backward();
  EXPECT_EQ(w.grad().dtype(), DType::f64);
  EXPECT_EQ(counter.item<int64_t>(), 2);

  net->to(DType::f32);
  EXPECT_EQ(w.dtype(), DType::f32);
  EXPECT_EQ(w.grad().dtype(), DType::f32);
  EXPECT_EQ(running_var.dtype(), DType::f32);
  EXPECT_EQ(counter.dtype(), DType::i64);
  EXPECT_TRUE(allclose(w, before, 0, 0));  // no optimizer step ran: the round trip is exact
  EXPECT_EQ((*net)(x).dtype(), DType::f32);

  const std::string err = error_of([&] { net->to(DType::i64); });
  EXPECT_NE(err.find("only floating dtypes"), std::string::npos) << err;
  EXPECT_EQ(w.dtype(), DType::f32);  // the refused request changed nothing
}

TEST(ModuleTest, SummaryRowsPerLeaf) {
  Generator gen(5);
  auto net = small_net(gen);
  const Summary s = net->summary({32, 3, 8, 8});
  ASSERT_EQ(s.rows.size(), 6u);
  EXPECT_EQ(s.rows[0].name, "0");
  EXPECT_EQ(s.rows[0].type, "Conv2d");
  EXPECT_EQ(s.rows[0].output_shape, (Shape{1, 4, 8, 8}));
  EXPECT_EQ(s.rows[0].num_parameters, 4 * 27 + 4);
  const int64_t fmap = 4 * 8 * 8 * 4;  // bytes of one [1,4,8,8] f32 map
  EXPECT_EQ(s.rows[0].saved_bytes_per_sample, 3 * 8 * 8 * 4);  // the convolution saves its input
  EXPECT_GE(s.rows[1].saved_bytes_per_sample, fmap);           // input plus batch statistics
  EXPECT_LE(s.rows[1].saved_bytes_per_sample, fmap + 64);
  EXPECT_EQ(s.rows[2].saved_bytes_per_sample, fmap);           // ReLU keeps one map
  EXPECT_GT(s.rows[3].saved_bytes_per_sample, 0);              // argmax indices on the CPU
  EXPECT_LE(s.rows[3].saved_bytes_per_sample, fmap + fmap / 4);
  EXPECT_EQ(s.rows[4].saved_bytes_per_sample, 0);              // a view saves nothing
  EXPECT_EQ(s.rows[5].saved_bytes_per_sample, 64 * 4);         // Linear saves its input
  EXPECT_EQ(s.rows[5].output_shape, (Shape{1, 5}));
  EXPECT_EQ(s.total_parameters, net->num_parameters());
  EXPECT_GE(s.total_saved_bytes_per_sample, 2 * fmap);
  // The probe left the batch-norm statistics as they were.
  const auto sd = net->state_dict();
  EXPECT_EQ(sd.at("1.num_batches_tracked").item<int64_t>(), 0);
  EXPECT_EQ(max(abs(sd.at("1.running_mean"))).item(), 0.0);
  const std::string table = s.str();
  EXPECT_NE(table.find("BatchNorm2d"), std::string::npos);
  EXPECT_NE(table.find("[1, 4, 4, 4]"), std::string::npos);
}

TEST(LayerTest, DefaultInitBounds) {
  Generator gen(6);
  Conv2d conv(16, 32, 3, 1, 0, 1, true, &gen);
  const double bound = 1.0 / std::sqrt(16.0 * 9.0);
  for (const Tensor& t : {conv.weight(), conv.bias()}) {
    EXPECT_LE(max(abs(t)).item(), bound);
  }
  // uniform(+-b) has std b / sqrt(3).
  const double std_w = std::sqrt(mean(square(conv.weight())).item());
  EXPECT_NEAR(std_w, bound / std::sqrt(3.0), 0.05 * bound);
  Linear fc(100, 10, true, &gen);
  EXPECT_LE(max(abs(fc.weight())).item(), 0.1);
  EXPECT_LE(max(abs(fc.bias())).item(), 0.1);
  Tensor w = empty({64, 32, 3, 3});
  init::kaiming_normal_(w, 0.0, init::FanMode::FanOut, &gen);
  EXPECT_NEAR(std::sqrt(mean(square(w)).item()), std::sqrt(2.0 / (64 * 9)), 0.02 * std::sqrt(2.0 / (64 * 9)));
  // The same seed gives the same weights.
  Generator again(6);
  Conv2d conv2(16, 32, 3, 1, 0, 1, true, &again);
  EXPECT_TRUE(allclose(conv.weight(), conv2.weight(), 0, 0));
}

TEST(LayerTest, BatchNormTracksBatches) {
  Generator gen(7);
  BatchNorm2d bn(3);
  Tensor x = randn({4, 3, 2, 2}, {}, &gen) * 2.0 + 1.0;
  bn(x);
  bn(x);
  EXPECT_EQ(bn.num_batches_tracked().item<int64_t>(), 2);
  EXPECT_GT(mean(bn.running_mean()).item(), 0.1);
  bn.eval();
  const Tensor before = bn.running_mean().clone();
  Tensor y = bn(x);
  EXPECT_EQ(bn.num_batches_tracked().item<int64_t>(), 2);
  EXPECT_TRUE(allclose(bn.running_mean(), before, 0, 0));
  EXPECT_EQ(y.shape(), x.shape());
}

TEST(LayerTest, DropoutPoolingFlattenSequential) {
  Generator gen(8);
  Dropout drop(0.5, &gen);
  Tensor x = ones({1000});
  const double zeros_frac = mean(eq(drop(x), zeros({1000})).to(DType::f32)).item();
  EXPECT_NEAR(zeros_frac, 0.5, 0.08);
  drop.eval();
  EXPECT_TRUE(allclose(drop(x), x, 0, 0));
  Tensor img = randn({2, 3, 8, 8}, {}, &gen);
  EXPECT_EQ(MaxPool2d(3, 2, 1)(img).shape(), (Shape{2, 3, 4, 4}));
  EXPECT_EQ(AvgPool2d(2)(img).shape(), (Shape{2, 3, 4, 4}));
  EXPECT_EQ(AdaptiveAvgPool2d(1)(img).shape(), (Shape{2, 3, 1, 1}));
  EXPECT_EQ(Flatten()(img).shape(), (Shape{2, 192}));
  Sequential seq({std::make_shared<ReLU>(), std::make_shared<Flatten>()});
  EXPECT_EQ(seq.size(), 2u);
  EXPECT_EQ(seq[1]->type_name(), "Flatten");
  EXPECT_EQ(seq(img).shape(), (Shape{2, 192}));
}

TEST(LayerTest, ShapeErrorsNameTheLayer) {
  Generator gen(9);
  Conv2d conv(3, 8, 3, 1, 0, 1, false, &gen);
  EXPECT_NE(error_of([&] { conv(zeros({1, 4, 8, 8})); }).find("Conv2d(3 -> 8, kernel 3): expected input [N, 3, H, W]"),
            std::string::npos);
  Linear fc(10, 2, true, &gen);
  EXPECT_NE(error_of([&] { fc(zeros({1, 3, 4})); }).find("Flatten"), std::string::npos);
  EXPECT_NE(error_of([&] { BatchNorm2d(4)(zeros({2, 3, 2, 2})); }).find("BatchNorm2d(4)"), std::string::npos);
}

}  // namespace
}  // namespace minidl::nn
