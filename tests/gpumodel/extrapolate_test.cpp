// The extrapolation from small steps: exact on counters that are polynomials in N and S of the
// model's form, and a clear error when the sizes do not run the same launches.
#include <gtest/gtest.h>

#include "perfmodel/extrapolate.h"
#include "core/error.h"

namespace minidl::gpumodel {
namespace {

// Two launches whose counters follow known laws: an activation-sized kernel (N S^2 with a border
// term N S) and a weight-sized one (constant), plus a convolution whose FLOPs scale as N S^2.
StepProfile synthetic(int64_t n, int64_t s) {
  StepProfile p;
  p.batch = n;
  p.image = s;
  const double N = static_cast<double>(n), S = static_cast<double>(s);
  Work act;
  act.op = "relu";
  act.kernel = "(unary_vec_kernel<T>)";
  act.block_threads = 256;
  act.v.assign(kKernelFields, 0.0);
  act.v[kGldRequests] = 64 * N * S * S / 32;
  act.v[kGldSectors] = 64 * N * S * S / 8 + 3 * N * S;
  act.v[kBlocks] = 2 * N * S * S;
  Work wgt = act;
  wgt.op = "fused_sgd_step";
  wgt.kernel = "kernel";
  wgt.v.assign(kKernelFields, 0.0);
  wgt.v[kGldRequests] = 25557024.0 / 32;
  Work conv;
  conv.kind = Work::Kind::Library;
  conv.op = "cuDNN conv forward";
  conv.v.assign(kLibFields, 0.0);
  conv.v[kFlops] = 2.0 * N * 64 * (S / 2) * (S / 2) * 3 * 49;
  conv.v[kDims + 0] = N;
  conv.v[kDims + 2] = S;
  p.work = {act, conv, wgt};
  return p;
}

TEST(Extrapolation, PolynomialCountersArePredictedExactlyAtAHeldOutSize) {
  std::vector<StepProfile> samples;
  for (int64_t n : {1, 2})
    for (int64_t s : {32, 64, 96}) samples.push_back(synthetic(n, s));
  const Fit f = fit_samples(samples);
  EXPECT_EQ(f.terms.size(), 6u);
  const FitError e = compare(predict(f, 3, 64), synthetic(3, 64));
  EXPECT_EQ(e.max_relative, 0.0) << e.worst;
  EXPECT_EQ(e.exact_fields, e.fields);
  // And far out, at the target shape.
  const StepProfile big = predict(f, 256, 224);
  const StepProfile want = synthetic(256, 224);
  EXPECT_EQ(big.work[0].v[kGldSectors], want.work[0].v[kGldSectors]);
  EXPECT_EQ(big.work[1].v[kFlops], want.work[1].v[kFlops]);
  EXPECT_EQ(big.work[2].v[kGldRequests], want.work[2].v[kGldRequests]);
  EXPECT_EQ(big.work[1].shapes.substr(0, 9), "x 256x0x2");   // rebuilt from the fitted dims
}

TEST(Extrapolation, FewerSizesFitFewerTerms) {
  // Only the batch varies: counters affine in N.
  const Fit f = fit_samples({synthetic(1, 32), synthetic(2, 32)});
  EXPECT_EQ(f.terms, (std::vector<std::string>{"1", "N"}));
  EXPECT_EQ(compare(predict(f, 5, 32), synthetic(5, 32)).max_relative, 0.0);
}

TEST(Extrapolation, DifferentLaunchSequencesAreRefusedNamingTheLaunch) {
  StepProfile a = synthetic(1, 32), b = synthetic(2, 32);
  b.work[1].op = "cuDNN conv backward data";
  try {
    fit_samples({a, b});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("launch 1 (cuDNN conv forward"), std::string::npos) << e.what();
  }
  b = synthetic(2, 32);
  b.work.pop_back();
  EXPECT_THROW(fit_samples({a, b}), Error);
}

}  // namespace
}  // namespace minidl::gpumodel
