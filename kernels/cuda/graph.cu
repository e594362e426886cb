// CUDA graphs for a whole training step: the step's launches are captured once on
// the device's stream and replayed with one cudaGraphLaunch, so a step of a few hundred small
// kernels no longer pays a host launch for each. Memory the step allocates during the capture comes
// from a private pool of the caching allocator, which no eager allocation reuses while the graph lives.
#include <cstdio>
#include <exception>
#include <string>
#include <utility>
#include <vector>

#include "kernels/cuda/check.cuh"
#include "kernels/cuda/context.cuh"
#include "kernels/cuda/cuda_backend.cuh"

namespace minidl::cuda {
namespace {

class CudaGraph final : public Backend::Graph {
 public:
  CudaGraph(DeviceContext& ctx, int pool, cudaGraph_t graph, cudaGraphExec_t exec, std::vector<void*> pinned)
      : ctx_(&ctx), pool_(pool), graph_(graph), exec_(exec), pinned_(std::move(pinned)) {}
  ~CudaGraph() override {
    // A replay may still run: the stream finishes it before the pool's memory can be handed out.
    MINIDL_CUDA_LOG(cudaStreamSynchronize(ctx_->stream()));
    if (exec_ != nullptr) MINIDL_CUDA_LOG(cudaGraphExecDestroy(exec_));
    if (graph_ != nullptr) MINIDL_CUDA_LOG(cudaGraphDestroy(graph_));
    for (void* p : pinned_) MINIDL_CUDA_LOG(cudaFreeHost(p));
    try {
      ctx_->allocator().release_private_pool(pool_);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "minidl: releasing a CUDA graph's memory pool: %s\n", e.what());
    }
  }
  CudaGraph(const CudaGraph&) = delete;
  CudaGraph& operator=(const CudaGraph&) = delete;

  void replay() override {
    ctx_->activate();
    MINIDL_CUDA_CHECK(cudaGraphLaunch(exec_, ctx_->stream()));
  }
  size_t pool_bytes() const override { return ctx_->allocator().pool_reserved_bytes(pool_); }
  int pool() const override { return pool_; }
  void begin_lending(bool resume) const override { ctx_->allocator().begin_lending(pool_, resume); }
  bool end_lending() const override { return ctx_->allocator().end_lending(); }
  const DeviceContext* context() const { return ctx_; }

 private:
  DeviceContext* ctx_;
  int pool_;
  cudaGraph_t graph_;
  cudaGraphExec_t exec_;
  std::vector<void*> pinned_;
};

const char* kCaptureFix =
    " (CUDA graphs capture a step that runs entirely on the device: nothing in it may wait for the GPU or read a "
    "device value on the host, e.g. .item(), a loss printed every step, a host-side check of the batch, or the "
    "gradient scaler's host state; keep such values on the device or read them after the replay, or run without "
    "--cuda-graphs)";

}  // namespace

bool CudaBackend::capturing(int device_index) { return context(device_index).capturing(); }

void CudaBackend::draw_library_workspaces(int device_index) { context(device_index).cublas(); }
bool CudaBackend::release_library_workspaces(int device_index) { return context(device_index).release_cublas(); }

std::unique_ptr<Backend::Graph> CudaBackend::capture_graph(int device_index, const std::function<void()>& work,
                                                           const Graph* share_pool) {
  DeviceContext& ctx = context(device_index);
  const auto* shared = dynamic_cast<const CudaGraph*>(share_pool);
  MINIDL_CHECK(share_pool == nullptr || (shared != nullptr && shared->context() == &ctx),
               "capture_graph: the graph whose pool to share was not captured on cuda:", device_index,
               " (a pool serves one device's graphs)");
  ctx.activate();
  // Eager work queued before the capture is not part of the graph; finishing it first keeps the
  // private pool's first segments from being carved while eager blocks are still in flight.
  ctx.synchronize();
  const int pool = ctx.allocator().begin_private_pool(shared != nullptr ? shared->pool() : 0);
  ctx.staging().begin_capture();
  // Whatever happens below, the capture, the pool and the staging mode end together.
  const auto abandon = [&] {
    cudaGraph_t g = nullptr;
    cudaStreamCaptureStatus st = cudaStreamCaptureStatusNone;
    if (cudaStreamIsCapturing(ctx.stream(), &st) == cudaSuccess && st != cudaStreamCaptureStatusNone) {
      cudaStreamEndCapture(ctx.stream(), &g);
    }
    if (g != nullptr) cudaGraphDestroy(g);
    cudaGetLastError();
    ctx.allocator().end_private_pool();
    for (void* p : ctx.staging().end_capture()) MINIDL_CUDA_LOG(cudaFreeHost(p));
    ctx.allocator().release_private_pool(pool);
  };
  cudaGraph_t graph = nullptr;
  try {
    // Thread-local: the capturing thread may make no potentially unsafe call (a host sync, a
    // cudaMalloc outside the allocator's relaxed section), but other threads may. In global mode
    // a data-loader worker waiting for its pinned buffer's last copy (cudaEventSynchronize) while
    // a step was captured invalidated the capture (the likely cause of the first GPU studies' 11
    // failed captures).
    MINIDL_CUDA_CHECK(cudaStreamBeginCapture(ctx.stream(), cudaStreamCaptureModeThreadLocal));
    work();
    const cudaError_t e = cudaStreamEndCapture(ctx.stream(), &graph);
    MINIDL_CHECK(e == cudaSuccess, "CUDA graph capture of the step failed: cudaStreamEndCapture returned ",
                 cudaGetErrorName(e), ": ", cudaGetErrorString(e), kCaptureFix);
  } catch (const OutOfMemoryError&) {
    abandon();
    throw;
  } catch (const Error& e) {
    abandon();
    MINIDL_FAIL("CUDA graph capture of the step failed: ", e.what(), kCaptureFix);
  } catch (...) {
    abandon();
    throw;
  }
  ctx.allocator().end_private_pool();
  std::vector<void*> pinned = ctx.staging().end_capture();
  cudaGraphExec_t exec = nullptr;
  const cudaError_t ie = cudaGraphInstantiate(&exec, graph, 0);
  if (ie != cudaSuccess) {
    MINIDL_CUDA_LOG(cudaGraphDestroy(graph));
    for (void* p : pinned) MINIDL_CUDA_LOG(cudaFreeHost(p));
    ctx.allocator().release_private_pool(pool);
    MINIDL_CUDA_CHECK(ie);
  }
  return std::make_unique<CudaGraph>(ctx, pool, graph, exec, std::move(pinned));
}

}  // namespace minidl::cuda
