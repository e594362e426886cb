// The shape-only ("meta") device: tensors with shapes, dtypes and strides but no storage, so a
// training step runs through the same front-ends, autograd, optimizers and recomputation as on a
// real device, computing nothing, while every allocation goes through a model of the real
// allocator. Each kernel allocates and frees the temporaries its real counterpart would, sized by
// the functions the real kernels use (kernels/cpu/workspace.h, kernels/cuda/workspace.h), so the
// dry run's peak allocated and peak reserved are the real ones (docs/memory.md).
#pragma once
#include <memory>
#include <mutex>

#include "core/backend.h"

namespace minidl::meta {

class MetaBackend final : public Backend {
 public:
  const char* name() const override { return "meta"; }
  // index: the modelled DeviceType. CPU: the host allocator's books without malloc; CUDA: the
  // caching allocator on address ranges (kernels/caching_allocator.h).
  Allocator& allocator(int device_index) override;

  void copy(const Tensor& src, const Tensor& dst) override;
  void fill(const Tensor&, double) override {}
  void unary(UnaryOp, const Tensor&, const Tensor&, double) override {}
  void binary(BinaryOp, const Tensor&, const Tensor&, const Tensor&, double) override {}
  void reduce(ReduceOp, const Tensor& x, const std::vector<int64_t>& dims, const Tensor& out) override;
  void matmul(const Tensor& a, const Tensor& b, const Tensor& out) override;
  void random(RandomKind, const Tensor&, uint64_t, uint64_t, double, double) override {}

  void conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dOptions& o,
                      const Tensor& y) override;
  void conv2d_backward_input(const Tensor& gy, const Tensor& w, const Conv2dOptions& o, const Tensor& gx) override;
  void conv2d_backward_weight(const Tensor& gy, const Tensor& x, const Conv2dOptions& o, const Tensor& gw) override;
  // A model of a GPU adds as CudaBackend does; a model of the CPU, as the CPU, does not.
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
  void cross_entropy_forward(const Tensor& logits, const Tensor& target, double label_smoothing,
                             const Tensor& losses, const Tensor& lse) override;
  void cross_entropy_backward(const Tensor& g, const Tensor& logits, const Tensor& target, const Tensor& lse,
                              double label_smoothing, const Tensor& glogits) override;
  void bce_with_logits_forward(const Tensor&, const Tensor&, const Tensor&) override {}
  void bce_with_logits_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) override {}

  void unscale_grads(const std::vector<Tensor>& grads, double inv_scale, const Tensor& found_inf) override;
  bool fused_sgd_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                      const std::vector<Tensor>& momentum_bufs, const std::vector<uint8_t>& fresh,
                      const SgdHyper& h) override;
  bool fused_adam_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                       const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                       const std::vector<Tensor>& max_exp_avg_sq, const std::vector<int64_t>& steps,
                       const AdamHyper& h) override;

  // The CUDA model's cuBLAS workspace: drawn at the first GEMM and held, as a device context does.
  void draw_cublas_workspace();

 private:
  std::mutex mu_;
  std::unique_ptr<Allocator> cpu_, cuda_;
  void* cublas_ptr_ = nullptr;
};

MetaBackend& meta_backend();

}  // namespace minidl::meta
