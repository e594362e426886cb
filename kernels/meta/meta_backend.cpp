// The meta device's kernels (see meta_backend.h). Nothing is computed; each kernel holds, until it
// returns, the temporaries the kernel of the modelled device allocates: for the CPU, the
// channels-last operands' NCHW copies and the f16 staging copies (kernels/cpu/cpu_backend.h,
// kernels/cpu/half.h, the same functions) and the scratch that
// kernels/cpu/workspace.h sizes; for CUDA, what kernels/cuda/workspace.h says (cuda_model.cpp).
#include "kernels/meta/meta_backend.h"

#include "core/allocator.h"
#include "kernels/caching_allocator.h"
#include "kernels/cpu/cpu_backend.h"
#include "kernels/cpu/half.h"
#include "kernels/cpu/workspace.h"
#include "kernels/cuda/conv_stats_support.h"
#include "kernels/meta/cuda_model.h"

namespace minidl::meta {
namespace {

using cpu::any_channels_last;
using cpu::f32_output_for;
using cpu::in_nchw;
using cpu::is_half;
using cpu::widen_half;

bool models_cuda(const Tensor& t) { return t.device().target() == DeviceType::CUDA; }

// The CPU kernel's conv scratch, allocated and held for the call (like: the f32/f64 input or gy;
// f16 operands were widened by the caller as the kernel widens them).
void hold_conv_scratch(cpu::ConvPass pass, const Shape& x, const Shape& w, const Shape& y, const Conv2dOptions& o,
                       const Tensor& like) {
  std::vector<Tensor> held;
  for (int64_t bytes : cpu::conv2d_workspace_bytes(pass, x, w, y, o, like.dtype()))
    held.push_back(empty({bytes}, TensorOptions{DType::u8, like.device(), false}));
}

}  // namespace

Allocator& MetaBackend::allocator(int device_index) {
  std::lock_guard<std::mutex> lock(mu_);
  if (device_index == static_cast<int>(DeviceType::CUDA)) {
    if (!cuda_) {
      cuda_ = std::make_unique<CachingAllocator>(std::make_unique<AddressRangeSource>(), Device::meta(DeviceType::CUDA));
    }
    return *cuda_;
  }
  MINIDL_CHECK(device_index == static_cast<int>(DeviceType::CPU), "meta device: unknown target ", device_index,
               " (expected meta:cpu or meta:cuda)");
  if (!cpu_) cpu_ = std::make_unique<CpuAllocator>(Device::meta(DeviceType::CPU));
  return *cpu_;
}

namespace {

// A captured graph of the GPU model: its private pool, released with it.
class MetaGraph final : public DeviceServices::Graph {
 public:
  MetaGraph(CachingAllocator& a, int pool) : a_(a), pool_(pool) {}
  ~MetaGraph() override { a_.release_private_pool(pool_); }
  void replay() override {}
  size_t pool_bytes() const override { return a_.pool_reserved_bytes(pool_); }
  int pool() const override { return pool_; }
  void begin_lending(bool resume) const override { a_.begin_lending(pool_, resume); }
  bool end_lending() const override { return a_.end_lending(); }
  const CachingAllocator* allocator() const { return &a_; }

 private:
  CachingAllocator& a_;
  int pool_;
};

}  // namespace

std::unique_ptr<DeviceServices::Graph> MetaBackend::capture_graph(int device_index, const std::function<void()>& work,
                                                                  const Graph* share_pool) {
  if (device_index != static_cast<int>(DeviceType::CUDA))
    return Backend::capture_graph(device_index, work, share_pool);
  auto& a = static_cast<CachingAllocator&>(allocator(device_index));
  const auto* shared = dynamic_cast<const MetaGraph*>(share_pool);
  MINIDL_CHECK(share_pool == nullptr || (shared != nullptr && shared->allocator() == &a),
               "capture_graph: the graph whose pool to share was not captured on meta:cuda");
  const int pool = a.begin_private_pool(shared != nullptr ? shared->pool() : 0);
  capturing_ = true;
  try {
    work();
  } catch (...) {
    capturing_ = false;
    a.end_private_pool();
    a.release_private_pool(pool);
    throw;
  }
  capturing_ = false;
  a.end_private_pool();
  return std::make_unique<MetaGraph>(a, pool);
}

bool MetaBackend::capturing(int device_index) {
  return capturing_ && device_index == static_cast<int>(DeviceType::CUDA);
}

void MetaBackend::draw_cublas_workspace() {
  Allocator& a = allocator(static_cast<int>(DeviceType::CUDA));
  std::lock_guard<std::mutex> lock(mu_);
  if (cublas_ptr_ == nullptr) cublas_ptr_ = a.allocate(cuda_model::cublas_workspace_bytes());
}

void MetaBackend::draw_library_workspaces(int device_index) {
  if (device_index == static_cast<int>(DeviceType::CUDA)) draw_cublas_workspace();
}

bool MetaBackend::release_library_workspaces(int device_index) {
  if (device_index != static_cast<int>(DeviceType::CUDA)) return false;
  Allocator& a = allocator(device_index);
  const size_t bytes = cuda_model::cublas_workspace_bytes();
  std::lock_guard<std::mutex> lock(mu_);
  if (cublas_ptr_ == nullptr || a.stats().allocated_bytes != static_cast<int64_t>(bytes)) return false;
  a.deallocate(std::exchange(cublas_ptr_, nullptr), bytes);
  return true;
}

void MetaBackend::copy(const Tensor& src, const Tensor& dst) {
  if (models_cuda(src) || models_cuda(dst)) cuda_model::copy(src, dst);   // the device-side staging
  if (!dst.device().is_meta()) {
    // A host read of meta data (item(), to_vector(), a flag): zeros. A gradient scaler therefore
    // sees no overflow and steps, and a clipped norm reads 0.
    if (dst.device().is_cpu()) cpu::cpu_backend().fill(dst, 0.0);
    else backend(dst.device()).fill(dst, 0.0);
  }
}

// Elementwise kernels, random fills and the BCE loss allocate nothing on either modelled device.
void MetaBackend::fill(const Tensor&, double) {}
void MetaBackend::unary(UnaryOp, const Tensor&, const Tensor&, double) {}
void MetaBackend::binary(BinaryOp, const Tensor&, const Tensor&, const Tensor&, double) {}
void MetaBackend::random(RandomKind, const Tensor&, uint64_t, uint64_t, double, double) {}
void MetaBackend::bce_with_logits_forward(const Tensor&, const Tensor&, const Tensor&) {}
void MetaBackend::bce_with_logits_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, const Tensor&) {}

void MetaBackend::matmul(const Tensor& a, const Tensor& b, const Tensor& out) {
  if (models_cuda(out)) return cuda_model::matmul(a, b, out, [this] { draw_cublas_workspace(); });
  // The CPU's bf16 GEMM packs its operands in scratch outside the allocator (bf16_gemm.cpp).
  if (a.dtype() == DType::bf16 && b.dtype() == DType::bf16 && out.dtype() == DType::bf16) return;
  if (is_half(a) || is_half(b) || is_half(out)) {
    const Tensor o = f32_output_for(out);
    return matmul(widen_half(a), widen_half(b), o);
  }
  const auto [copy_a, copy_b] = cpu::matmul_operand_copies(a, b);
  const Tensor ca = copy_a ? a.contiguous() : a;
  const Tensor cb = copy_b ? b.contiguous() : b;
}

void MetaBackend::conv2d_forward(const Tensor& x, const Tensor& w, const Tensor& bias, const Conv2dOptions& o,
                                 const Tensor& y) {
  if (models_cuda(y)) return cuda_model::conv(cuda_model::ConvDir::Forward, x, w, y, o);
  if (any_channels_last({&x, &w, &y}))
    return in_nchw(y, [&](const Tensor& yc) { conv2d_forward(x.contiguous(), w.contiguous(), bias, o, yc); });
  if (x.size(0) == 0) return;
  if (is_half(x) || is_half(w) || is_half(y)) {
    const Tensor yf = f32_output_for(y);
    return conv2d_forward(widen_half(x), widen_half(w), widen_half(bias), o, yf);
  }
  hold_conv_scratch(cpu::ConvPass::Forward, x.shape(), w.shape(), y.shape(), o, x);
}

void MetaBackend::conv2d_backward_input(const Tensor& gy, const Tensor& w, const Conv2dOptions& o, const Tensor& gx) {
  if (models_cuda(gx)) return cuda_model::conv(cuda_model::ConvDir::BackwardData, gx, w, gy, o);
  if (any_channels_last({&gy, &w, &gx}))
    return in_nchw(gx, [&](const Tensor& gxc) { conv2d_backward_input(gy.contiguous(), w.contiguous(), o, gxc); });
  if (gx.size(0) == 0) return;
  if (is_half(gy) || is_half(w) || is_half(gx)) {
    const Tensor gxf = f32_output_for(gx);
    return conv2d_backward_input(widen_half(gy), widen_half(w), o, gxf);
  }
  hold_conv_scratch(cpu::ConvPass::BackwardInput, gx.shape(), w.shape(), gy.shape(), o, gy);
}

bool MetaBackend::conv2d_backward_input_add(const Tensor& gy, const Tensor& w, const Conv2dOptions& o,
                                            const Tensor& gx) {
  return models_cuda(gx) && cuda_model::conv_backward_input_add(gx, w, gy, o);
}

// The convolutions that carry batch norm: cuDNN's fused graphs on the model of a GPU, where the
// CUDA backend runs them; composed elsewhere, as the CPU composes them.
bool MetaBackend::conv2d_stats_forward(const Tensor& x, const Tensor& in_scale, const Tensor& in_bias, const Tensor& w,
                                       const Conv2dOptions& o, const Tensor& y, const Tensor& sum,
                                       const Tensor& sumsq) {
  return models_cuda(y) && cuda_model::conv_stats_forward(x, in_scale, in_bias, w, o, y, sum, sumsq);
}

bool MetaBackend::conv2d_stats_backward(const Tensor& gy, const Tensor& x, const Tensor& in_scale,
                                        const Tensor& in_bias, const Tensor& w, const Conv2dOptions& o,
                                        const Tensor& gx, const Tensor& gscale, const Tensor& gbias,
                                        const Tensor& gw) {
  return models_cuda(gy) && cuda_model::conv_stats_backward(gy, x, in_scale, in_bias, w, o, gx, gscale, gbias, gw);
}

// The output gradient's one pass and bn_finalize's one-launch kernels where the CUDA backend runs
// them: nothing to allocate.
bool MetaBackend::conv2d_stats_output_grad(const Tensor& gy, const Tensor& gsum, const Tensor& gsumsq,
                                           const Tensor& y, const Tensor& g) {
  return models_cuda(y) && cuda::conv_stats_output_grad_fused(gy, gsum, gsumsq, y, g);
}

bool MetaBackend::bn_finalize_forward(const Tensor& sum, const Tensor& sumsq, const Tensor& weight, const Tensor& bias,
                                      const Tensor& running_mean, const Tensor& running_var, int64_t count,
                                      double /*momentum*/, double /*eps*/, const Tensor& scale, const Tensor& shift) {
  return models_cuda(sum) && running_mean.defined() == running_var.defined() &&
         cuda::bn_finalize_fused(sum, count, {&sumsq, &weight, &bias, &running_mean, &running_var, &scale, &shift});
}

bool MetaBackend::bn_finalize_backward(const Tensor& gscale, const Tensor& gshift, const Tensor& sum,
                                       const Tensor& sumsq, const Tensor& weight, int64_t count, double /*eps*/,
                                       const Tensor& gsum, const Tensor& gsumsq, const Tensor& gweight,
                                       const Tensor& gbias) {
  return models_cuda(sum) &&
         cuda::bn_finalize_fused(sum, count, {&gscale, &gshift, &sumsq, &weight, &gsum, &gsumsq, &gweight, &gbias});
}

void MetaBackend::conv2d_backward_weight(const Tensor& gy, const Tensor& x, const Conv2dOptions& o, const Tensor& gw) {
  if (models_cuda(gw)) return cuda_model::conv(cuda_model::ConvDir::BackwardFilter, x, gw, gy, o);
  if (any_channels_last({&gy, &x, &gw}))
    return in_nchw(gw, [&](const Tensor& gwc) { conv2d_backward_weight(gy.contiguous(), x.contiguous(), o, gwc); });
  if (is_half(gy) || is_half(x) || is_half(gw)) {
    const Tensor gwf = f32_output_for(gw);
    return conv2d_backward_weight(widen_half(gy), widen_half(x), o, gwf);
  }
  hold_conv_scratch(cpu::ConvPass::BackwardWeight, x.shape(), gw.shape(), gy.shape(), o, x);
}

// Pooling, batch norm and softmax: the CPU stages channels-last operands in contiguous NCHW
// copies, then f16 ones in f32, and computes into an f32 output; the CUDA kernels read either
// directly (softmax and the NLL loss excepted).
void MetaBackend::max_pool2d_forward(const Tensor& x, const Pool2dOptions& o, const Tensor& y, const Tensor& indices) {
  if (models_cuda(y)) return;
  if (any_channels_last({&x, &y, &indices})) {
    const Tensor yc = empty(y.shape(), y.options()), ic = empty(indices.shape(), indices.options());
    return max_pool2d_forward(x.contiguous(), o, yc, ic);
  }
  if (!(is_half(x) || is_half(y))) return;
  const Tensor yf = f32_output_for(y);
  max_pool2d_forward(widen_half(x), o, yf, indices);
}

void MetaBackend::max_pool2d_backward(const Tensor& gy, const Tensor& indices, const Pool2dOptions& o,
                                      const Tensor& gx) {
  if (models_cuda(gx)) return;
  if (any_channels_last({&gy, &indices, &gx}))
    return in_nchw(gx, [&](const Tensor& gxc) { max_pool2d_backward(gy.contiguous(), indices.contiguous(), o, gxc); });
  if (!(is_half(gy) || is_half(gx))) return;
  const Tensor gxf = f32_output_for(gx);
  max_pool2d_backward(widen_half(gy), indices, o, gxf);
}

void MetaBackend::avg_pool2d_forward(const Tensor& x, const Pool2dOptions& o, const Tensor& y) {
  if (models_cuda(y)) return;
  if (any_channels_last({&x, &y}))
    return in_nchw(y, [&](const Tensor& yc) { avg_pool2d_forward(x.contiguous(), o, yc); });
  if (!(is_half(x) || is_half(y))) return;
  const Tensor yf = f32_output_for(y);
  avg_pool2d_forward(widen_half(x), o, yf);
}

void MetaBackend::avg_pool2d_backward(const Tensor& gy, const Pool2dOptions& o, const Tensor& gx) {
  if (models_cuda(gx)) return;
  if (any_channels_last({&gy, &gx}))
    return in_nchw(gx, [&](const Tensor& gxc) { avg_pool2d_backward(gy.contiguous(), o, gxc); });
  if (!(is_half(gy) || is_half(gx))) return;
  const Tensor gxf = f32_output_for(gx);
  avg_pool2d_backward(widen_half(gy), o, gxf);
}

void MetaBackend::batch_norm_forward_train(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                           const Tensor& running_mean, const Tensor& running_var, double momentum,
                                           double eps, const Tensor& y, const Tensor& save_mean,
                                           const Tensor& save_invstd) {
  if (models_cuda(y)) return cuda_model::batch_norm_forward(x, Tensor(), y, true, save_mean, save_invstd);
  if (!(is_half(x) || is_half(y))) return cpu::narrow_into(cpu::stage_batch_norm_forward(x, y).y, y);
  const Tensor yf = f32_output_for(y);
  batch_norm_forward_train(widen_half(x), weight, bias, running_mean, running_var, momentum, eps, yf, save_mean,
                           save_invstd);
}

void MetaBackend::batch_norm_forward_eval(const Tensor& x, const Tensor& weight, const Tensor& bias,
                                          const Tensor& mean, const Tensor& var, double eps, const Tensor& y) {
  if (models_cuda(y)) return cuda_model::batch_norm_forward(x, Tensor(), y, false, Tensor(), Tensor());
  if (!(is_half(x) || is_half(y))) return cpu::narrow_into(cpu::stage_batch_norm_forward(x, y).y, y);
  const Tensor yf = f32_output_for(y);
  batch_norm_forward_eval(widen_half(x), weight, bias, mean, var, eps, yf);
}

void MetaBackend::batch_norm_backward(const Tensor& gy, const Tensor& x, const Tensor& weight,
                                      const Tensor& save_mean, const Tensor& save_invstd, const Tensor& gx,
                                      const Tensor& gweight, const Tensor& gbias) {
  if (models_cuda(x)) {
    return cuda_model::batch_norm_backward(gy, x, Tensor(), gx, Tensor(), true, gweight.defined(), gbias.defined());
  }
  if (!(is_half(gy) || is_half(x) || is_half(gx)))
    return cpu::narrow_into(cpu::stage_batch_norm_backward(gy, x, gx).gx, gx);
  const Tensor gxf = f32_output_for(gx);
  batch_norm_backward(widen_half(gy), widen_half(x), weight, save_mean, save_invstd, gxf, gweight, gbias);
}

// The fused forms: on the CPU the operands staged as the kernel stages them (the same function),
// on a GPU the fused kernels' scratch.
void MetaBackend::batch_norm_act_forward(const Tensor& x, const Tensor& residual, const Tensor& /*weight*/,
                                         const Tensor& /*bias*/, const Tensor& /*running_mean*/,
                                         const Tensor& /*running_var*/, bool training, double /*momentum*/,
                                         double /*eps*/, const Tensor& y, const Tensor& save_mean,
                                         const Tensor& save_invstd) {
  if (models_cuda(y)) return cuda_model::batch_norm_forward(x, residual, y, training, save_mean, save_invstd);
  const cpu::BatchNormActForwardStage st = cpu::stage_batch_norm_act_forward(x, residual, y);
  cpu::narrow_into(st.y, y);
}

void MetaBackend::batch_norm_act_backward(const Tensor& gy, const Tensor& x, const Tensor& y, const Tensor& /*weight*/,
                                          const Tensor& /*bias*/, const Tensor& /*save_mean*/,
                                          const Tensor& /*save_invstd*/, bool training, const Tensor& gx,
                                          const Tensor& gresidual, const Tensor& gweight, const Tensor& gbias) {
  if (models_cuda(x)) {
    return cuda_model::batch_norm_backward(gy, x, y, gx, gresidual, training, gweight.defined(), gbias.defined());
  }
  const cpu::BatchNormActBackwardStage st = cpu::stage_batch_norm_act_backward(gy, x, y, gx, gresidual);
  cpu::narrow_into(st.gx, gx);
  cpu::narrow_into(st.gresidual, gresidual);
}

void MetaBackend::softmax_forward(const Tensor& x, int64_t dim, bool log, const Tensor& y) {
  if (!(is_half(x) || is_half(y))) return;
  if (models_cuda(y)) {
    const Tensor xf = cuda_model::f32_like(x), yf = cuda_model::f32_like(y);
    return;
  }
  const Tensor yf = f32_output_for(y);
  softmax_forward(widen_half(x), dim, log, yf);
}

void MetaBackend::softmax_backward(const Tensor& gy, const Tensor& y, int64_t dim, bool log, const Tensor& gx) {
  if (!(is_half(gy) || is_half(y) || is_half(gx))) return;
  if (models_cuda(gx)) {
    const Tensor gyf = cuda_model::f32_like(gy), yf = cuda_model::f32_like(y), gxf = cuda_model::f32_like(gx);
    return;
  }
  const Tensor gxf = f32_output_for(gx);
  softmax_backward(widen_half(gy), widen_half(y), dim, log, gxf);
}

void MetaBackend::nll_forward(const Tensor& log_probs, const Tensor& target, const Tensor& losses) {
  if (models_cuda(losses)) return cuda_model::nll_forward(log_probs, target, losses);
  if (!(is_half(log_probs) || is_half(losses))) return;
  const Tensor lf = f32_output_for(losses);
  nll_forward(widen_half(log_probs), target, lf);
}

void MetaBackend::nll_backward(const Tensor& g, const Tensor& target, const Tensor& glogp) {
  if (!(is_half(g) || is_half(glogp))) return;
  if (models_cuda(glogp)) {
    const Tensor gf = cuda_model::f32_like(g), glf = cuda_model::f32_like(glogp);
    return;
  }
  const Tensor gf = f32_output_for(glogp);
  nll_backward(widen_half(g), target, gf);
}

void MetaBackend::cross_entropy_forward(const Tensor& logits, const Tensor& /*target*/, double /*label_smoothing*/,
                                        const Tensor& /*losses*/, const Tensor& /*lse*/) {
  if (models_cuda(logits)) cuda_model::cross_entropy_forward(logits);
}

void MetaBackend::cross_entropy_backward(const Tensor&, const Tensor&, const Tensor&, const Tensor&, double,
                                         const Tensor&) {}

void MetaBackend::reduce(ReduceOp, const Tensor& x, const std::vector<int64_t>& dims, const Tensor& out) {
  if (models_cuda(out)) cuda_model::reduce(x, dims);   // a split reduction's partials
}

void MetaBackend::unscale_grads(const std::vector<Tensor>& grads, double /*inv_scale*/, const Tensor& found_inf) {
  if (models_cuda(found_inf)) cuda_model::unscale_grads(grads);
}

void MetaBackend::unscale_grads_device(const std::vector<Tensor>& grads, const Tensor& scale, const Tensor& found_inf) {
  if (!models_cuda(found_inf)) return Backend::unscale_grads_device(grads, scale, found_inf);   // refused, as on a CPU
  cuda_model::unscale_grads(grads);   // the same pass as the host-scale unscale, the scale read on the device
}

void MetaBackend::update_scale_device(const Tensor& scale, const Tensor& growth_tracker, const Tensor& found_inf,
                                      double growth_factor, double backoff_factor, int64_t growth_interval) {
  if (!models_cuda(scale))
    return Backend::update_scale_device(scale, growth_tracker, found_inf, growth_factor, backoff_factor,
                                        growth_interval);
  // One single-thread kernel on the three scalars: nothing allocated.
}

bool MetaBackend::fused_sgd_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                                 const std::vector<Tensor>& momentum_bufs, const std::vector<uint8_t>& fresh,
                                 const SgdHyper& h) {
  if (params.empty() || !models_cuda(params[0])) return false;   // the CPU has no fused step
  return cuda_model::fused_sgd_step(params, grads, momentum_bufs, fresh, h);
}

bool MetaBackend::fused_adam_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                                  const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                                  const std::vector<Tensor>& max_exp_avg_sq, const std::vector<int64_t>& steps,
                                  const AdamHyper& h) {
  if (params.empty()) return false;
  // The CPU's fused pass allocates no tensor: taking the group is all a dry run needs to model.
  if (!models_cuda(params[0])) return cpu::fused_adam_qualifies(params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, steps, h);
  return cuda_model::fused_adam_step(params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, steps, h);
}

MetaBackend& meta_backend() {
  static MetaBackend* b = new MetaBackend();  // never destroyed: static tensors may outlive it
  return *b;
}

}  // namespace minidl::meta
