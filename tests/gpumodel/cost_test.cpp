// The per-launch cost model on launches whose answer is worked out by hand from h100.h's figures.
#include <gtest/gtest.h>

#include "perfmodel/cost.h"
#include "perfmodel/report.h"

namespace minidl::gpumodel {
namespace {

// A coalesced copy of n f32 elements by a grid-stride kernel whose lanes move `lane_bytes` each
// (4: scalar, 16: float4): n*4/(32*lane_bytes) requests each way, lane_bytes/8 sectors each.
Work copy_kernel(double n, double blocks, double lane_bytes = 16) {
  Work w;
  w.kind = Work::Kind::Kernel;
  w.op = "copy";
  w.kernel = "(copy_contig_kernel<D, S>)";
  w.block_threads = 256;
  w.v.assign(kKernelFields, 0.0);
  w.v[kBlocks] = blocks;
  w.v[kThreads] = blocks * 256;
  w.v[kGldRequests] = w.v[kGstRequests] = 4 * n / (32 * lane_bytes);
  w.v[kGldSectors] = w.v[kGstSectors] = n / 8;
  w.v[kGldBytes] = w.v[kGstBytes] = 4 * n;
  w.v[kUniqueSectorsRead] = w.v[kUniqueSectorsWritten] = n / 8;
  return w;
}

TEST(CostModel, ACoalescedCopyRunsAtTheAchievableHbmBandwidth) {
  const H100Spec s;
  const double n = 256e6;   // 1 GB read + 1 GB written
  const Cost c = model_cost(copy_kernel(n, 132 * 32), {}, s, LaunchMode::Eager);
  EXPECT_DOUBLE_EQ(c.dram_bytes, 8 * n);
  EXPECT_EQ(c.bound, "HBM");
  EXPECT_NEAR(c.seconds, 8 * n / (3.35e12 * 0.9) + 4e-6, 1e-12);
  EXPECT_DOUBLE_EQ(model_cost(copy_kernel(n, 132 * 32), {}, s, LaunchMode::Graph).launch_s, 1e-6);
  // Ideal: the same bytes at the full pin bandwidth, no launch.
  EXPECT_DOUBLE_EQ(ideal_per_launch_seconds(copy_kernel(n, 132 * 32), s), 8 * n / 3.35e12);
  EXPECT_DOUBLE_EQ(ideal_fused_seconds(copy_kernel(n, 132 * 32), s), 0.0);   // fused into the convolutions
}

// The H200 (h200_spec): the H100's processor with 4.8 TB/s of HBM3e. The same copy is HBM-bound at
// the H200's bandwidth; a convolution, bound by the tensor cores, costs what it costs on the H100.
TEST(CostModel, TheH200IsTheH100WithFasterMemory) {
  const H100Spec h100, h200 = h200_spec();
  EXPECT_STRNE(h200.name, h100.name);
  const double n = 256e6;
  const Cost c = model_cost(copy_kernel(n, 132 * 32), {}, h200, LaunchMode::Eager);
  EXPECT_EQ(c.bound, "HBM");
  EXPECT_NEAR(c.seconds, 8 * n / (4.8e12 * 0.9) + 4e-6, 1e-12);
  EXPECT_EQ(h200.f16_tensor_flops, h100.f16_tensor_flops);
  EXPECT_EQ(h200.sms, h100.sms);
  EXPECT_EQ(h200.cudnn_efficiency, h100.cudnn_efficiency);
}

TEST(CostModel, TooFewResidentWarpsAreLatencyBound) {
  // 64 blocks of 256 threads: 512 resident warps of the 132 x 32 it takes to keep HBM busy.
  const H100Spec s;
  const double n = 64e6;
  const Cost c = model_cost(copy_kernel(n, 64), {}, s, LaunchMode::Eager);
  EXPECT_EQ(c.bound, "latency");
  EXPECT_NEAR(c.seconds, 8 * n / (3.35e12 * 0.9 * 512.0 / (132 * 32)) + 4e-6, 1e-9);
  // 132 x 4 blocks of 8 warps is enough.
  EXPECT_EQ(model_cost(copy_kernel(n, 132 * 4), {}, s, LaunchMode::Eager).bound, "HBM");
}

TEST(CostModel, UncoalescedAccessesAreL2Bound) {
  // The same bytes, but every request touches 32 sectors (a naive transpose's strided side).
  const H100Spec s;
  const double n = 256e6;
  Work w = copy_kernel(n, 132 * 32);
  w.v[kGldSectors] = n;   // 32 sectors per 32-lane request
  const Cost c = model_cost(w, {}, s, LaunchMode::Eager);
  EXPECT_EQ(c.bound, "L2");
  EXPECT_NEAR(c.seconds, 32 * (n + n / 8) / 5.5e12 + 4e-6, 1e-12);
}

// A library call of 1 TFLOP over 100 MB in f16 on the tensor cores.
Work library_call(const char* op, const char* detail = "") {
  Work w;
  w.kind = Work::Kind::Library;
  w.op = op;
  w.detail = detail;
  w.math = Math::F16Tensor;
  w.v.assign(kLibFields, 0.0);
  w.v[kFlops] = 1e12;
  w.v[kMinBytes] = 1e8;
  return w;
}

TEST(CostModel, ConvolutionsRunAtTheirMathsPeakTimesTheEfficiency) {
  const H100Spec s;
  Work w = library_call("cuDNN conv forward");
  Cost c = model_cost(w, {}, s, LaunchMode::Eager);
  EXPECT_EQ(c.bound, "f16 tensor");
  EXPECT_NEAR(c.seconds, 1e12 / (989.5e12 * 0.6) + 4e-6, 1e-12);
  EXPECT_NEAR(ideal_fused_seconds(w, s), 1e12 / 989.5e12, 1e-15);
  w.math = Math::Tf32Tensor;
  EXPECT_NEAR(model_cost(w, {}, s, LaunchMode::Eager).seconds, 1e12 / (494.5e12 * 0.6) + 4e-6, 1e-12);
  // A GEMM that moves more than it computes is HBM-bound: cuBLAS's efficiency does not apply.
  w.op = "cuBLAS gemm";
  w.v[kFlops] = 1e9;
  w.v[kMinBytes] = 1e9;
  c = model_cost(w, {}, s, LaunchMode::Eager);
  EXPECT_EQ(c.bound, "HBM");
  EXPECT_NEAR(c.seconds, 1e9 / (3.35e12 * 0.9) + 4e-6, 1e-12);
}

// cuDNN's f16 convolutions on NCHW tensors cost cudnn_f16_nchw_factor times the same call
// channels-last (measured on a GPU: h100.h); other dtypes and the ideal step keep one price.
TEST(CostModel, NchwHalfPrecisionConvolutionsCostTheMeasuredFactorMore) {
  const H100Spec s;
  ASSERT_GT(s.cudnn_f16_nchw_factor, 1.0);
  Work w = library_call("cuDNN conv backward filter", "f16 NHWC");
  const double nhwc = model_cost(w, {}, s, LaunchMode::Graph).seconds;
  EXPECT_NEAR(nhwc, 1e12 / (989.5e12 * 0.6) + 1e-6, 1e-12);
  w.detail = "f16 NCHW";
  EXPECT_NEAR(model_cost(w, {}, s, LaunchMode::Graph).seconds, 1e12 / (989.5e12 * 0.6) * s.cudnn_f16_nchw_factor + 1e-6,
              1e-12);
  EXPECT_NEAR(ideal_fused_seconds(w, s), 1e12 / 989.5e12, 1e-15);   // the ideal runs at peak in any layout
  w.detail = "f32 NCHW";
  w.math = Math::Tf32Tensor;
  EXPECT_NEAR(model_cost(w, {}, s, LaunchMode::Graph).seconds, 1e12 / (494.5e12 * 0.6) + 1e-6, 1e-12);
  // cuBLAS is not cuDNN: no layout factor.
  w.op = "cuBLAS gemm";
  w.detail = "f16 NCHW";
  w.math = Math::F16Tensor;
  EXPECT_NEAR(model_cost(w, {}, s, LaunchMode::Graph).seconds, 1e12 / (989.5e12 * 0.7) + 1e-6, 1e-12);
}

TEST(CostModel, TheStepIsTheSumInStreamOrderAndTheTablesGroupByKernel) {
  const H100Spec s;
  StepProfile p;
  p.batch = 8;
  p.image = 32;
  p.work = {copy_kernel(1e6, 132 * 32), copy_kernel(2e6, 132 * 32)};
  Work update = copy_kernel(1e6, 132 * 32);
  update.op = "fused_sgd_step";
  update.kernel = "kernel";
  p.work.push_back(update);
  const ModelledStep m = model_step(p, {}, s, LaunchMode::Eager);
  double sum = 0;
  for (const Work& w : p.work) sum += model_cost(w, {}, s, LaunchMode::Eager).seconds;
  EXPECT_DOUBLE_EQ(m.seconds, sum);
  EXPECT_EQ(m.kernels, 3);
  EXPECT_DOUBLE_EQ(m.launch_seconds, 3 * 4e-6);
  // The fused ideal keeps the parameter update only.
  EXPECT_DOUBLE_EQ(m.ideal_fused_seconds, 8e6 / 3.35e12);
  const std::vector<KernelRow> rows = kernel_rows(m);
  ASSERT_EQ(rows.size(), 2u);
  EXPECT_EQ(rows[0].key, "copy / (copy_contig_kernel<D, S>)");
  EXPECT_EQ(rows[0].launches, 2);
  EXPECT_DOUBLE_EQ(rows[0].gld_sectors / rows[0].gld_requests, 16.0);   // float4 lanes: 512 bytes a request
  ReportInfo info;
  info.title = "t";
  info.images_per_step = 8;
  EXPECT_NE(markdown_report(m, info, s).find("modelled"), std::string::npos);
}

// A ratio no warp can reach (more than 64 sectors a request, more than 32 lanes an instruction) is
// a failed fit of the request counts, shown as "n/f" with the note, never as a number.
TEST(CostModel, RatiosNoWarpCanReachAreShownAsNotFitted) {
  const H100Spec s;
  StepProfile p;
  p.batch = 8;
  p.image = 32;
  p.work = {copy_kernel(1e6, 132 * 32)};
  ReportInfo info;
  info.title = "t";
  info.images_per_step = 8;
  const std::string fine = markdown_report(model_step(p, {}, s, LaunchMode::Eager), info, s);
  EXPECT_EQ(fine.find("n/f"), std::string::npos);
  EXPECT_NE(fine.find("| 16.00 | 16.00 |"), std::string::npos) << fine;
  p.work[0].v[kGldRequests] = p.work[0].v[kGldSectors] / 286.0;   // what a failed fit gave
  p.work[0].v[kMemInstructions] = 10;
  p.work[0].v[kActiveLanes] = 7720;
  const std::string bad = markdown_report(model_step(p, {}, s, LaunchMode::Eager), info, s);
  EXPECT_NE(bad.find("| n/f | 16.00 |"), std::string::npos) << bad;
  EXPECT_NE(bad.find("| n/f |\n"), std::string::npos) << bad;
  EXPECT_NE(bad.find(kReportNotFitted), std::string::npos);
}

}  // namespace
}  // namespace minidl::gpumodel
