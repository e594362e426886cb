// Channels-last (NHWC) on the GPU against NCHW on the GPU and against the CPU: convolution's three
// passes on cuDNN NHWC descriptors (filters KRSC, no transposes: no copy launch at all), max, average
// and global average pooling in their NHWC kernels, and the elementwise ops and AMP casts that walk
// channels-last tensors as flat arrays (the vector kernels). kernels_cuda_emu runs it on the emulated
// device, whose cuDNN stand-in computes NHWC convolutions from the descriptors' own strides.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "core/autograd.h"
#include "core/ops.h"
#include "tests/support/conv_shape_case.h"
#include "tests/support/parity_helpers.h"

namespace minidl::testing::parity {
namespace {

// The launches of fn as "op / kernel" keys (empty in self-test mode, where nothing launches).
std::vector<std::string> launches_of(const std::function<void()>& fn) {
#ifdef MINIDL_WITH_CUDA
  if (!self_test()) {
    cuda::synchronize(0);
    cuda::take_launch_times();
    cuda::set_launch_timing(true);
    fn();
    cuda::set_launch_timing(false);
    std::vector<std::string> keys;
    for (const cuda::LaunchTime& t : cuda::take_launch_times()) keys.push_back(t.op + " / " + t.kernel);
    return keys;
  }
#endif
  fn();
  return {};
}

Tensor gpu_leaf(const Tensor& cpu, bool cl) {
  Tensor t = to_target(cpu);
  if (cl) t = to_channels_last(t).detach();
  t.set_requires_grad(true);
  return t;
}

struct Outputs {
  Tensor y, gx, gw;
};

// fn's forward and backward on the CPU: y, the random output gradient gy (seed), and x's gradient.
struct CpuReference {
  Tensor y, gy, gx;
};
CpuReference cpu_reference(const Tensor& x, const std::function<Tensor(const Tensor&)>& fn, uint64_t seed) {
  Tensor xc = x.clone().set_requires_grad(true);
  CpuReference r;
  r.y = fn(xc);
  r.gy = rnd(r.y.shape(), x.dtype(), seed);
  r.y.backward(r.gy);
  r.y = r.y.detach();
  r.gx = xc.grad();
  return r;
}

TEST_F(Parity, ChannelsLastConvolutionMatchesNchwAndTheCpu) {
  // A stem-like 7x7/2 on 3 channels, a 3x3 with multiples of 8 (tensor-core shapes in f16), a
  // strided 3x3, and a 1x1 (whose filters are both formats).
  for (const ConvShapeCase& c :
       {ConvShapeCase{{2, 3, 12, 12}, {8, 3, 7, 7}, 2, 3}, ConvShapeCase{{2, 8, 6, 6}, {16, 8, 3, 3}, 1, 1},
        ConvShapeCase{{3, 5, 7, 7}, {6, 5, 3, 3}, 2, 1}, ConvShapeCase{{2, 16, 5, 5}, {8, 16, 1, 1}, 1, 0}}) {
    for (DType dt : {DType::f32, DType::f16}) {
      const std::string tag = c.tag(dt);
      const Conv2dOptions o = c.opts();
      const Tensor x = rnd(c.x, dt, 1), w = rnd(c.w, dt, 2);
      Tensor xc = x.clone().set_requires_grad(true), wc = w.clone().set_requires_grad(true);
      const Tensor yc = conv2d(xc, wc, Tensor(), o);
      const Tensor gy = rnd(yc.shape(), dt, 3);
      yc.backward(gy);
      Outputs gpu[2];
      std::vector<std::string> keys;
      for (bool cl : {false, true}) {
        const Tensor xg = gpu_leaf(x, cl), wg = gpu_leaf(w, cl);
        const Tensor gyg = cl ? to_channels_last(to_target(gy)) : to_target(gy);
        Tensor yg;
        const auto k = launches_of([&] {
          yg = conv2d(xg, wg, Tensor(), o);
          yg.backward(gyg);
        });
        if (cl) keys = k;
        gpu[cl] = {yg.detach(), xg.grad(), wg.grad()};
        const double tol = tol_for(dt);
        EXPECT_TRUE(close(yc.detach(), yg.detach(), tol, tag + (cl ? " nhwc y" : " nchw y")));
        EXPECT_TRUE(close(xc.grad(), xg.grad(), tol, tag + (cl ? " nhwc gx" : " nchw gx")));
        EXPECT_TRUE(close(wc.grad(), wg.grad(), dt == DType::f16 ? 1e-2 : tol, tag + (cl ? " nhwc gw" : " nchw gw")));
      }
      EXPECT_TRUE(close(gpu[0].y.to(Device::cpu()), gpu[1].y, tol_for(dt), tag + " nhwc vs nchw y"));
      EXPECT_TRUE(is_channels_last(gpu[1].y) && is_channels_last(gpu[1].gx) && is_channels_last(gpu[1].gw)) << tag;
      // Three cuDNN calls and nothing else: no transpose, no copy.
      for (const std::string& key : keys) EXPECT_EQ(key.rfind("cuDNN conv", 0), 0u) << tag << ": " << key;
      if (!self_test()) {
        EXPECT_EQ(keys.size(), 3u) << tag;
      }
    }
  }
}

// A residual join as in a ResNet block: x feeds a convolution and, as the shortcut, the fused
// batch norm + add + ReLU. The shortcut's gradient arrives first; the convolution's data gradient
// is added into it by cuDNN (beta = 1, conv2d_backward_input_add) instead of the engine adding
// two buffers: no add launch in the backward, x's gradient as on the CPU, in both formats. In
// set_conv_nhwc's transposing mode (NCHW operands, NHWC copies for cuDNN) the backend declines and
// the engine adds, with the same result. With cuDNN autotuning, the shape's first call runs Find,
// which must time its candidates into a scratch output, not into the waiting gradient.
TEST_F(Parity, AResidualJoinAddsTheConvolutionsGradientIntoTheShortcuts) {
  const Conv2dOptions o{.stride = {1, 1}, .padding = {1, 1}};
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    for (int mode : {0, 1, 2, 3}) {   // NCHW, channels-last, NCHW through the transposing mode, autotuned
      const bool cl = mode == 1, transposing = mode == 2, autotuned = mode == 3;
      const std::string tag = std::string(dtype_name(dt)) +
                              (cl ? " nhwc" : transposing ? " transposing" : autotuned ? " nchw autotuned" : " nchw");
      const Tensor x = rnd({2, 8, 6, 6}, dt, 11), w = rnd({8, 8, 3, 3}, dt, 12), gy = rnd({2, 8, 6, 6}, dt, 13);
      const Tensor bw = rnd({8}, DType::f32, 14, 0.5, 1.5), bb = rnd({8}, DType::f32, 15);
      auto block = [&](const Tensor& xi, const Tensor& wi, const Tensor& bwi, const Tensor& bbi) {
        const Tensor rm = zeros({8}, {.device = xi.device()}), rv = ones({8}, {.device = xi.device()});
        return batch_norm_add_relu(conv2d(xi, wi, Tensor(), o), xi, bwi, bbi, rm, rv, true);
      };
      Tensor xc = x.clone().set_requires_grad(true);
      block(xc, w, bw, bb).backward(gy);
#ifdef MINIDL_WITH_CUDA
      if (!self_test()) {
        cuda::set_conv_nhwc(transposing);
        cuda::set_cudnn_benchmark(autotuned);
        cuda::clear_conv_algo_cache();   // every shape's plan is made by the calls below
      }
#endif
      const Tensor xg = gpu_leaf(x, cl), wg = gpu_leaf(w, cl);
      const Tensor gyg = cl ? to_channels_last(to_target(gy)) : to_target(gy);
      const Tensor yg = block(xg, wg, to_target(bw), to_target(bb));
      const auto keys = launches_of([&] { yg.backward(gyg); });
#ifdef MINIDL_WITH_CUDA
      if (!self_test()) {
        cuda::set_conv_nhwc(false);
        cuda::set_cudnn_benchmark(false);
      }
#endif
      const double tol = dt == DType::f16 ? 5e-3 : dt == DType::bf16 ? 3e-2 : tol_for(dt);
      EXPECT_TRUE(close(xc.grad(), xg.grad(), tol, tag + " gx"));
      int adds = 0, data_grads = 0;
      for (const std::string& key : keys) {
        adds += key.rfind("add / ", 0) == 0;
        data_grads += key.rfind("cuDNN conv backward data", 0) == 0;
      }
      if (!self_test()) {
        EXPECT_EQ(data_grads, 1) << tag;
        EXPECT_EQ(adds, transposing ? 1 : 0) << tag << ": the engine adds only where the backend declines";
      }
      if (HasFailure()) return;
    }
  }
}

TEST_F(Parity, ChannelsLastPoolingMatchesTheCpu) {
  // ResNet's stem pool: 3x3, stride 2, padding 1 (overlapping windows).
  const Pool2dOptions stem{.kernel = {3, 3}, .stride = {2, 2}, .padding = {1, 1}};
  const Pool2dOptions avg{
      .kernel = {2, 3}, .stride = {2, 2}, .padding = {1, 1}, .ceil_mode = true, .count_include_pad = false};
  const std::vector<std::pair<std::string, std::function<Tensor(const Tensor&)>>> ops = {
      {"max_pool2d", [&](const Tensor& t) { return max_pool2d(t, stem); }},
      {"avg_pool2d", [&](const Tensor& t) { return avg_pool2d(t, avg); }},
      {"adaptive_avg_pool2d", [](const Tensor& t) { return adaptive_avg_pool2d(t); }},
  };
  // Both index paths of the pooling kernels: FastDiv, and the 64-bit division that huge tensors take.
  for (const bool wide : {false, true}) {
#ifdef MINIDL_WITH_CUDA
    cuda::set_pool_wide_index(wide);
#endif
    for (const auto& [name, fn] : ops) {
      for (DType dt : {DType::f32, DType::f16, DType::f64}) {
        const std::string tag = name + " " + dtype_name(dt) + (wide ? " wide index" : "");
        const Tensor x = rnd({2, 6, 7, 9}, dt, 4);
        const CpuReference c = cpu_reference(x, fn, 5);
        const Tensor xg = gpu_leaf(x, true);
        const Tensor gyg = c.gy.size(2) * c.gy.size(3) > 1 ? to_channels_last(to_target(c.gy)) : to_target(c.gy);
        Tensor yg;
        const auto keys = launches_of([&] {
          yg = fn(xg);
          yg.backward(gyg);
        });
        EXPECT_TRUE(close(c.y, yg.detach(), tol_for(dt), tag + " y"));
        EXPECT_TRUE(close(c.gx, xg.grad(), tol_for(dt), tag + " gx"));
        if (name == "max_pool2d") {   // max pooling is exact: the CPU's bits, forward and backward
          EXPECT_EQ(c.y.to_vector(), yg.to_vector()) << tag;
          EXPECT_EQ(c.gx.to_vector(), xg.grad().to_vector()) << tag;
        }
        if (yg.size(2) * yg.size(3) > 1) {
          EXPECT_TRUE(prefers_channels_last(yg)) << tag << " " << shape_str(yg.strides());
        }
        EXPECT_TRUE(prefers_channels_last(xg.grad())) << tag << " " << shape_str(xg.grad().strides());
        for (const std::string& key : keys) EXPECT_EQ(key.find("copy"), std::string::npos) << tag << ": " << key;
      }
    }
  }
#ifdef MINIDL_WITH_CUDA
  cuda::set_pool_wide_index(false);
#endif
}

// Channels-last max pooling with the channels a multiple of the vector width takes V channels a
// thread (max_fwd_kernel<T, V>, max_bwd_gather_kernel<T, V>): the CPU's bits forward and backward,
// as one channel a thread (<T, 1>) gives them, with ties (few distinct values) and NaNs in windows.
TEST_F(Parity, ChannelsLastMaxPoolTakesAVectorOfChannelsAThread) {
  Pool2dOptions stem;
  stem.kernel = {3, 3};
  stem.stride = {2, 2};
  stem.padding = {1, 1};
  for (DType dt : {DType::f32, DType::f16, DType::f64}) {
    const std::string tag = std::string("max_pool2d ") + dtype_name(dt);
    std::vector<double> v = rnd({2, 16, 9, 7}, DType::f32, 8).mul_(3.0).to(DType::i64).to(DType::f32).to_vector();
    v[5] = v[300] = v[301] = NAN;
    const Tensor x = from_vector(v, {2, 16, 9, 7}).to(dt);
    const CpuReference c = cpu_reference(x, [&](const Tensor& t) { return max_pool2d(t, stem); }, 9);
    for (bool vector : {true, false}) {
#ifdef MINIDL_WITH_CUDA
      if (!self_test()) cuda::set_vector_pool(vector);
#endif
      const Tensor xg = gpu_leaf(x, true);
      Tensor yg;
      const auto keys = launches_of([&] {
        yg = max_pool2d(xg, stem);
        yg.backward(to_channels_last(to_target(c.gy)));
      });
      const std::string t = tag + (vector ? " vector" : " one channel a thread");
      EXPECT_TRUE(bit_equal(c.y, yg.detach(), t + " y"));
      EXPECT_TRUE(bit_equal(c.gx, xg.grad(), t + " gx"));
      if (!self_test()) {
        std::string all;
        for (const std::string& k : keys) all += k + "; ";
        const std::string inst = vector ? "V>" : "1>";   // the launch's text names the instantiation
        EXPECT_NE(all.find("max_fwd_kernel<T, " + inst), std::string::npos) << t << ": " << all;
        EXPECT_NE(all.find("max_bwd_gather_kernel<T, " + inst), std::string::npos) << t << ": " << all;
      }
    }
#ifdef MINIDL_WITH_CUDA
    if (!self_test()) cuda::set_vector_pool(true);
#endif
  }
}

// The global average pool of a channels-last batch with channels enough for a warp sums each (n, c)
// in a thread of its own (reduce_cols_kernel: neighbouring threads read neighbouring channels);
// its backward spreads the gradient without a strided kernel.
TEST_F(Parity, ChannelsLastGlobalAveragePoolReadsAlongTheChannels) {
  for (DType dt : {DType::f32, DType::f16, DType::f64}) {
    const std::string tag = std::string("adaptive_avg_pool2d ") + dtype_name(dt);
    const Tensor x = rnd({3, 40, 3, 5}, dt, 6);
    const CpuReference c = cpu_reference(x, [](const Tensor& t) { return adaptive_avg_pool2d(t); }, 7);
    const Tensor xg = gpu_leaf(x, true);
    Tensor yg;
    const auto keys = launches_of([&] {
      yg = adaptive_avg_pool2d(xg);
      yg.backward(to_target(c.gy));
    });
    EXPECT_TRUE(close(c.y, yg.detach(), tol_for(dt), tag + " y"));
    EXPECT_TRUE(close(c.gx, xg.grad(), tol_for(dt), tag + " gx"));
    EXPECT_TRUE(prefers_channels_last(xg.grad())) << tag << " " << shape_str(xg.grad().strides());
    if (!self_test()) {
      std::string all;
      for (const std::string& k : keys) all += k + "; ";
      EXPECT_NE(all.find("reduce_cols_kernel"), std::string::npos) << tag << ": " << all;
      EXPECT_EQ(all.find("binary_strided"), std::string::npos) << tag << ": " << all;
    }
  }
}

// Channels-last operands of one format walk as flat arrays: the vector kernels, as for NCHW.
TEST_F(Parity, ChannelsLastElementwiseOpsAndCastsUseTheVectorKernels) {
  const Tensor a = to_channels_last(to_target(rnd({2, 16, 5, 3}, DType::f32, 6)));
  const Tensor b = to_channels_last(to_target(rnd({2, 16, 5, 3}, DType::f32, 7)));
  Tensor sum_ab, r, h, back, hb, back_b;
  const auto keys = launches_of([&] {
    sum_ab = a + b;
    r = relu(a);
    h = a.to(DType::f16);
    back = h.to(DType::f32);
    hb = a.to(DType::bf16);
    back_b = hb.to(DType::f32);
  });
  for (const Tensor* t : {&sum_ab, &r, &h, &back, &hb, &back_b}) EXPECT_TRUE(prefers_channels_last(*t)) << t->meta();
  EXPECT_TRUE(close(a.to(Device::cpu()).contiguous() + b.to(Device::cpu()).contiguous(), sum_ab, 1e-7, "add"));
  EXPECT_TRUE(close(relu(a.to(Device::cpu())), r, 0.0, "relu"));
  if (self_test()) return;
  const std::vector<std::string> want = {"add / (binary_vec_kernel<T>)", "relu / (unary_vec_kernel<T>)",
                                         "copy f32->f16 / f32_to_f16_kernel", "copy f16->f32 / f16_to_f32_kernel",
                                         "copy f32->bf16 / f32_to_bf16_kernel", "copy bf16->f32 / bf16_to_f32_kernel"};
  EXPECT_EQ(keys, want);
}

}  // namespace
}  // namespace minidl::testing::parity
