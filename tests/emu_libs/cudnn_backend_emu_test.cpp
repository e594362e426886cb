// The emulated cuDNN backend (graph) API driven through cudnn-frontend, as the CUDA backend drives
// it: a convolution's operation graph, the heuristics, an execution plan, a variant pack and an
// execute. Checks the three directions against a written-out sum and the adjoint identities
// (strides, padding, dilation, groups, NCHW and NHWC, f64 / f32 / f16, alpha and beta), that a plan
// once built asks the library for nothing but a variant pack and an execute, the engines' notes,
// and the statuses of graphs and calls the real library refuses.
#ifdef MINIDL_EMU_WITH_CUDNN_FRONTEND
#include "kernels/cuda/frontend.h"
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "tests/emu_libs/backend_test_helpers.h"

// cudnn-frontend's CUDA-graph bookkeeping refers to this runtime call; these host-only tests link
// no emulated runtime, and no graph is captured here.
extern "C" cudaError_t cudaThreadExchangeStreamCaptureMode(cudaStreamCaptureMode*) { return cudaSuccess; }

namespace {

namespace emu = minidl::cuda::emu;
namespace fe = cudnn_frontend;
using namespace backend_test;   // NOLINT: the shared helpers

enum class Dir { Fwd, BwdData, BwdFilter };

// One convolution's graph and plan, built through cudnn-frontend as conv.cu builds them.
struct Planned {
  fe::ExecutionPlan plan;
  std::vector<int64_t> uids;   // x-shaped, filter, y-shaped
};

fe::OperationGraph graph(cudnnHandle_t h, Dir d, const Geo& g, cudnnDataType_t dt, double alpha, double beta) {
  const std::vector<int64_t> xd{g.n, g.c, g.h, g.w}, wd{g.k, g.c / g.groups, g.r, g.s}, yd{g.n, g.k, g.oh(), g.ow()};
  const fe::Tensor x = tensor('x', xd, g.nhwc, dt), w = tensor('w', wd, g.nhwc, dt), y = tensor('y', yd, g.nhwc, dt);
  const int64_t pad[2] = {g.pad, g.pad}, stride[2] = {g.stride, g.stride}, dil[2] = {g.dil, g.dil};
  const cudnnDataType_t compute = dt == CUDNN_DATA_DOUBLE ? CUDNN_DATA_DOUBLE : CUDNN_DATA_FLOAT;
  const fe::ConvDesc conv = fe::ConvDescBuilder()
                                .setComputeType(compute)
                                .setMathMode(CUDNN_CROSS_CORRELATION)
                                .setSpatialDimCount(2)
                                .setSpatialStride(2, stride)
                                .setPrePadding(2, pad)
                                .setPostPadding(2, pad)
                                .setDilation(2, dil)
                                .build();
  const auto type = d == Dir::Fwd       ? CUDNN_BACKEND_OPERATION_CONVOLUTION_FORWARD_DESCRIPTOR
                    : d == Dir::BwdData ? CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_DATA_DESCRIPTOR
                                        : CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR;
  fe::OperationBuilder ob(type);
  if (d == Dir::Fwd) ob.setxDesc(x).setwDesc(w).setyDesc(y);
  else if (d == Dir::BwdData) ob.setdxDesc(x).setwDesc(w).setdyDesc(y);
  else ob.setxDesc(x).setdwDesc(w).setdyDesc(y);
  const fe::Operation op = ob.setcDesc(conv).setAlpha(alpha).setBeta(beta).build();
  const fe::Operation* ops[] = {&op};
  return fe::OperationGraphBuilder().setHandle(h).setOperationGraph(1, ops).build();
}

Planned plan(cudnnHandle_t h, Dir d, const Geo& g, cudnnDataType_t dt, double alpha = 1.0, double beta = 0.0,
             cudnnBackendHeurMode_t mode = CUDNN_HEUR_MODE_INSTANT) {
  fe::OperationGraph og = graph(h, d, g, dt, alpha, beta);
  fe::EngineHeuristics heur = fe::EngineHeuristicsBuilder().setOperationGraph(og).setHeurMode(mode).build();
  auto& cfgs = heur.getEngineConfig(heur.getEngineConfigCount());
  EXPECT_FALSE(cfgs.empty());
  return {fe::ExecutionPlanBuilder().setHandle(h).setEngineConfig(cfgs.front(), og.getTag()).build(), {'x', 'w', 'y'}};
}

// Host buffers standing for device memory (no range checker is installed here).
struct Buffers {
  std::vector<double> x, w, y;   // logical NCHW values
  std::vector<unsigned char> bx, bw, by, ws;
};

// Runs direction d of g on (a, b) into out through a fresh plan; returns the status of the execute.
cudnnStatus_t run(cudnnHandle_t h, Dir d, const Geo& g, cudnnDataType_t dt, Buffers& bufs, double alpha = 1.0,
                  double beta = 0.0) {
  Planned p = plan(h, d, g, dt, alpha, beta);
  bufs.ws.assign(static_cast<size_t>(p.plan.getWorkspaceSize()) + 16, 0);
  void* ptrs[] = {bufs.bx.data(), bufs.bw.data(), bufs.by.data()};
  auto pack = fe::VariantPackBuilder().setWorkspacePointer(bufs.ws.data()).setDataPointers(3, ptrs).setUids(3, p.uids.data()).build();
  return cudnnBackendExecute(h, p.plan.get_raw_desc(), pack.get_raw_desc());
}

struct Case {
  const char* name;
  Geo g;
  cudnnDataType_t dt;
  double tol;
};

class BackendConv : public ::testing::TestWithParam<Case> {};

// Forward against the written-out sum, then the data and filter gradients through the adjoint
// identities <conv(x, w), dy> = <x, dgrad(dy, w)> = <w, wgrad(x, dy)>.
TEST_P(BackendConv, ThreeDirectionsAgreeWithTheDirectSum) {
  const Case& cs = GetParam();
  const Geo& g = cs.g;
  Handle h;
  const std::vector<int64_t> xd{g.n, g.c, g.h, g.w}, wd{g.k, g.c / g.groups, g.r, g.s}, yd{g.n, g.k, g.oh(), g.ow()};
  Buffers b;
  const auto round = [&](std::vector<double> v, const std::vector<int64_t>& dims) {
    std::vector<unsigned char> tmp;
    store(tmp, v, dims, false, cs.dt);
    return load(tmp, dims, false, cs.dt);
  };
  b.x = round(wave(static_cast<size_t>(g.n * g.c * g.h * g.w), 0.3), xd);
  b.w = round(wave(static_cast<size_t>(g.k * (g.c / g.groups) * g.r * g.s), 1.1), wd);
  b.y = round(wave(static_cast<size_t>(g.n * g.k * g.oh() * g.ow()), 2.7), yd);
  store(b.bx, b.x, xd, g.nhwc, cs.dt);
  store(b.bw, b.w, wd, g.nhwc, cs.dt);
  store(b.by, std::vector<double>(b.y.size(), 0.0), yd, g.nhwc, cs.dt);
  ASSERT_EQ(run(h.get(), Dir::Fwd, g, cs.dt, b), CUDNN_STATUS_SUCCESS) << emu::last_error_detail();
  const std::vector<double> y = load(b.by, yd, g.nhwc, cs.dt), want = direct_forward(g, b.x, b.w);
  for (size_t i = 0; i < y.size(); ++i) ASSERT_NEAR(y[i], want[i], cs.tol * (1 + std::abs(want[i]))) << "y[" << i << "]";

  const double forward_side = dot(want, b.y);   // <conv(x, w), dy>
  store(b.by, b.y, yd, g.nhwc, cs.dt);          // dy
  store(b.bx, std::vector<double>(b.x.size(), 0.0), xd, g.nhwc, cs.dt);
  ASSERT_EQ(run(h.get(), Dir::BwdData, g, cs.dt, b), CUDNN_STATUS_SUCCESS) << emu::last_error_detail();
  const std::vector<double> dx = load(b.bx, xd, g.nhwc, cs.dt);
  EXPECT_NEAR(dot(b.x, dx), forward_side, cs.tol * 50 * (1 + std::abs(forward_side)));

  store(b.bx, b.x, xd, g.nhwc, cs.dt);
  store(b.bw, std::vector<double>(b.w.size(), 0.0), wd, g.nhwc, cs.dt);
  ASSERT_EQ(run(h.get(), Dir::BwdFilter, g, cs.dt, b), CUDNN_STATUS_SUCCESS) << emu::last_error_detail();
  const std::vector<double> dw = load(b.bw, wd, g.nhwc, cs.dt);
  EXPECT_NEAR(dot(b.w, dw), forward_side, cs.tol * 50 * (1 + std::abs(forward_side)));
}

INSTANTIATE_TEST_SUITE_P(
    Cases, BackendConv,
    ::testing::Values(Case{"f64_nchw_plain", {2, 3, 7, 6, 4, 3, 3, 1, 1, 1, 1}, CUDNN_DATA_DOUBLE, 1e-12},
                      Case{"f64_nchw_stride_dilation", {2, 4, 9, 8, 6, 3, 2, 2, 2, 2, 1}, CUDNN_DATA_DOUBLE, 1e-12},
                      Case{"f64_nchw_groups", {1, 6, 5, 5, 4, 3, 3, 1, 1, 1, 2}, CUDNN_DATA_DOUBLE, 1e-12},
                      Case{"f64_nhwc_groups_stride", {2, 4, 7, 7, 8, 3, 3, 1, 2, 1, 4, true}, CUDNN_DATA_DOUBLE, 1e-12},
                      Case{"f32_nhwc", {2, 8, 6, 6, 8, 1, 1, 0, 1, 1, 1, true}, CUDNN_DATA_FLOAT, 2e-3},
                      Case{"f16_nhwc", {2, 8, 5, 5, 8, 3, 3, 1, 1, 1, 1, true}, CUDNN_DATA_HALF, 2e-2}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// A residual join's data gradient adds into the gradient already there (beta = 1), with alpha.
TEST(BackendConvApi, BetaOneAddsIntoTheOutput) {
  Handle h;
  const Geo g{1, 2, 4, 4, 3, 3, 3, 1, 1, 1, 1};
  const std::vector<int64_t> xd{g.n, g.c, g.h, g.w}, wd{g.k, g.c, g.r, g.s}, yd{g.n, g.k, g.oh(), g.ow()};
  Buffers b;
  b.w = wave(static_cast<size_t>(g.k * g.c * g.r * g.s), 0.5);
  b.y = wave(static_cast<size_t>(g.n * g.k * g.oh() * g.ow()), 1.5);
  const std::vector<double> waiting = wave(static_cast<size_t>(g.n * g.c * g.h * g.w), 4.0);
  store(b.bw, b.w, wd, false, CUDNN_DATA_DOUBLE);
  store(b.by, b.y, yd, false, CUDNN_DATA_DOUBLE);
  store(b.bx, std::vector<double>(waiting.size(), 0.0), xd, false, CUDNN_DATA_DOUBLE);
  ASSERT_EQ(run(h.get(), Dir::BwdData, g, CUDNN_DATA_DOUBLE, b), CUDNN_STATUS_SUCCESS) << emu::last_error_detail();
  const std::vector<double> plain = load(b.bx, xd, false, CUDNN_DATA_DOUBLE);
  store(b.bx, waiting, xd, false, CUDNN_DATA_DOUBLE);
  ASSERT_EQ(run(h.get(), Dir::BwdData, g, CUDNN_DATA_DOUBLE, b, 2.0, 1.0), CUDNN_STATUS_SUCCESS);
  const std::vector<double> added = load(b.bx, xd, false, CUDNN_DATA_DOUBLE);
  for (size_t i = 0; i < added.size(); ++i) EXPECT_NEAR(added[i], waiting[i] + 2.0 * plain[i], 1e-12);
}

// Once a plan exists, a call is a variant pack and an execute: nothing else reaches the library.
TEST(BackendConvApi, ASecondCallWithAPlanIsAVariantPackAndAnExecute) {
  Handle h;
  const Geo g{2, 4, 6, 6, 4, 3, 3, 1, 1, 1, 1};
  Planned p = plan(h.get(), Dir::Fwd, g, CUDNN_DATA_FLOAT);
  std::vector<float> x(2 * 4 * 36, 0.5f), w(4 * 4 * 9, 0.25f), y(2 * 4 * 36);
  std::vector<unsigned char> ws(static_cast<size_t>(p.plan.getWorkspaceSize()) + 1);
  void* ptrs[] = {x.data(), w.data(), y.data()};
  emu::clear_cudnn_backend_calls();
  for (int i = 0; i < 2; ++i) {
    auto pack = fe::VariantPackBuilder().setWorkspacePointer(ws.data()).setDataPointers(3, ptrs).setUids(3, p.uids.data()).build();
    ASSERT_EQ(cudnnBackendExecute(h.get(), p.plan.get_raw_desc(), pack.get_raw_desc()), CUDNN_STATUS_SUCCESS)
        << emu::last_error_detail();
  }
  const std::vector<std::string> calls = emu::cudnn_backend_calls();
  for (const std::string& c : calls)
    EXPECT_TRUE(c.find("VARIANT_PACK") != std::string::npos || c == "cudnnBackendExecute(EXECUTION_PLAN)") << c;
  EXPECT_EQ(std::count(calls.begin(), calls.end(), "cudnnBackendExecute(EXECUTION_PLAN)"), 2);
  EXPECT_FLOAT_EQ(y[2 * 6 + 2], 4 * 9 * 0.5f * 0.25f);   // an interior pixel
}

// The engines' notes that the backend filters on: tensor cores (and TF32 for f32) and atomics.
TEST(BackendConvApi, EnginesCarryTheirNumericalNotes) {
  Handle h;
  const Geo g{2, 8, 6, 6, 8, 3, 3, 1, 1, 1, 1};
  fe::OperationGraph og = graph(h.get(), Dir::BwdFilter, g, CUDNN_DATA_FLOAT, 1.0, 0.0);
  fe::EngineHeuristics heur = fe::EngineHeuristicsBuilder().setOperationGraph(og).setHeurMode(CUDNN_HEUR_MODE_A).build();
  auto& cfgs = heur.getEngineConfig(heur.getEngineConfigCount());
  int tf32 = 0, fma = 0, nondeterministic = 0;
  for (auto& c : cfgs) {
    const bool tc = fe::hasNumericalNote<CUDNN_NUMERICAL_NOTE_TENSOR_CORE>(c->get_backend_descriptor());
    const bool down = fe::hasNumericalNote<CUDNN_NUMERICAL_NOTE_DOWN_CONVERT_INPUTS>(c->get_backend_descriptor());
    EXPECT_EQ(tc, down);   // f32 on tensor cores is TF32
    (tc ? tf32 : fma) += 1;
    nondeterministic += fe::hasNumericalNote<CUDNN_NUMERICAL_NOTE_NONDETERMINISTIC>(c->get_backend_descriptor());
  }
  EXPECT_GT(tf32, 0);
  EXPECT_GT(fma, 0);
  EXPECT_GT(nondeterministic, 0);   // BWD_FILTER_ALGO_0 and _3 add with atomics
  EXPECT_TRUE(fe::hasNumericalNote<CUDNN_NUMERICAL_NOTE_TENSOR_CORE>(cfgs.front()->get_backend_descriptor()));
}

// A graph the emulator does not run fails at the heuristics as cuDNN fails a pattern it has no
// engine for.
TEST(BackendConvApi, AGraphWithoutAConvolutionIsNotSupported) {
  Handle h;
  const std::vector<int64_t> d{1, 4, 2, 2};
  const fe::Tensor a = tensor(1, d, false, CUDNN_DATA_FLOAT), b = tensor(2, d, false, CUDNN_DATA_FLOAT);
  const fe::PointWiseDesc relu = fe::PointWiseDescBuilder().setMode(CUDNN_POINTWISE_RELU_FWD).setComputeType(CUDNN_DATA_FLOAT).build();
  const fe::Operation op = fe::OperationBuilder(CUDNN_BACKEND_OPERATION_POINTWISE_DESCRIPTOR).setxDesc(a).setyDesc(b).setpwDesc(relu).build();
  const fe::Operation* ops[] = {&op};
  fe::OperationGraph og = fe::OperationGraphBuilder().setHandle(h.get()).setOperationGraph(1, ops).build();
  try {
    fe::EngineHeuristics heur = fe::EngineHeuristicsBuilder().setOperationGraph(og).setHeurMode(CUDNN_HEUR_MODE_A).build();
    FAIL() << "the heuristics accepted a pointwise graph";
  } catch (fe::cudnnException& e) {
    EXPECT_EQ(e.getCudnnStatus(), CUDNN_STATUS_NOT_SUPPORTED_GRAPH_PATTERN) << e.what();
    EXPECT_NE(std::string(emu::last_error_detail()).find("OPERATION_POINTWISE"), std::string::npos);
  }
}

// The execute checks: every tensor bound, the workspace given, pointers as aligned as promised.
TEST(BackendConvApi, ExecuteRefusesAnIncompleteOrMisalignedVariantPack) {
  Handle h;
  const Geo g{2, 4, 6, 6, 4, 3, 3, 1, 1, 1, 1};
  Planned p = plan(h.get(), Dir::Fwd, g, CUDNN_DATA_HALF);
  ASSERT_GT(p.plan.getWorkspaceSize(), 0);   // the ranked first engine takes an index table
  alignas(16) static unsigned char x[4096], w[4096], y[4096], ws[65536];
  const auto execute = [&](int n, void* const* ptrs, const int64_t* uids, void* workspace) {
    auto pack = fe::VariantPackBuilder().setWorkspacePointer(workspace).setDataPointers(n, const_cast<void**>(ptrs)).setUids(n, uids).build();
    return cudnnBackendExecute(h.get(), p.plan.get_raw_desc(), pack.get_raw_desc());
  };
  void* all[] = {x, w, y};
  EXPECT_EQ(execute(2, all, p.uids.data(), ws), CUDNN_STATUS_BAD_PARAM);
  EXPECT_NE(std::string(emu::last_error_detail()).find("no pointer to unique id"), std::string::npos);
  EXPECT_EQ(execute(3, all, p.uids.data(), nullptr), CUDNN_STATUS_BAD_PARAM_NULL_POINTER);
  void* skewed[] = {x + 2, w, y};
  EXPECT_EQ(execute(3, skewed, p.uids.data(), ws), CUDNN_STATUS_BAD_PARAM_MISALIGNED_POINTER);
  EXPECT_EQ(execute(3, all, p.uids.data(), ws), CUDNN_STATUS_SUCCESS) << emu::last_error_detail();
}

// A filter gradient's y-shaped tensor that is not the convolution's output is refused when the
// operation is finalized.
TEST(BackendConvApi, AShapeMismatchIsRefusedAtTheOperation) {
  Handle h;
  const Geo g{1, 2, 5, 5, 3, 3, 3, 0, 1, 1, 1};
  Geo wrong = g;
  wrong.pad = 1;   // the descriptor says padding 1, the tensors were sized for 0
  try {
    const std::vector<int64_t> xd{g.n, g.c, g.h, g.w}, wd{g.k, g.c, g.r, g.s}, yd{g.n, g.k, g.oh(), g.ow()};
    const fe::Tensor x = tensor('x', xd, false, CUDNN_DATA_FLOAT), w = tensor('w', wd, false, CUDNN_DATA_FLOAT),
                     y = tensor('y', yd, false, CUDNN_DATA_FLOAT);
    const int64_t pad[2] = {1, 1}, one[2] = {1, 1};
    const fe::ConvDesc conv = fe::ConvDescBuilder().setComputeType(CUDNN_DATA_FLOAT).setMathMode(CUDNN_CROSS_CORRELATION)
                                  .setSpatialDimCount(2).setSpatialStride(2, one).setPrePadding(2, pad)
                                  .setPostPadding(2, pad).setDilation(2, one).build();
    const fe::Operation op = fe::OperationBuilder(CUDNN_BACKEND_OPERATION_CONVOLUTION_BACKWARD_FILTER_DESCRIPTOR)
                                 .setxDesc(x).setdwDesc(w).setdyDesc(y).setcDesc(conv).setAlpha(1.0f).setBeta(0.0f).build();
    FAIL() << "a mismatched dy was accepted";
  } catch (fe::cudnnException& e) {
    EXPECT_EQ(e.getCudnnStatus(), CUDNN_STATUS_BAD_PARAM_SHAPE_MISMATCH) << e.what();
  }
  (void)wrong;
}

// Every descriptor the frontend creates is destroyed with its objects.
TEST(BackendConvApi, NoDescriptorOutlivesItsFrontendObject) {
  const int before = emu::live_object_counts().backend_descriptors;
  {
    Handle h;
    Planned p = plan(h.get(), Dir::BwdData, Geo{1, 4, 4, 4, 4, 3, 3, 1, 1, 1, 1, true}, CUDNN_DATA_HALF);
    EXPECT_GT(emu::live_object_counts().backend_descriptors, before);
  }
  EXPECT_EQ(emu::live_object_counts().backend_descriptors, before);
}

}  // namespace
#endif  // MINIDL_EMU_WITH_CUDNN_FRONTEND
