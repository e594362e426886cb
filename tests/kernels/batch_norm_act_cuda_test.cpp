// CPU-vs-CUDA parity of the fused batch norm + (residual add) + ReLU kernels (kernels/cuda/
// batch_norm.cu, batch_norm_backward.cu): the fused op against the CPU's, against the composed ops
// on the GPU, and channels-last against NCHW, in f32, f16 (f32 parameters) and f64, training and
// evaluation, forward and backward, with plane sizes and channel counts that pick every vector
// width and the scalar tails, and several blocks per channel (forced, so the cross-block sums run
// on small tensors). kernels_cuda_emu runs it on the emulated device, where every GPU thread is a
// fiber: the shapes stay small.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "core/autograd.h"
#include "core/ops.h"
#include "tests/support/parity_helpers.h"

namespace minidl {
namespace {

using namespace testing::parity;   // NOLINT: the shared harness (tests/support/parity_helpers.h)

// Blocks per channel of the GPU kernels (0: sized to fill the GPU); nothing in self-test mode.
void set_split(int blocks) {
#ifdef MINIDL_WITH_CUDA
  if (!self_test()) cuda::set_batch_norm_split(blocks);
#else
  (void)blocks;
#endif
}

class BatchNormActParity : public Parity {
 protected:
  void TearDown() override { set_split(0); }
};

struct Case {
  Shape shape;
  DType dt;
  bool residual;
  bool training;
  std::string str() const {
    return shape_str(shape) + " " + dtype_name(dt) + (residual ? " +residual" : "") + (training ? " train" : " eval");
  }
};

// Values made once on the CPU, so every run of a case sees the same bits.
struct Inputs {
  Tensor x, r, w, b, rm, rv, gy;
};

Inputs make_inputs(const Case& c, uint64_t seed) {
  const int64_t C = c.shape[1];
  const DType pd = c.dt == DType::f16 ? DType::f32 : c.dt;
  Inputs in;
  in.x = (rnd(c.shape, DType::f32, seed) * 3.0 + 1.0).to(c.dt);
  in.r = rnd(c.shape, DType::f32, seed + 1).to(c.dt);
  in.w = rnd({C}, pd, seed + 2, 0.5, 1.5);
  in.b = rnd({C}, pd, seed + 3, -0.5, 0.5);
  in.rm = rnd({C}, pd, seed + 4);
  in.rv = rnd({C}, pd, seed + 5, 0.5, 2.0);
  in.gy = rnd(c.shape, DType::f32, seed + 6).to(c.dt);
  return in;
}

Tensor on(const Tensor& t, Device d) { return d == Device::cpu() ? t.clone() : to_target(t); }

Tensor leaf(const Tensor& t, Device d, bool channels_last) {
  Tensor v = on(t, d);
  if (channels_last) v = to_channels_last(v).detach();
  v.set_requires_grad(true);
  return v;
}

struct Result {
  Tensor y, gx, gr, gw, gb, rm, rv;
};

// One forward and backward: fused (batch_norm_relu / batch_norm_add_relu) or composed
// (relu(batch_norm(x) [+ r])), with x and the residual in channels-last memory when asked.
Result run(const Inputs& in, const Case& c, Device d, bool fused, bool channels_last) {
  const Tensor x = leaf(in.x, d, channels_last), w = leaf(in.w, d, false), b = leaf(in.b, d, false);
  const Tensor r = c.residual ? leaf(in.r, d, channels_last) : Tensor();
  Result out;
  out.rm = on(in.rm, d);
  out.rv = on(in.rv, d);
  if (fused) {
    out.y = c.residual ? batch_norm_add_relu(x, r, w, b, out.rm, out.rv, c.training)
                       : batch_norm_relu(x, w, b, out.rm, out.rv, c.training);
  } else {
    const Tensor z = batch_norm(x, w, b, out.rm, out.rv, c.training);
    out.y = relu(c.residual ? z + r : z);
  }
  out.y.backward(on(in.gy, d));
  out.gx = x.grad();
  out.gr = c.residual ? r.grad() : Tensor();
  out.gw = w.grad();
  out.gb = b.grad();
  return out;
}

// a against b (b on the device under test) with the dtype's tolerances: f16 activations round
// once more in the composed ops, and their gradients carry f16's resolution.
void expect_same(const Result& a, const Result& b, const Case& c, const std::string& what) {
  const std::string tag = what + " " + c.str();
  const double tol = c.dt == DType::f64 ? 1e-10 : c.dt == DType::f16 ? 2e-3 : 1e-5;
  const double gtol = c.dt == DType::f16 ? 5e-3 : tol;
  EXPECT_TRUE(close(a.y, b.y, tol, tag + " forward"));
  EXPECT_TRUE(close(a.gx, b.gx, gtol, tag + " grad x"));
  if (c.residual) {
    EXPECT_TRUE(close(a.gr, b.gr, gtol, tag + " grad residual"));
  }
  EXPECT_TRUE(close(a.gw, b.gw, gtol, tag + " grad weight"));
  EXPECT_TRUE(close(a.gb, b.gb, gtol, tag + " grad bias"));
  const double stol = c.dt == DType::f64 ? 1e-12 : 1e-6;
  EXPECT_TRUE(close(a.rm, b.rm, stol, tag + " running_mean"));
  EXPECT_TRUE(close(a.rv, b.rv, stol, tag + " running_var"));
}

// Plane sizes and channel counts that reach each access width: [2, 5, 3, 7] odd everywhere
// (scalar), [2, 16, 4, 4] 16-byte vectors in both layouts, [2, 6, 2, 6] 8-byte f16 / 16-byte
// f32 planes and 8-byte f32 rows, [2, 6, 2, 3] 8-byte f32 planes, [8, 6] a 2-d input (rows).
const std::vector<Shape> kShapes{{2, 5, 3, 7}, {2, 16, 4, 4}, {2, 6, 2, 6}, {2, 6, 2, 3}, {8, 6}};

TEST_F(BatchNormActParity, FusedMatchesTheCpuAndTheComposedOpsInBothLayouts) {
  uint64_t seed = 10;
  for (DType dt : {DType::f32, DType::f16}) {
    for (const Shape& s : kShapes) {
      for (bool residual : {false, true}) {
        for (bool training : {true, false}) {
          const Case c{s, dt, residual, training};
          const Inputs in = make_inputs(c, seed += 10);
          const Result cpu = run(in, c, Device::cpu(), true, false);
          const Result gpu = run(in, c, kGpu, true, false);
          expect_same(cpu, gpu, c, "fused cpu vs fused gpu");
          expect_same(run(in, c, kGpu, false, false), gpu, c, "composed gpu vs fused gpu");
          if (s.size() == 4) {
            const Result nhwc = run(in, c, kGpu, true, true);
            EXPECT_TRUE(is_channels_last(nhwc.y) && !nhwc.y.is_contiguous()) << c.str() << ": " << nhwc.y.meta();
            expect_same(gpu, nhwc, c, "fused gpu nchw vs nhwc");
          }
          if (HasFailure()) return;
        }
      }
    }
  }
}

TEST_F(BatchNormActParity, Float64MatchesTheCpuToRounding) {
  for (bool channels_last : {false, true}) {
    const Case c{{3, 5, 2, 3}, DType::f64, true, true};
    const Inputs in = make_inputs(c, 7);
    expect_same(run(in, c, Device::cpu(), true, false), run(in, c, kGpu, true, channels_last), c,
                channels_last ? "f64 cpu vs gpu nhwc" : "f64 cpu vs gpu");
  }
}

// Several blocks per channel sum partial sums in a fixed order: the result is the one-block
// result to rounding, and the same bits on every run.
void expect_split_like_one_block(DType dt, const Shape& s, uint64_t seed, int split) {
  for (bool channels_last : {false, true}) {
    const Case c{s, dt, true, true};
    const Inputs in = make_inputs(c, seed);
    set_split(1);
    const Result one = run(in, c, kGpu, true, channels_last);
    set_split(split);
    const Result a = run(in, c, kGpu, true, channels_last);
    const Result b = run(in, c, kGpu, true, channels_last);
    set_split(0);
    const std::string tag = std::string(channels_last ? "nhwc " : "nchw ") + c.str();
    expect_same(one, a, c, "1 vs " + std::to_string(split) + " blocks per channel, " + tag);
    EXPECT_TRUE(bit_equal(a.y, b.y, tag + " y, run twice"));
    EXPECT_TRUE(bit_equal(a.gx, b.gx, tag + " gx, run twice"));
    EXPECT_TRUE(bit_equal(a.gw, b.gw, tag + " gw, run twice"));
    EXPECT_TRUE(bit_equal(a.rv, b.rv, tag + " running_var, run twice"));
  }
}

TEST_F(BatchNormActParity, SeveralBlocksPerChannelAreDeterministic) {
  for (DType dt : {DType::f32, DType::f16}) {
    expect_split_like_one_block(dt, {4, 6, 4, 4}, 3, 3);
    if (HasFailure()) return;
  }
}

// More than 128 partials per channel: the finalize kernels give each channel a whole block
// (finalize_lanes) instead of a warp.
TEST_F(BatchNormActParity, ManyPartialsPerChannelAreSummedByABlock) {
  expect_split_like_one_block(DType::f32, {2, 6, 4, 4}, 5, 130);
}

// Channels-last rows with 8-byte accesses (the default: 4 f16 or 2 f32 channels a thread) give
// the 16-byte kernels' results to rounding (set_batch_norm_rows_bytes(16)); other widths are refused.
TEST_F(BatchNormActParity, ChannelsLastRowsWithEightByteAccesses) {
#ifdef MINIDL_WITH_CUDA
  if (self_test()) GTEST_SKIP() << "a CUDA switch";
  EXPECT_THROW(cuda::set_batch_norm_rows_bytes(4), Error);
  for (DType dt : {DType::f32, DType::f16}) {
    for (const Shape& s : {Shape{2, 16, 4, 4}, Shape{2, 6, 2, 6}}) {
      const Case c{s, dt, true, true};
      const Inputs in = make_inputs(c, 9);
      // The widest of `bytes`, 8 bytes or one element whose count divides the row of C channels.
      const int esize = static_cast<int>(dtype_size(dt));
      auto widest = [&](int bytes) {
        for (int b : {bytes, 8}) {
          if (b <= bytes && s[1] % (b / esize) == 0) return b / esize;
        }
        return 1;
      };
      const Tensor xl = to_channels_last(to_target(in.x)), xp = to_target(in.x);
      cuda::set_batch_norm_rows_bytes(16);
      EXPECT_EQ(cuda::batch_norm_access_width(xl), widest(16)) << c.str();
      const int planar = cuda::batch_norm_access_width(xp);
      const Result wide = run(in, c, kGpu, true, true);
      cuda::set_batch_norm_rows_bytes(8);
      EXPECT_EQ(cuda::batch_norm_access_width(xl), widest(8)) << c.str();
      EXPECT_EQ(cuda::batch_norm_access_width(xp), planar) << c.str() << ": the planar kernels keep their width";
      const Result narrow = run(in, c, kGpu, true, true);
      cuda::set_batch_norm_rows_bytes(0);
      EXPECT_EQ(cuda::batch_norm_access_width(xl), widest(8)) << c.str() << ": the default is 8 bytes";
      expect_same(wide, narrow, c, "16- vs 8-byte rows");
      if (HasFailure()) return;
    }
  }
#else
  GTEST_SKIP() << "a CUDA switch";
#endif
}

// Walks longer than a block: threads step through several vectors, crossing planes (NCHW: the
// (n, s) position carries into the next sample, with 7x7 planes after several samples at once)
// and rows (NHWC), with one and two blocks per channel, and the grid sized to fill the GPU. The
// statistics, apply and pass-2 kernels load channels-last rows four at a time ahead of their use
// (bn::walk_loaded), then one by one: [3, 2, 25, 25] gives some threads one group of four and a
// tail, [4, 8, 20, 20] in f16
// (8-byte rows of 4 channels, 128 rows a block pass) with one block per channel 12 or 13 rows a
// thread: three groups and a tail.
TEST_F(BatchNormActParity, LongWalksCrossPlanesAndRows) {
  for (const auto& [s, dt] : {std::pair{Shape{3, 2, 25, 25}, DType::f32}, std::pair{Shape{12, 3, 7, 7}, DType::f32},
                              std::pair{Shape{4, 8, 20, 20}, DType::f16}}) {
    for (int split : {0, 2, 1}) {
      const Case c{s, dt, dt == DType::f16, true};
      const Inputs in = make_inputs(c, 31);
      const Result cpu = run(in, c, Device::cpu(), true, false);
      set_split(split);
      for (bool channels_last : {false, true}) {
        expect_same(cpu, run(in, c, kGpu, true, channels_last), c,
                    std::string(channels_last ? "nhwc" : "nchw") + " split " + std::to_string(split));
      }
      set_split(0);
      if (HasFailure()) return;
    }
  }
}

// The ReLU's mask in the backward is the forward's output sign, also where the pre-activation is
// exactly 0 (evaluation with mean 0, var 1 - eps, weight 1, bias 0 makes it x itself).
TEST_F(BatchNormActParity, MaskIsTheOutputSignAtExactZeros) {
  for (DType dt : {DType::f32, DType::f16}) {
    const double eps = 1.0 / 1024;
    const Tensor x0 = from_vector({0, -1, 2, 0, 3, -0.5, 0, 1.5, -2, 0, 0.25, 0}, {2, 2, 3, 1}).to(dt);
    const Tensor w0 = ones({2}), b0 = zeros({2}), rm = zeros({2}), rv = full({2}, 1.0 - eps);
    const Tensor gy = ones({2, 2, 3, 1}).to(dt);
    Tensor gx[2];
    for (int k = 0; k < 2; ++k) {
      const Device d = k == 0 ? Device::cpu() : kGpu;
      const Tensor x = leaf(x0, d, false);
      const Tensor y = batch_norm_relu(x, on(w0, d), on(b0, d), on(rm, d), on(rv, d), false, 0.1, eps);
      y.backward(on(gy, d));
      gx[k] = x.grad();
    }
    EXPECT_TRUE(bit_equal(gx[0], gx[1].to(Device::cpu()), std::string("gx at zeros ") + dtype_name(dt)));
    EXPECT_EQ(gx[1].to(DType::f64).to_vector(), (std::vector<double>{0, 0, 1, 0, 1, 0, 0, 1, 0, 0, 1, 0}));
  }
}

}  // namespace
}  // namespace minidl
