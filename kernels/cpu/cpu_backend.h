// The CPU backend: the reference implementation of every op family (Eigen + OpenMP). Each family's
// methods live in their own file (elementwise.cpp, reduce.cpp, matmul.cpp, random.cpp, conv.cpp,
// pool.cpp, batch_norm.cpp, softmax.cpp, loss.cpp, amp.cpp; f16 helpers in half.h); this header only gathers
// the declarations.
#pragma once
#include <initializer_list>
#include "core/backend.h"

namespace minidl::cpu {

class CpuBackend final : public Backend {
 public:
  const char* name() const override { return "cpu"; }
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

  void unscale_grads(const std::vector<Tensor>& grads, double inv_scale, const Tensor& found_inf) override;

  // optim.cpp: Adam/AdamW in one multi-threaded pass, with optim::Adam::update()'s arithmetic to the bit.
  bool fused_adam_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                       const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                       const std::vector<Tensor>& max_exp_avg_sq, const std::vector<int64_t>& steps,
                       const AdamHyper& h) override;
};

CpuBackend& cpu_backend();

// Whether CpuBackend::fused_adam_step takes these tensors (contiguous f32, one shape per
// parameter, on the CPU or the meta device standing for it, no device skip flag): the meta
// backend answers with it so that a dry run's Adam step allocates what the real one does.
bool fused_adam_qualifies(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                          const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                          const std::vector<Tensor>& max_exp_avg_sq, const std::vector<int64_t>& steps,
                          const AdamHyper& h);

// Whether any defined operand is channels-last (prefers_channels_last): the CPU reference runs
// such calls through contiguous NCHW copies (conv.cpp, pool.cpp, batch_norm.cpp), so the
// channels-last mode is exact against NCHW and the NCHW loops stay as they are.
inline bool any_channels_last(std::initializer_list<const Tensor*> ts) {
  for (const Tensor* t : ts)
    if (t->defined() && prefers_channels_last(*t)) return true;
  return false;
}

}  // namespace minidl::cpu
