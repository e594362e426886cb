// The CPU-vs-CUDA parity harness shared by the *_cuda_test suites (backend_parity, loss_parity):
// the fixture that skips without a GPU, fresh copies on the device under test, the normalised
// error with a tolerance per dtype, and check_op, which compares an op's forward and backward.
#pragma once
#include <gtest/gtest.h>

#include <cmath>
#include <functional>
#include <sstream>
#include <string>
#include <utility>
#include <vector>

#include "core/autograd.h"
#include "core/backend.h"
#include "core/generator.h"
#include "core/ops.h"
#include "tests/support/cuda_target.h"
#ifdef MINIDL_WITH_CUDA
#include "kernels/cuda/runtime.h"
#endif

namespace minidl::testing::parity {

inline bool self_test() { return parity_self_test(); }
inline const Device kGpu = parity_target();

class Parity : public ::testing::Test {
 protected:
  void SetUp() override {
    if (self_test()) return;
    if (!cuda_available()) GTEST_SKIP() << "no CUDA device";
#ifdef MINIDL_WITH_CUDA
    // Exact f32 arithmetic for the comparisons; the TF32 cases switch it on themselves.
    cuda::set_allow_tf32_matmul(false);
    cuda::set_allow_tf32_cudnn(false);
    cuda::set_cudnn_benchmark(false);
    cuda::set_conv_nhwc(false);
#endif
  }
};

// A fresh copy on the device under test (a clone in self-test mode, where .to() would alias).
inline Tensor to_target(const Tensor& t) {
  const Tensor d = t.detach();
  return d.device() == kGpu ? d.clone() : d.to(kGpu);
}

// A rounding or two of each dtype, normalised: bf16's unit roundoff (2^-9) is 8 times f16's.
inline double tol_for(DType t) {
  return t == DType::f64 ? 1e-10 : t == DType::f16 ? 2e-3 : t == DType::bf16 ? 4e-3 : 2e-5;
}

// Normalised error, with a message naming the worst element.
inline ::testing::AssertionResult close(const Tensor& cpu, const Tensor& gpu, double tol, const std::string& what) {
  if (cpu.shape() != gpu.shape()) {
    return ::testing::AssertionFailure() << what << ": shapes differ: cpu " << cpu.meta() << ", cuda " << gpu.meta();
  }
  if (gpu.device() != kGpu) return ::testing::AssertionFailure() << what << ": result is not on the GPU: " << gpu.meta();
  const std::vector<double> a = cpu.to_vector(), b = gpu.to_vector();
  double num = 0, den = 0, worst = -1;
  size_t wi = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::isnan(a[i]) != std::isnan(b[i])) {
      return ::testing::AssertionFailure() << what << ": NaN mismatch at flat index " << i << " (cpu " << a[i]
                                           << ", cuda " << b[i] << ") in " << cpu.meta();
    }
    if (std::isnan(a[i])) continue;
    if (std::isinf(a[i]) || std::isinf(b[i])) {
      if (a[i] != b[i]) return ::testing::AssertionFailure() << what << ": inf mismatch at " << i << ": cpu " << a[i] << ", cuda " << b[i];
      continue;
    }
    const double d = a[i] - b[i];
    num += d * d;
    den += a[i] * a[i];
    if (std::abs(d) > worst) {
      worst = std::abs(d);
      wi = i;
    }
  }
  const double err = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  if (err <= tol) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure() << what << " " << cpu.meta() << ": normalised error " << err << " > " << tol
                                       << "; worst at flat index " << wi << ": cpu " << a[wi] << ", cuda " << b[wi];
}

inline Tensor rnd(const Shape& s, DType dt, uint64_t seed, double lo = -2.0, double hi = 2.0) {
  Generator g(seed);
  return uniform(s, lo, hi, {DType::f32}, &g).to(dt);
}

// One input of an op: its CPU leaf and GPU leaf, and the (possibly non-contiguous) views the op
// sees. Non-contiguous views are transposes of a leaf stored with the last two dims swapped (or
// every other element of a 1-d leaf twice as long).
struct Input {
  Tensor cpu_leaf, gpu_leaf, cpu_view, gpu_view;
};

inline Input make_input(const Shape& s, DType dt, uint64_t seed, bool noncontig, bool grad) {
  Input in;
  Shape ls = s;
  if (noncontig && s.size() >= 2) std::swap(ls[ls.size() - 1], ls[ls.size() - 2]);
  if (noncontig && s.size() == 1) ls[0] *= 2;
  in.cpu_leaf = rnd(ls, dt, seed);
  in.gpu_leaf = to_target(in.cpu_leaf);
  if (grad && is_floating(dt)) {
    in.cpu_leaf.set_requires_grad(true);
    in.gpu_leaf.set_requires_grad(true);
  }
  auto view = [&](const Tensor& t) {
    if (!noncontig || s.empty()) return t;
    if (s.size() == 1) return t.slice(0, 0, ls[0], 2);
    return t.transpose(-1, -2);
  };
  in.cpu_view = view(in.cpu_leaf);
  in.gpu_view = view(in.gpu_leaf);
  return in;
}

using Fn = std::function<Tensor(const std::vector<Tensor>&)>;

// Runs fn on both backends, compares the outputs, then backpropagates the same random gradient and
// compares every input's gradient. fn is called on the CPU inputs first, then on the GPU ones.
inline void check_op(const std::string& name, const Fn& fn, const std::vector<Shape>& shapes, DType dt, bool noncontig,
                     bool backward, double tol = -1, uint64_t seed = 1) {
  if (tol < 0) tol = tol_for(dt);
  std::ostringstream tag;
  tag << name << " [" << dtype_name(dt) << (noncontig ? ", non-contiguous" : "") << ", shapes";
  for (const Shape& s : shapes) tag << ' ' << shape_str(s);
  tag << ']';
  std::vector<Input> ins;
  std::vector<Tensor> cv, gv;
  for (size_t i = 0; i < shapes.size(); ++i) {
    ins.push_back(make_input(shapes[i], dt, seed * 100 + i, noncontig, backward));
    cv.push_back(ins.back().cpu_view);
    gv.push_back(ins.back().gpu_view);
  }
  const Tensor yc = fn(cv);
  const Tensor yg = fn(gv);
  ASSERT_TRUE(close(yc, yg, tol, tag.str() + " forward"));
  if (!backward) return;
  const Tensor gy = rnd(yc.shape(), yc.dtype(), seed * 7 + 3);
  yc.backward(gy);
  yg.backward(gy.to(kGpu));
  for (size_t i = 0; i < ins.size(); ++i) {
    const Tensor gc = ins[i].cpu_leaf.grad(), gg = ins[i].gpu_leaf.grad();
    ASSERT_EQ(gc.defined(), gg.defined()) << tag.str() << ": input " << i << " gradient defined on one backend only";
    if (!gc.defined()) continue;
    ASSERT_TRUE(close(gc, gg, tol, tag.str() + " backward, input " + std::to_string(i)));
  }
}

// Exact equality of two tensors' values and dtypes (NaN equal to NaN), for the determinism checks.
inline ::testing::AssertionResult bit_equal(const Tensor& a, const Tensor& b, const std::string& what) {
  if (a.shape() != b.shape() || a.dtype() != b.dtype()) {
    return ::testing::AssertionFailure() << what << ": " << a.meta() << " vs " << b.meta();
  }
  const std::vector<double> va = a.to_vector(), vb = b.to_vector();
  for (size_t i = 0; i < va.size(); ++i) {
    const bool same = va[i] == vb[i] ? std::signbit(va[i]) == std::signbit(vb[i]) : (va[i] != va[i] && vb[i] != vb[i]);
    if (!same) return ::testing::AssertionFailure() << what << ": differs at flat index " << i << ": " << va[i] << " vs " << vb[i];
  }
  return ::testing::AssertionSuccess();
}

}  // namespace minidl::testing::parity
