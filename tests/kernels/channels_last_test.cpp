// Channels-last (NHWC) as a memory format on the CPU reference: every op of a ResNet step keeps a
// channels-last input channels-last in its output and gradients (no hidden .contiguous()), and
// gives the NCHW bits exactly (the CPU kernels run channels-last calls through NCHW copies). Also
// the factories and conversions that must keep the format (clone, to(DType), *_like) and the
// one that must not (contiguous()).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/autocast.h"
#include "core/autograd.h"
#include "core/generator.h"
#include "core/ops.h"
#include "tests/support/conv_shape_case.h"

namespace minidl {
namespace {

using testing::ConvShapeCase;

Tensor rnd(const Shape& s, uint64_t seed, DType dt = DType::f32) {
  Generator g(seed);
  return randn(s, {}, &g).to(dt);
}

// A leaf requiring grad: NCHW, or the same values in channels-last memory.
Tensor leaf(const Tensor& t, bool cl) {
  Tensor v = cl ? to_channels_last(t.detach()).detach() : t.detach().clone();
  v.set_requires_grad(true);
  return v;
}

void expect_cl(const Tensor& t, const std::string& what) {
  EXPECT_TRUE(prefers_channels_last(t)) << what << " lost the format: " << t.meta() << " strides "
                                        << shape_str(t.strides());
}

struct Pass {
  Tensor y, gx, gw;
};

Pass conv_pass(const Tensor& x0, const Tensor& w0, const Tensor& gy, const Conv2dOptions& o, bool x_cl, bool w_cl) {
  const Tensor x = leaf(x0, x_cl), w = leaf(w0, w_cl);
  Tensor y = conv2d(x, w, Tensor(), o);
  y.backward(x_cl || w_cl ? to_channels_last(gy) : gy);
  return {y.detach(), x.grad(), w.grad()};
}

TEST(ChannelsLastCpu, ConvAllThreePassesEqualNchwBitForBit) {
  for (const ConvShapeCase& c :
       {ConvShapeCase{{2, 3, 9, 9}, {8, 3, 3, 3}, 1, 1}, ConvShapeCase{{2, 6, 8, 8}, {4, 6, 3, 3}, 2, 1},
        ConvShapeCase{{3, 5, 5, 4}, {7, 5, 1, 1}, 1, 0}, ConvShapeCase{{1, 3, 11, 11}, {4, 3, 7, 7}, 2, 3}}) {
    for (DType dt : {DType::f32, DType::f64, DType::f16}) {
      const std::string tag = c.tag(dt);
      const Tensor x = rnd(c.x, 1, dt), w = rnd(c.w, 2, dt);
      const Conv2dOptions o = c.opts();
      const Shape y_shape = conv2d(x, w, Tensor(), o).shape();
      const Tensor gy = rnd(y_shape, 3, dt);
      const Pass nchw = conv_pass(x, w, gy, o, false, false);
      const Pass nhwc = conv_pass(x, w, gy, o, true, true);
      EXPECT_EQ(nchw.y.to_vector(), nhwc.y.to_vector()) << tag;
      EXPECT_EQ(nchw.gx.to_vector(), nhwc.gx.to_vector()) << tag;
      EXPECT_EQ(nchw.gw.to_vector(), nhwc.gw.to_vector()) << tag;
      if (y_shape[2] * y_shape[3] > 1) {
        expect_cl(nhwc.y, "conv2d output " + tag);
        expect_cl(nhwc.gx, "conv2d input gradient " + tag);
      }
      if (c.w[2] * c.w[3] > 1) expect_cl(nhwc.gw, "conv2d weight gradient " + tag);
      // A channels-last input with an NCHW weight: channels-last out, the weight's gradient in the
      // weight's own format (it is copied to KRSC for the call only).
      const Pass mixed = conv_pass(x, w, gy, o, true, false);
      EXPECT_EQ(nchw.y.to_vector(), mixed.y.to_vector()) << tag;
      EXPECT_EQ(nchw.gw.to_vector(), mixed.gw.to_vector()) << tag;
      EXPECT_TRUE(mixed.gw.is_contiguous()) << tag << ": " << shape_str(mixed.gw.strides());
    }
  }
}

TEST(ChannelsLastCpu, PoolingKeepsTheFormatAndTheBits) {
  const Pool2dOptions overlap{.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}};
  const Pool2dOptions ceil_avg{.kernel = {2, 3}, .stride = {2, 2}, .ceil_mode = true, .count_include_pad = false};
  using PoolFn = Tensor (*)(const Tensor&, const Pool2dOptions&);
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> ops = {
      {"max_pool2d 3/2/1", [&](const Tensor& t) { return max_pool2d(t, overlap); }},
      {"avg_pool2d ceil", [&](const Tensor& t) { return static_cast<PoolFn>(avg_pool2d)(t, ceil_avg); }},
      {"adaptive_avg_pool2d", [](const Tensor& t) { return adaptive_avg_pool2d(t); }},
  };
  for (const auto& [name, fn] : ops) {
    for (DType dt : {DType::f32, DType::f64, DType::f16}) {
      const std::string tag = name + " " + dtype_name(dt);
      const Tensor x0 = rnd({2, 5, 7, 9}, 4, dt);
      const Tensor a = leaf(x0, false), b = leaf(x0, true);
      const Tensor ya = fn(a), yb = fn(b);
      const Tensor gy = rnd(ya.shape(), 5, dt);
      ya.backward(gy);
      yb.backward(gy.size(2) * gy.size(3) > 1 ? to_channels_last(gy) : gy);
      EXPECT_EQ(ya.to_vector(), yb.to_vector()) << tag;
      EXPECT_EQ(a.grad().to_vector(), b.grad().to_vector()) << tag;
      if (ya.size(2) * ya.size(3) > 1) expect_cl(yb, tag + " output");
      expect_cl(b.grad(), tag + " input gradient");
    }
  }
}

TEST(ChannelsLastCpu, ElementwiseOutputsFollowTheFirstFullShapeOperand) {
  const Tensor a = to_channels_last(rnd({2, 4, 3, 5}, 6)), b = to_channels_last(rnd({2, 4, 3, 5}, 7));
  const Tensor nchw = rnd({2, 4, 3, 5}, 8), bias = rnd({1, 4, 1, 1}, 9);
  expect_cl(a + b, "channels-last + channels-last");
  expect_cl(a + bias, "channels-last + a broadcast bias");
  expect_cl(bias + a, "a broadcast bias + channels-last");
  expect_cl(a * 2.0, "channels-last * scalar");
  expect_cl(relu(a), "relu");
  expect_cl(a.to(DType::f16), "to(f16)");
  expect_cl(a.clone(), "clone");
  expect_cl(zeros_like(a), "zeros_like");
  expect_cl(empty_like(a), "empty_like");
  expect_cl(a.to(DType::f16).to(DType::f32), "the AMP casts back");
  EXPECT_TRUE((nchw + a).is_contiguous()) << "a contiguous first operand decides";
  EXPECT_TRUE(a.contiguous().is_contiguous()) << "contiguous() must give NCHW";
  EXPECT_EQ((a + b).to_vector(), (a.contiguous() + b.contiguous()).to_vector());
  EXPECT_EQ(relu(a).to_vector(), relu(a.contiguous()).to_vector());
  // ReLU's backward and the residual add's gradient keep the format too.
  const Tensor x = leaf(rnd({2, 4, 3, 5}, 10), true), r = leaf(rnd({2, 4, 3, 5}, 11), true);
  relu(x + r).backward(to_channels_last(rnd({2, 4, 3, 5}, 12)));
  expect_cl(x.grad(), "relu(x + r)'s gradient of x");
  expect_cl(r.grad(), "relu(x + r)'s gradient of r");
  // Under autocast, f32 channels-last activations cast to f16 channels-last.
  AutocastGuard ag(DType::f16, true);
  const Tensor xw = leaf(rnd({2, 4, 6, 6}, 13), true), ww = leaf(rnd({3, 4, 3, 3}, 14), true);
  const Tensor y = conv2d(xw, ww, Tensor(), Conv2dOptions{.padding = {1, 1}});
  EXPECT_EQ(y.dtype(), DType::f16);
  expect_cl(y, "an autocast conv2d's f16 output");
}

TEST(ChannelsLastCpu, PlainBatchNormKeepsTheFormatAndTheBits) {
  for (bool training : {true, false}) {
    const Tensor x0 = rnd({3, 4, 5, 6}, 15) * 2.0 + 0.5;
    std::vector<std::vector<double>> out[2];
    for (bool cl : {false, true}) {
      const Tensor x = leaf(x0, cl), w = leaf(rnd({4}, 16), false), b = leaf(rnd({4}, 17), false);
      Tensor rm = zeros({4}), rv = ones({4});
      const Tensor y = batch_norm(x, w, b, rm, rv, training);
      if (cl) expect_cl(y, std::string("batch_norm output, training ") + (training ? "on" : "off"));
      y.backward(cl ? to_channels_last(rnd(y.shape(), 18)) : rnd(y.shape(), 18));
      if (cl) expect_cl(x.grad(), "batch_norm input gradient");
      out[cl] = {y.to_vector(), x.grad().to_vector(), w.grad().to_vector(), rm.to_vector(), rv.to_vector()};
    }
    EXPECT_EQ(out[0], out[1]) << "training " << training;
  }
}

TEST(ChannelsLastCpu, FormatHelpers) {
  const Tensor a = rnd({2, 3, 4, 5}, 19);
  EXPECT_FALSE(is_channels_last(a));
  const Tensor c = to_channels_last(a);
  EXPECT_EQ(c.strides(), (Shape{60, 1, 15, 3}));
  EXPECT_TRUE(c.same(to_channels_last(c))) << "already channels-last: itself";
  EXPECT_EQ(c.to_vector(), a.to_vector());
  // [N, C, 1, 1] and C == 1 tensors are both formats: neither op prefers channels-last for them.
  const Tensor pooled = to_channels_last(rnd({2, 3, 1, 1}, 20)), mono = rnd({2, 1, 4, 4}, 21);
  EXPECT_TRUE(is_channels_last(pooled) && pooled.is_contiguous() && !prefers_channels_last(pooled));
  EXPECT_TRUE(is_channels_last(mono) && !prefers_channels_last(mono));
  EXPECT_TRUE(same_memory_order(c, empty_channels_last(c.shape())));
  EXPECT_FALSE(same_memory_order(c, a));
  EXPECT_THROW(empty_channels_last({2, 3}), Error);
}

}  // namespace
}  // namespace minidl
