// The CUDA backend object, its allocator hook and the global switches (cuDNN autotune, TF32,
// NHWC). The switches are plain atomics: flipping one between steps is safe, as in PyTorch.
#include <atomic>
#include <cstdlib>

#include "kernels/cuda/context.cuh"
#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/runtime.h"

namespace minidl::cuda {
namespace {
std::atomic<bool> g_deterministic{false};
std::atomic<bool> g_tf32_matmul{false};
std::atomic<bool> g_tf32_cudnn{true};
std::atomic<bool> g_nhwc{false};
}  // namespace

void set_cudnn_benchmark(bool on) { set_conv_autotune(on); }   // the process-wide switch (core/backend.h)
bool cudnn_benchmark() { return conv_autotune(); }
void set_cudnn_deterministic(bool on) { g_deterministic = on; }
bool cudnn_deterministic() { return g_deterministic; }
namespace {
int g_find_trials = [] {
  const char* v = std::getenv("MINIDL_CUDNN_FIND_TRIALS");
  const int n = v != nullptr ? std::atoi(v) : 0;
  return n > 0 ? n : 1;
}();
}  // namespace
void set_cudnn_find_trials(int n) {
  MINIDL_CHECK(n >= 1, "set_cudnn_find_trials: ", n, " trials; cuDNN's autotuning needs at least 1 (default 1)");
  g_find_trials = n;
}
int cudnn_find_trials() { return g_find_trials; }
void set_allow_tf32_matmul(bool on) { g_tf32_matmul = on; }
bool allow_tf32_matmul() { return g_tf32_matmul; }
void set_allow_tf32_cudnn(bool on) { g_tf32_cudnn = on; }
bool allow_tf32_cudnn() { return g_tf32_cudnn; }
void set_conv_nhwc(bool on) { g_nhwc = on; }
bool conv_nhwc() { return g_nhwc; }

Allocator& CudaBackend::allocator(int device_index) { return context(device_index).allocator(); }
void CudaBackend::synchronize(int device_index) { context(device_index).synchronize(); }

Backend& cuda_backend() {
  static CudaBackend* b = new CudaBackend();   // never destroyed, like the contexts
  return *b;
}

void check_cuda(const char* op, std::initializer_list<const Tensor*> ts) {
  const Tensor* first = nullptr;
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    MINIDL_CHECK(t->device().is_cuda(), op, " (cuda): tensor ", t->meta(), " is not on a CUDA device");
    if (first == nullptr) first = t;
    MINIDL_CHECK(t->device() == first->device(), op, " (cuda): tensors on different devices: ", first->meta(),
                 " and ", t->meta());
  }
}

bool check_memory_format(const char* op, std::initializer_list<const Tensor*> ts) {
  bool cl = false;
  for (const Tensor* t : ts) cl = cl || (t->defined() && prefers_channels_last(*t));
  for (const Tensor* t : ts) {
    if (!t->defined()) continue;
    MINIDL_CHECK(cl ? is_channels_last(*t) : t->is_contiguous(), op, " (cuda): ", t->meta(), " with strides ",
                 shape_str(t->strides()), " must be ", cl ? "channels-last like the other operands" : "contiguous",
                 "; convert it with ", cl ? "to_channels_last()" : ".contiguous()");
  }
  return cl;
}

}  // namespace minidl::cuda
