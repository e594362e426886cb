// What the CUDA kernels allocate besides their outputs, from the decisions the kernels themselves
// take (each function is defined next to its kernel and used by it): the meta device's model of
// a GPU (kernels/meta/cuda_model.cpp) allocates exactly this. A plain C++ header, so the host code
// of minidl can call it in any CUDA build (the nvcc one and the emulated device's).
#pragma once
#include <cstddef>
#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

#include "core/backend.h"

namespace minidl::cuda {

// context.cu: cuBLAS's workspace, drawn from the caching allocator at a device's first GEMM and
// held until the device context goes.
size_t cublas_workspace_bytes();

// matmul.cu: whether a (first) and b (second) are copied to contiguous memory before the GEMM.
std::pair<bool, bool> matmul_operand_copies(const Tensor& a, const Tensor& b);

// conv.cu: the workspace sizes the convolution tries, in order, until one fits the allocator:
// cuDNN's heuristic ranking (cudnnGet*Algorithm_v7 and cudnnGet*WorkspaceSize under the current
// math and layout switches) on device 0's handle, so it needs a GPU or the emulated device.
// Benchmark mode's autotuning (timed, so unknown in advance) is not part of it.
enum class ConvDir { Forward, BackwardData, BackwardFilter };
std::vector<size_t> conv_workspace_candidates(ConvDir dir, const Shape& x, const Shape& w, const Shape& y,
                                              const Conv2dOptions& o, DType dtype);
// runtime.cu: convolutions run in NHWC (each operand copied to channels-last and back).
bool conv_nhwc();

// batch_norm.cu: the f64 coefficients a batch-norm kernel computes into (elements; 0: none).
enum class BatchNormPass { Train, Eval, Backward };
int64_t batch_norm_scratch_elements(BatchNormPass pass, const Shape& x);

// amp.cu: the chunk table of the fused unscale (bytes; 0 when no gradient has elements). Strided
// gradients are unscaled in contiguous copies besides.
size_t unscale_table_bytes(const std::vector<Tensor>& grads);

// optim_fused.cu: the chunk table of a fused optimizer step, or nullopt when the group does not
// qualify (the optimizer then runs its per-tensor path).
std::optional<size_t> fused_sgd_table_bytes(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                                            const std::vector<Tensor>& momentum_bufs,
                                            const std::vector<uint8_t>& fresh, const Backend::SgdHyper& h);
std::optional<size_t> fused_adam_table_bytes(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                                             const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                                             const std::vector<Tensor>& max_exp_avg_sq,
                                             const std::vector<int64_t>& steps, const Backend::AdamHyper& h);

}  // namespace minidl::cuda
