// Stream capture and CUDA graphs on the emulated device (issue 27 item 3): captured work runs only
// when the graph is launched, with the arguments it had at the capture, and under the same checks
// as eager work; what CUDA forbids during a capture fails with its error and a message naming the fix.
#include <cublas_v2.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "kernels/cuda/device/launch.cuh"
#include "cuda_emu/runtime_state.h"
#include "tests/emu/emu_test_util.h"

namespace minidl::cuda {
namespace {

__global__ void axpy_kernel(float* out, const float* in, float a, int n) {
  const int i = static_cast<int>(blockIdx.x * blockDim.x + threadIdx.x);
  if (i < n) out[i] += a * in[i];
}

struct Stream {
  explicit Stream(unsigned flags = cudaStreamNonBlocking) { EXPECT_EQ(cudaStreamCreateWithFlags(&s, flags), cudaSuccess); }
  ~Stream() { cudaStreamDestroy(s); }
  cudaStream_t s = nullptr;
};

// A graph and its executable, destroyed with the object.
struct Graph {
  ~Graph() {
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    if (graph != nullptr) cudaGraphDestroy(graph);
  }
  cudaGraph_t graph = nullptr;
  cudaGraphExec_t exec = nullptr;
};

cudaStreamCaptureStatus status_of(cudaStream_t s) {
  cudaStreamCaptureStatus st{};
  EXPECT_EQ(cudaStreamIsCapturing(s, &st), cudaSuccess);
  return st;
}

TEST(EmuGraphs, CapturedWorkRunsAtEachLaunchWithTheArgumentsOfTheCapture) {
  for (const bool deferred : {true, false}) {
    const bool before = emu::deferred_streams();
    emu::set_deferred_streams(deferred);
    Stream st;
    constexpr int n = 300;
    Buf<float> in(n), out(n), copy(n);
    std::vector<float> ones(n, 1.0f);
    ASSERT_EQ(cudaMemcpy(in.get(), ones.data(), n * sizeof(float), cudaMemcpyHostToDevice), cudaSuccess);
    Graph g;
    float a = 2.0f;
    ASSERT_EQ(status_of(st.s), cudaStreamCaptureStatusNone);
    ASSERT_EQ(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeGlobal), cudaSuccess);
    EXPECT_EQ(status_of(st.s), cudaStreamCaptureStatusActive);
    MINIDL_LAUNCH("axpy", axpy_kernel, (n + 127) / 128, 128, 0, st.s, out.get(), in.get(), a, n);
    a = 100.0f;   // the launch copied its arguments: the graph keeps 2
    ASSERT_EQ(cudaMemcpyAsync(copy.get(), out.get(), n * sizeof(float), cudaMemcpyDeviceToDevice, st.s), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(in.get(), 0, sizeof(float), st.s), cudaSuccess);   // in[0] = 0 from the first replay on
    ASSERT_EQ(cudaStreamEndCapture(st.s, &g.graph), cudaSuccess);
    EXPECT_EQ(status_of(st.s), cudaStreamCaptureStatusNone);
    ASSERT_NE(g.graph, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    EXPECT_EQ(out.host()[5], 0.0f) << "captured work ran during the capture";
    ASSERT_EQ(cudaGraphInstantiate(&g.exec, g.graph, 0), cudaSuccess);
    for (int i = 0; i < 3; ++i) ASSERT_EQ(cudaGraphLaunch(g.exec, st.s), cudaSuccess);
    ASSERT_EQ(cudaStreamSynchronize(st.s), cudaSuccess);
    const std::vector<float> o = out.host(), c = copy.host();
    EXPECT_EQ(o[5], 6.0f);    // three replays of out += 2 * 1
    EXPECT_EQ(o[0], 2.0f);    // in[0] was zeroed at the end of the first replay
    EXPECT_EQ(c[5], 6.0f);    // the copy ran after the kernel in each replay
    emu::set_deferred_streams(before);
  }
}

TEST(EmuGraphs, ASynchronizationDuringACaptureFailsAndInvalidatesIt) {
  Stream st;
  Buf<float> b(16);
  for (int which = 0; which < 5; ++which) {
    Graph g;
    ASSERT_EQ(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeGlobal), cudaSuccess);
    ASSERT_EQ(cudaMemsetAsync(b.get(), 0, 16 * sizeof(float), st.s), cudaSuccess);
    float host = 0.0f;
    std::vector<float> pageable(16);
    cudaEvent_t e = nullptr;
    cudaError_t r = cudaSuccess;
    switch (which) {
      case 0: r = cudaStreamSynchronize(st.s); break;
      case 1: r = cudaDeviceSynchronize(); break;
      case 2: r = cudaMemcpy(&host, b.get(), sizeof(float), cudaMemcpyDeviceToHost); break;   // a host read
      case 3: r = cudaMemcpyAsync(pageable.data(), b.get(), 16 * sizeof(float), cudaMemcpyDeviceToHost, st.s); break;
      case 4:
        ASSERT_EQ(cudaEventCreate(&e), cudaSuccess);
        ASSERT_EQ(cudaEventRecord(e, st.s), cudaSuccess);
        r = cudaEventSynchronize(e);
        break;
    }
    EXPECT_EQ(r, cudaErrorStreamCaptureUnsupported) << which;
    const std::string why = cudaGetErrorString(r);
    EXPECT_TRUE(mentions(why, "operation not permitted when stream is capturing")) << why;
    EXPECT_TRUE(mentions(why, which == 3 ? "must use pinned host memory" : "keep the value on the device")) << why;
    EXPECT_EQ(status_of(st.s), cudaStreamCaptureStatusInvalidated);
    // Later work on the invalidated capture is refused, naming the first cause.
    EXPECT_EQ(cudaMemsetAsync(b.get(), 0, 4, st.s), cudaErrorStreamCaptureInvalidated);
    EXPECT_EQ(cudaStreamEndCapture(st.s, &g.graph), cudaErrorStreamCaptureInvalidated);
    EXPECT_EQ(g.graph, nullptr);
    const std::string end = cudaGetErrorString(cudaErrorStreamCaptureInvalidated);
    EXPECT_TRUE(mentions(end, "invalidated by")) << end;
    if (e != nullptr) cudaEventDestroy(e);
    EXPECT_EQ(cudaStreamSynchronize(st.s), cudaSuccess);   // the stream works again after the capture
  }
}

TEST(EmuGraphs, CudaMallocIsRefusedInGlobalModeAndAllowedInRelaxedMode) {
  Stream st;
  Graph g;
  ASSERT_EQ(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeGlobal), cudaSuccess);
  cudaStreamCaptureMode mode = cudaStreamCaptureModeRelaxed;
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);   // as PyTorch's allocator does
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, 1024), cudaSuccess);
  ASSERT_EQ(cudaThreadExchangeStreamCaptureMode(&mode), cudaSuccess);
  EXPECT_EQ(mode, cudaStreamCaptureModeRelaxed);
  void* q = nullptr;
  EXPECT_EQ(cudaMalloc(&q, 1024), cudaErrorStreamCaptureUnsupported);
  const std::string why = cudaGetErrorString(cudaErrorStreamCaptureUnsupported);
  EXPECT_TRUE(mentions(why, "cudaMalloc during a stream capture")) << why;
  EXPECT_TRUE(mentions(why, "cudaStreamCaptureModeRelaxed")) << why;
  EXPECT_EQ(cudaStreamEndCapture(st.s, &g.graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(cudaFree(p), cudaSuccess);
}

TEST(EmuGraphs, TheLegacyStreamCannotRunWhileABlockingStreamCaptures) {
  Stream blocking(cudaStreamDefault);
  Buf<float> b(16);
  Graph g;
  ASSERT_EQ(cudaStreamBeginCapture(blocking.s, cudaStreamCaptureModeRelaxed), cudaSuccess);
  EXPECT_EQ(cudaMemsetAsync(b.get(), 0, 16, nullptr), cudaErrorStreamCaptureImplicit);
  EXPECT_TRUE(mentions(cudaGetErrorString(cudaErrorStreamCaptureImplicit), "cudaStreamNonBlocking"));
  EXPECT_EQ(cudaStreamEndCapture(blocking.s, &g.graph), cudaErrorStreamCaptureInvalidated);
  EXPECT_EQ(cudaStreamBeginCapture(nullptr, cudaStreamCaptureModeGlobal), cudaErrorStreamCaptureUnsupported);
}

TEST(EmuGraphs, AReplayIsCheckedLikeEagerWorkAndItsFaultIsSticky) {
  const DeferredStreams deferred;   // the launch succeeds; its fault comes at the next synchronization
  Stream st;
  Buf<float> src(64);
  void* dst = nullptr;
  ASSERT_EQ(cudaMalloc(&dst, 64 * sizeof(float)), cudaSuccess);
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);   // src's memset (legacy stream) before the other stream reads it
  Graph g;
  ASSERT_EQ(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cudaMemcpyAsync(dst, src.get(), 64 * sizeof(float), cudaMemcpyDeviceToDevice, st.s), cudaSuccess);
  ASSERT_EQ(cudaStreamEndCapture(st.s, &g.graph), cudaSuccess);
  ASSERT_EQ(cudaGraphInstantiate(&g.exec, g.graph, 0), cudaSuccess);
  ASSERT_EQ(cudaGraphLaunch(g.exec, st.s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(st.s), cudaSuccess);
  ASSERT_EQ(cudaFree(dst), cudaSuccess);   // the graph still copies into it
  const std::string e = error_of([&] { EXPECT_EQ(cudaGraphLaunch(g.exec, st.s), cudaSuccess); });
  EXPECT_TRUE(mentions(e, "unspecified launch failure")) << e;
  EXPECT_TRUE(mentions(e, "no longer inside one live device allocation")) << e;
}

TEST(EmuGraphs, LibraryCallsAreCapturedAndRunAtEachReplay) {
  Stream st;
  cublasHandle_t h = nullptr;
  ASSERT_EQ(cublasCreate(&h), CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cublasSetStream(h, st.s), CUBLAS_STATUS_SUCCESS);
  Buf<float> a(4), b(4), c(4);
  const std::vector<float> av{1, 2, 3, 4}, bv{1, 0, 0, 1};
  ASSERT_EQ(cudaMemcpy(a.get(), av.data(), 16, cudaMemcpyHostToDevice), cudaSuccess);
  ASSERT_EQ(cudaMemcpy(b.get(), bv.data(), 16, cudaMemcpyHostToDevice), cudaSuccess);
  Graph g;
  const float one = 1.0f;   // beta 1: C accumulates A * I at each replay
  ASSERT_EQ(cudaStreamBeginCapture(st.s, cudaStreamCaptureModeGlobal), cudaSuccess);
  ASSERT_EQ(cublasGemmStridedBatchedEx(h, CUBLAS_OP_N, CUBLAS_OP_N, 2, 2, 2, &one, a.get(), CUDA_R_32F, 2, 4, b.get(),
                                       CUDA_R_32F, 2, 4, &one, c.get(), CUDA_R_32F, 2, 4, 1, CUBLAS_COMPUTE_32F,
                                       CUBLAS_GEMM_DEFAULT),
            CUBLAS_STATUS_SUCCESS);
  ASSERT_EQ(cudaStreamEndCapture(st.s, &g.graph), cudaSuccess);
  EXPECT_EQ(c.host()[3], 0.0f) << "the GEMM ran during the capture";
  ASSERT_EQ(cudaGraphInstantiate(&g.exec, g.graph, 0), cudaSuccess);
  for (int i = 0; i < 2; ++i) ASSERT_EQ(cudaGraphLaunch(g.exec, st.s), cudaSuccess);
  ASSERT_EQ(cudaStreamSynchronize(st.s), cudaSuccess);
  EXPECT_EQ(c.host(), (std::vector<float>{2, 4, 6, 8}));
  cublasDestroy(h);
}

}  // namespace
}  // namespace minidl::cuda
