// The CUDA backend: every op family of core/backend.h on the GPU, checked against the CPU backend
// by tests/kernels/backend_parity_cuda_test.cpp. Each family lives in its own .cu file
// (elementwise, reduce, matmul, random, conv, pool, batch_norm, softmax, loss); this header gathers them.
#pragma once
#include "core/backend.h"
#include "kernels/common/checks.h"

namespace minidl::cuda {

class CudaBackend final : public Backend {
 public:
  const char* name() const override { return "cuda"; }
  Allocator& allocator(int device_index) override;

  void copy(const Tensor& src, const Tensor& dst) override;
  void fill(const Tensor& dst, double value) override;
  void unary(UnaryOp op, const Tensor& x, const Tensor& out, double scalar) override;
  void binary(BinaryOp op, const Tensor& a, const Tensor& b, const Tensor& out, double alpha) override;
  void reduce(ReduceOp op, const Tensor& x, const std::vector<int64_t>& dims, const Tensor& out) override;
  void matmul(const Tensor& a, const Tensor& b, const Tensor& out) override;
  void random(RandomKind kind, const Tensor& out, uint64_t seed, uint64_t offset, double a, double b) override;

  void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dOptions& o,
                      const Tensor& y) override;
  void conv2d_backward_input(const Tensor& gy, const Tensor& w, const Conv2dOptions& o, const Tensor& gx) override;
  void conv2d_backward_weight(const Tensor& gy, const Tensor& x, const Conv2dOptions& o, const Tensor& gw) override;
  bool conv2d_backward_input_add(const Tensor& gy, const Tensor& w, const Conv2dOptions& o,
                                 const Tensor& gx) override;

  void max_pool2d_forward(const Tensor& x, const Pool2dOptions& o, const Tensor& y, const Tensor& indices) override;
  void max_pool2d_backward(const Tensor& gy, const Tensor& indices, const Pool2dOptions& o,
                           const Tensor& gx) override;
  void avg_pool2d_forward(const Tensor& x, const Pool2dOptions& o, const Tensor& y) override;
  void avg_pool2d_backward(const Tensor& gy, const Pool2dOptions& o, const Tensor& gx) override;

  void batch_norm_forward_train(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                const Tensor& running_mean, const Tensor& running_var, double momentum, double eps,
                                const Tensor& y, const Tensor& save_mean, const Tensor& save_invstd) override;
  void batch_norm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias, const Tensor& mean,
                               const Tensor& var, double eps, const Tensor& y) override;
  void batch_norm_backward(const Tensor& gy, const Tensor& x, const Tensor& weight, const Tensor& save_mean,
                           const Tensor& save_invstd, const Tensor& gx, const Tensor& gweight,
                           const Tensor& gbias) override;

  // Fused batch norm + (residual add) + ReLU (core/backend.h).
  void batch_norm_act_forward(const Tensor& x, const Tensor& residual, const Tensor& weight, const Tensor& bias,
                              const Tensor& running_mean, const Tensor& running_var, bool training, double momentum,
                              double eps, const Tensor& y, const Tensor& save_mean,
                              const Tensor& save_invstd) override;
  void batch_norm_act_backward(const Tensor& gy, const Tensor& x, const Tensor& y, const Tensor& weight,
                               const Tensor& bias, const Tensor& save_mean, const Tensor& save_invstd, bool training,
                               const Tensor& gx, const Tensor& gresidual, const Tensor& gweight,
                               const Tensor& gbias) override;

  void softmax_forward(const Tensor& x, int64_t dim, bool log, const Tensor& y) override;
  void softmax_backward(const Tensor& gy, const Tensor& y, int64_t dim, bool log, const Tensor& gx) override;
  void nll_forward(const Tensor& log_probs, const Tensor& target, const Tensor& losses) override;
  void nll_backward(const Tensor& g, const Tensor& target, const Tensor& glogp) override;
  // loss.cpp / loss.cu: fused softmax cross-entropy and BCE-with-logits.
  void cross_entropy_forward(const Tensor& logits, const Tensor& target, double label_smoothing,
                             const Tensor& losses, const Tensor& lse) override;
  void cross_entropy_backward(const Tensor& g, const Tensor& logits, const Tensor& target, const Tensor& lse,
                              double label_smoothing, const Tensor& glogits) override;
  void bce_with_logits_forward(const Tensor& x, const Tensor& y, const Tensor& loss) override;
  void bce_with_logits_backward(const Tensor& g, const Tensor& x, const Tensor& y, const Tensor& gx,
                                const Tensor& gy) override;

  // amp.cu: one launch over all gradients.
  void unscale_grads(const std::vector<Tensor>& grads, double inv_scale, const Tensor& found_inf) override;
  void unscale_grads_device(const std::vector<Tensor>& grads, const Tensor& scale, const Tensor& found_inf) override;
  void update_scale_device(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                           double growth_factor, double backoff_factor, int64_t growth_interval) override;
  // graph.cu: stream capture into a graph with a private memory pool.
  std::unique_ptr<Graph> capture_graph(int device_index, const std::function<void()>& work) override;
  bool capturing(int device_index) override;
  // optim_fused.cu: one launch per group for contiguous f32 parameters; false otherwise.
  bool fused_sgd_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                      const std::vector<Tensor>& momentum_bufs, const std::vector<uint8_t>& fresh,
                      const SgdHyper& h) override;
  bool fused_adam_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                       const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                       const std::vector<Tensor>& max_exp_avg_sq, const std::vector<int64_t>& steps,
                       const AdamHyper& h) override;
  // pinned.cu: page-locked host memory (cudaHostAlloc) for the loader's batches.
  void synchronize(int device_index) override;
  void* pinned_alloc(size_t bytes) override;
  void pinned_free(void* p) override;
  // pinned.cu: the copies queued on the device's copy stream (cuda::AsyncCopy).
  std::unique_ptr<CopyHandle> copy_async(const std::vector<std::pair<const void*, Tensor>>& copies) override;
 private:
  // amp.cu: the one unscale pass; 1/scale from the host (scale == nullptr) or from the device.
  void unscale(const std::vector<Tensor>& grads, double inv_scale, const float* scale, const Tensor& found_inf);
};

// Checks shared by the families: on this backend's device, and (for kernels that need it) contiguous.
void check_cuda(const char* op, std::initializer_list<const Tensor*> ts);
inline void check_contiguous(const char* op, std::initializer_list<const Tensor*> ts) {
  common::check_contiguous("cuda", op, ts);
}
// The memory format of a call over 4-d operands: channels-last when any defined operand is
// (prefers_channels_last), and then every one must be is_channels_last; else all contiguous.
bool check_memory_format(const char* op, std::initializer_list<const Tensor*> ts);

}  // namespace minidl::cuda
