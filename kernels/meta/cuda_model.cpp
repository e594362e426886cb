// The CUDA backend's temporaries on the meta device (see cuda_model.h). Each function follows one
// CUDA kernel's host code: the order of its allocations, and the early returns before them; the
// sizes and the decisions (copies, algorithms, tables) come from kernels/cuda/workspace.h.
#include "kernels/meta/cuda_model.h"

#include <memory>
#include <string>

#include "core/allocator.h"

#include "kernels/cuda/workspace.h"
#include "kernels/registry.h"

namespace minidl::meta::cuda_model {
namespace {

// The CUDA backend's answers, through the registry: minidl::core links no CUDA library, and a
// program without minidl::cuda (or a build without CUDA) has none to give.
const cuda::WorkspaceQueries& q(const char* what) {
  const cuda::WorkspaceQueries* w = cuda_workspace_queries();
  MINIDL_CHECK(w != nullptr, "meta:cuda (", what, "): this program has no CUDA backend, whose decisions (cuDNN's "
               "algorithms, cuBLAS's workspace) the dry run for a GPU needs; link minidl::cuda from a CUDA build "
               "(-DMINIDL_CUDA=ON), or dry-run for the cpu (meta:cpu)");
  return *w;
}

// A raw block of the modelled allocator, as kernels/cuda/context.cuh's DeviceBuffer.
class Buffer {
 public:
  Buffer(Device d, size_t n) : alloc_(&allocator_for(d)), n_(n), p_(n ? alloc_->allocate(n) : nullptr) {}
  ~Buffer() {
    if (p_ != nullptr) alloc_->deallocate(p_, n_);
  }
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

 private:
  Allocator* alloc_;
  size_t n_;
  void* p_;
};

// A cuDNN call's workspace: the candidates in order until one fits the allocator, held while the
// call runs; none fitting is the out-of-memory error the CUDA backend throws.
void run_with_workspace(Device d, const std::vector<size_t>& candidates, const char* whose) {
  std::string tried;
  for (size_t ws : candidates) {
    try {
      const TentativeRequests tentative;   // a leaner plan follows
      Buffer b(d, ws);
      return;   // the call runs with this workspace, which is freed when it returns
    } catch (const OutOfMemoryError&) {
      tried += " " + format_bytes(ws);   // a leaner plan may fit
    }
  }
  const MemoryStats s = allocator_for(d).stats();
  throw OutOfMemoryError(std::string("out of memory on meta:cuda: no ") + whose + " workspace fits (tried" + tried +
                             "). Use a smaller batch, or raise the memory budget.",
                         0, static_cast<size_t>(s.reserved_bytes), static_cast<size_t>(s.budget_bytes));
}

// kernels/cuda/conv.cu's to_nhwc / empty_nhwc.
Tensor to_nhwc(const Tensor& t) { return t.detach().permute({0, 2, 3, 1}).contiguous(); }
Tensor empty_nhwc(const Tensor& like) {
  const Shape& s = like.shape();
  return empty({s[0], s[2], s[3], s[1]}, {like.dtype(), like.device(), false});
}

}  // namespace

size_t cublas_workspace_bytes() { return q("cuBLAS workspace").cublas_workspace_bytes(); }

void copy(const Tensor& src, const Tensor& dst) {
  if (dst.numel() == 0) return;
  const bool s_dev = src.device().is_meta(), d_dev = dst.device().is_meta();
  if (s_dev && d_dev) return;   // on the device: a kernel, no temporary
  if (d_dev) {                  // host -> device: a strided target is scattered from a contiguous copy
    if (!dst.is_contiguous()) Tensor d = empty(dst.shape(), {dst.dtype(), dst.device(), false});
    return;
  }
  // device -> host: gathered (and converted) on the device first.
  if (!src.is_contiguous() || src.dtype() != dst.dtype()) Tensor d = empty(src.shape(), {dst.dtype(), src.device(), false});
}

void matmul(const Tensor& a, const Tensor& b, const Tensor& out, const std::function<void()>& draw_workspace) {
  if (out.size(0) == 0 || out.size(1) == 0 || out.size(2) == 0 || a.size(2) == 0) return;
  const auto [copy_a, copy_b] = q("matmul").matmul_operand_copies(a, b);
  const Tensor ca = copy_a ? a.contiguous() : a;
  const Tensor cb = copy_b ? b.contiguous() : b;
  draw_workspace();
}

void conv(ConvDir dir, const Tensor& x, const Tensor& w, const Tensor& y, const Conv2dOptions& o, bool add) {
  // The early returns of conv2d_forward / _backward_input / _backward_weight.
  if (dir == ConvDir::Forward && (y.numel() == 0 || x.numel() == 0 || w.numel() == 0)) return;
  if (dir == ConvDir::BackwardData && (y.numel() == 0 || w.numel() == 0)) return;
  if (dir == ConvDir::BackwardFilter && (y.numel() == 0 || x.numel() == 0)) return;
  std::vector<Tensor> held;   // the NHWC copies, in the kernel's order
  // The backend's rule (check_memory_format): channels-last when any operand prefers it, and then
  // cuDNN runs on the tensors' own memory; set_conv_nhwc's transposes only around NCHW operands.
  const bool cl = prefers_channels_last(x) || prefers_channels_last(w) || prefers_channels_last(y);
  if (q("conv2d").conv_nhwc() && !cl) {
    if (dir == ConvDir::Forward) held = {to_nhwc(x), to_nhwc(w), empty_nhwc(y)};
    else if (dir == ConvDir::BackwardData) held = {to_nhwc(y), to_nhwc(w), empty_nhwc(x)};
    else held = {to_nhwc(x), to_nhwc(y), empty_nhwc(w)};
  }
  if (x.size(0) == 0 || w.size(0) == 0 || x.size(1) == 0) return;   // run(): n, k or c is 0
  const auto cdir = dir == ConvDir::Forward        ? cuda::ConvDir::Forward
                    : dir == ConvDir::BackwardData ? cuda::ConvDir::BackwardData
                                                   : cuda::ConvDir::BackwardFilter;
  run_with_workspace(x.device(),
                     q("conv2d").conv_workspace_candidates(cdir, x.shape(), w.shape(), y.shape(), o, x.dtype(), cl, add),
                     "cuDNN convolution algorithm's");
}

bool conv_stats_forward(const Tensor& x, const Tensor& in_scale, const Tensor& in_bias, const Tensor& w,
                        const Conv2dOptions& o, const Tensor& y, const Tensor& sum, const Tensor& sumsq) {
  const auto ws = q("conv2d_stats").conv_stats_forward_workspaces(x, in_scale, in_bias, w, o, y, sum, sumsq);
  if (!ws) return false;
  run_with_workspace(x.device(), *ws, "fused cuDNN graph's");
  return true;
}

bool conv_stats_backward(const Tensor& gy, const Tensor& x, const Tensor& in_scale, const Tensor& in_bias,
                         const Tensor& w, const Conv2dOptions& o, const Tensor& gx, const Tensor& gscale,
                         const Tensor& gbias, const Tensor& gw) {
  const auto p = q("conv2d_stats backward").conv_stats_backward_plan(gy, x, in_scale, in_bias, w, o, gx, gscale, gbias, gw);
  if (!p) return false;
  // conv_stats.cu's order: the scratch and dr, then the filter gradient's graph, then the data side's.
  const Tensor per = p->scratch ? empty({7, x.size(1)}, {DType::f32, x.device(), false}) : Tensor();
  const Tensor dr = p->makes_dr ? empty({x.size(0), x.size(2), x.size(3), x.size(1)}, {x.dtype(), x.device(), false})
                                : Tensor();
  if (!p->wgrad.empty()) run_with_workspace(x.device(), p->wgrad, "fused cuDNN graph's");
  if (!p->dgrad.empty()) run_with_workspace(x.device(), p->dgrad, "fused cuDNN graph's");
  return true;
}

bool conv_backward_input_add(const Tensor& gx, const Tensor& w, const Tensor& gy, const Conv2dOptions& o) {
  const bool cl = prefers_channels_last(gx) || prefers_channels_last(w) || prefers_channels_last(gy);
  if (q("conv2d").conv_nhwc() && !cl) return false;
  conv(ConvDir::BackwardData, gx, w, gy, o, /*add=*/true);
  return true;
}

// batch_norm.cu's forward(): the statistics it makes itself, then (training) the partial sums;
// batch_norm_backward.cu's backward(): the partial sums and the coefficients.
void batch_norm_forward(const Tensor& x, const Tensor& residual, const Tensor& y, bool training,
                        const Tensor& save_mean, const Tensor& save_invstd) {
  const cuda::BatchNormScratch s =
      q("batch_norm").batch_norm_forward_scratch(x, residual, y, training, save_mean.defined(),
                                                 save_invstd.defined());
  const TensorOptions stats{s.stats_dtype, x.device(), false};
  const Tensor sm = s.make_mean ? empty({s.stats}, stats) : Tensor();
  const Tensor si = s.make_invstd ? empty({s.stats}, stats) : Tensor();
  if (s.partials > 0) Tensor part = empty({s.partials}, {DType::f64, x.device(), false});
}

void batch_norm_backward(const Tensor& gy, const Tensor& x, const Tensor& y, const Tensor& gx, const Tensor& gresidual,
                         bool training, bool wants_gweight, bool wants_gbias) {
  const cuda::BatchNormScratch s =
      q("batch_norm backward").batch_norm_backward_scratch(gy, x, y, gx, gresidual, training, wants_gweight,
                                                           wants_gbias);
  if (s.partials == 0) return;
  const Tensor part = empty({s.partials}, {DType::f64, x.device(), false});
  const Tensor coef = empty({s.coefficients}, {DType::f64, x.device(), false});
}

void nll_forward(const Tensor& log_probs, const Tensor& target, const Tensor& losses) {
  if (is_float16(log_probs.dtype()) || is_float16(losses.dtype())) {
    const Tensor lpf = f32_like(log_probs), lf = f32_like(losses);
    return nll_forward(lpf, target, lf);
  }
  if (log_probs.size(0) > 0) Tensor flag = empty({1}, {DType::i64, target.device(), false});   // the target check
}

void cross_entropy_forward(const Tensor& logits) {
  if (logits.size(0) > 0) Buffer flag(logits.device(), sizeof(unsigned long long));
}

void reduce(const Tensor& x, const std::vector<int64_t>& dims) {
  const size_t bytes = q("reduce").reduce_scratch_bytes(x, dims);
  if (bytes > 0) Buffer partials(x.device(), bytes);
}

// amp.cu's unscale: strided gradients in contiguous copies; dense ones (contiguous or
// channels-last: a channels-last model's weight gradients) walked flat, with no copy.
void unscale_grads(const std::vector<Tensor>& grads) {
  std::vector<Tensor> copies;
  for (const Tensor& g : grads) {
    if (g.defined() && g.numel() > 0 && !g.is_contiguous() && !is_channels_last(g))
      copies.push_back(g.detach().contiguous());
  }
  const size_t bytes = q("unscale_grads").unscale_table_bytes(grads);
  if (bytes > 0) Buffer table(grads.front().device(), bytes);
}

bool fused_sgd_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                    const std::vector<Tensor>& momentum_bufs, const std::vector<uint8_t>& fresh,
                    const SgdHyper& h) {
  const auto bytes = q("fused SGD").fused_sgd_table_bytes(params, grads, momentum_bufs, fresh, h);
  if (!bytes) return false;
  if (*bytes > 0) Buffer table(params.front().device(), *bytes);
  return true;
}

bool fused_adam_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                     const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                     const std::vector<Tensor>& max_exp_avg_sq, const std::vector<int64_t>& steps,
                     const AdamHyper& h) {
  const auto bytes =
      q("fused Adam").fused_adam_table_bytes(params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, steps, h);
  if (!bytes) return false;
  if (*bytes > 0) Buffer table(params.front().device(), *bytes);
  return true;
}


// kernels/cuda/softmax.cu's f32_like: f16 and bf16 softmax and NLL compute in f32 copies.
Tensor f32_like(const Tensor& t) { return empty(t.shape(), {DType::f32, t.device(), false}); }

}  // namespace minidl::meta::cuda_model
