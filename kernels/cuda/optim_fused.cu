// Fused multi-tensor optimizer updates: ONE launch updates every parameter of a group (SGD or
// Adam/AdamW), instead of ~10 elementwise launches per parameter, which dominate a small-batch
// step of a network with hundreds of parameter tensors. The formulas are optim/sgd.cpp's and
// optim/adam.cpp's, one rounded f32 operation per tensor op (no FMA contraction), so results match
// the CPU per-tensor path to within f32 rounding (tests/optim/optimizer_fused_cuda_test.cpp).
// The kernels read the learning rate, and Adam's per-parameter step count, from device memory in
// the optimizer's device state (optim/optimizer.h), and compute Adam's bias corrections on the
// device in every state, so a captured step replays with the current values and a graphed run
// rounds as an eager one on the same device.
#include <cmath>
#include <vector>

#include "kernels/cuda/context.cuh"
#include "kernels/cuda/cuda_backend.cuh"
#include "kernels/cuda/device/common.cuh"
#include "kernels/cuda/device/launch.cuh"
#include "kernels/cuda/workspace.h"

namespace minidl::cuda {
namespace {

constexpr int64_t kChunkElems = int64_t{1} << 16;

// A slice of one parameter and its state; one block per chunk (multi-tensor-apply style).
struct SgdChunk {
  float* p;
  const float* g;
  float* buf;       // nullptr without momentum
  int64_t n;
  int32_t fresh;    // the buffer is new: buf = g (PyTorch's first momentum step)
};

struct AdamChunk {
  float* p;
  const float* g;
  float* m;
  float* v;
  float* vmax;        // nullptr without amsgrad
  int64_t n;
  int64_t step;       // the parameter's count including this step (its own t), kept by the host
  int64_t* count;     // the device state's count before this step instead (nullptr: `step`)
  int32_t first;      // the parameter's first chunk: adam_advance_kernel advances `count` once
};

struct SgdArgs {
  float wd, momentum, one_minus_dampening;
  double lr;
  const double* lr_device;   // the device state's rate, read when the kernel runs (nullptr: lr)
  bool use_wd, use_momentum, nesterov, maximize;
  const float* skip_if;   // device flag: nonzero, nothing changes (the scaler's skipped step)
};

struct AdamArgs {
  float wd, beta1, one_minus_beta1, beta2, one_minus_beta2;
  double lr, weight_decay, beta1_d, beta2_d, eps;
  const double* lr_device;
  bool use_wd, decoupled, amsgrad, maximize, keras_eps;
  const float* skip_if;
};

// One parameter's step scalars, computed in double as kernels/cpu/optim.cpp and optim/adam.cpp do
// on the host (each operation rounded once: __dmul_rn / __dadd_rn keep the compiler from fusing a
// multiply-add the host does not fuse; double division and sqrt round correctly), then rounded
// to f32. On the device, so that the learning rate and the step count may be device values.
struct AdamStepScalars {
  float decay_factor;   // 1 - lr * wd (AdamW)
  float neg_step_size;  // -(lr / (1 - beta1^t))
  float bc2_sqrt;       // sqrt(1 - beta2^t)
  float eps;            // eps, or Keras' eps / sqrt(1 - beta2^t)
};

__device__ inline AdamStepScalars adam_step_scalars(const AdamArgs& a, double lr, int64_t step) {
  const auto t = static_cast<double>(step);
  const double bc1 = __dadd_rn(1.0, -pow(a.beta1_d, t));
  const double bc2_sqrt = sqrt(__dadd_rn(1.0, -pow(a.beta2_d, t)));
  AdamStepScalars s;
  s.decay_factor = static_cast<float>(__dadd_rn(1.0, -__dmul_rn(lr, a.weight_decay)));
  s.neg_step_size = static_cast<float>(-(lr / bc1));
  s.bc2_sqrt = static_cast<float>(bc2_sqrt);
  s.eps = static_cast<float>(a.keras_eps ? a.eps / bc2_sqrt : a.eps);
  return s;
}

__global__ void sgd_kernel(const SgdChunk* __restrict__ chunks, int64_t nchunks, SgdArgs a) {
  if (a.skip_if != nullptr && *a.skip_if != 0.0f) return;   // decided on the device: no host sync
  const auto neg_lr = static_cast<float>(-(a.lr_device != nullptr ? *a.lr_device : a.lr));
  for (int64_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const SgdChunk ch = chunks[c];
    for (int64_t i = threadIdx.x; i < ch.n; i += blockDim.x) {
      const float p = ch.p[i];
      float d = a.maximize ? -ch.g[i] : ch.g[i];
      if (a.use_wd) d = __fadd_rn(d, __fmul_rn(a.wd, p));                       // d_p.add_(p, wd)
      if (a.use_momentum) {
        float b;
        if (ch.fresh) {
          b = d;                                                                 // buf = d_p.clone()
        } else {
          b = __fmul_rn(ch.buf[i], a.momentum);                                  // buf.mul_(momentum)
          b = __fadd_rn(b, __fmul_rn(a.one_minus_dampening, d));                 //    .add_(d_p, 1 - dampening)
        }
        ch.buf[i] = b;
        d = a.nesterov ? __fadd_rn(d, __fmul_rn(a.momentum, b)) : b;             // d_p.add_(buf, momentum)
      }
      ch.p[i] = __fadd_rn(p, __fmul_rn(neg_lr, d));                              // p.add_(d_p, -lr)
    }
  }
}

// The device state's counts: each parameter's, once, before adam_kernel reads them (a separate
// launch, so that no block of adam_kernel reads a count another block is advancing).
__global__ void adam_advance_kernel(const AdamChunk* __restrict__ chunks, int64_t nchunks, AdamArgs a) {
  if (a.skip_if != nullptr && *a.skip_if != 0.0f) return;   // a skipped step is not counted
  for (int64_t c = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; c < nchunks;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    if (chunks[c].first) *chunks[c].count += 1;
  }
}

__global__ void adam_kernel(const AdamChunk* __restrict__ chunks, int64_t nchunks, AdamArgs a) {
  if (a.skip_if != nullptr && *a.skip_if != 0.0f) return;
  const double lr = a.lr_device != nullptr ? *a.lr_device : a.lr;
  for (int64_t c = blockIdx.x; c < nchunks; c += gridDim.x) {
    const AdamChunk ch = chunks[c];
    const AdamStepScalars k = adam_step_scalars(a, lr, ch.count != nullptr ? *ch.count : ch.step);
    for (int64_t i = threadIdx.x; i < ch.n; i += blockDim.x) {
      float p = ch.p[i];
      float g = a.maximize ? -ch.g[i] : ch.g[i];
      if (a.decoupled) {
        p = __fmul_rn(p, k.decay_factor);                                       // p.mul_(1 - lr * wd)
      } else if (a.use_wd) {
        g = __fadd_rn(g, __fmul_rn(a.wd, p));                                   // g.add_(p, wd)
      }
      float m = __fmul_rn(ch.m[i], a.beta1);
      m = __fadd_rn(m, __fmul_rn(a.one_minus_beta1, g));
      float v = __fmul_rn(ch.v[i], a.beta2);
      v = __fadd_rn(v, __fmul_rn(a.one_minus_beta2, __fmul_rn(g, g)));
      ch.m[i] = m;
      ch.v[i] = v;
      float s = v;
      if (a.amsgrad) {
        const float vm = ch.vmax[i];
        s = (::isnan(vm) || ::isnan(v)) ? vm + v : (vm > v ? vm : v);            // maximum(), NaN propagates
        ch.vmax[i] = s;
      }
      const float denom = __fadd_rn(__fdiv_rn(__fsqrt_rn(s), k.bc2_sqrt), k.eps);
      ch.p[i] = __fadd_rn(p, __fmul_rn(k.neg_step_size, __fdiv_rn(m, denom)));     // p.add_(m / denom, -step_size)
    }
  }
}

// Whether every tensor of every list is a dense f32 tensor on `dev` with its parameter's shape
// and memory order (lists may be empty: state the optimizer does not keep). A GPU, or the meta
// device standing for one (kernels/cuda/workspace.h).
bool eligible(const std::vector<Tensor>& params, std::initializer_list<const std::vector<Tensor>*> lists) {
  if (params.empty() || !params[0].defined() || params[0].device().target() != DeviceType::CUDA) return false;
  const Device dev = params[0].device();
  for (const std::vector<Tensor>* l : lists) {
    if (l->empty()) continue;
    if (l->size() != params.size()) return false;
    for (size_t i = 0; i < l->size(); ++i) {
      const Tensor& t = (*l)[i];
      // Flat walks need one memory order: contiguous, or channels-last (conv weights, their
      // gradients and the state made from them in a channels-last model).
      if (!t.defined() || t.device() != dev || t.dtype() != DType::f32 || !same_memory_order(t, params[i]) ||
          !(t.is_contiguous() || is_channels_last(t))) {
        return false;
      }
    }
  }
  return true;
}

// Uploads the chunk table once and launches `kernel` over it, after `before` (a kernel over the
// same table, one thread per chunk) when given.
template <typename Chunk, typename Args>
void launch(const Tensor& any, const std::vector<Chunk>& chunks, void (*kernel)(const Chunk*, int64_t, Args),
            const Args& args, const char* name, void (*before)(const Chunk*, int64_t, Args) = nullptr,
            const char* before_name = nullptr) {
  if (chunks.empty()) return;
  DeviceContext& ctx = context_of(any);
  const size_t bytes = chunks.size() * sizeof(Chunk);
  DeviceBuffer meta(ctx, bytes);   // stream-ordered reuse makes freeing it after the launch safe
  ctx.staging().to_device(meta.get(), chunks.data(), bytes, ctx.stream());
  const auto n = static_cast<int64_t>(chunks.size());
  const auto* table = static_cast<const Chunk*>(meta.get());
  if (before != nullptr)
    MINIDL_LAUNCH_NOWAIT(before_name, before, grid_for(n), kThreads, 0, ctx.stream(), table, n, args);
  MINIDL_LAUNCH_NOWAIT(name, kernel, grid_for(n * kThreads), kThreads, 0, ctx.stream(), table, n, args);
}

// Whether a group takes the fused steps below, and their chunk count.
bool sgd_qualifies(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                   const std::vector<Tensor>& momentum_bufs, const std::vector<uint8_t>& fresh,
                   const SgdHyper& h) {
  const bool use_momentum = h.momentum != 0.0;
  return grads.size() == params.size() && (!use_momentum || momentum_bufs.size() == params.size()) &&
         (!use_momentum || fresh.size() == params.size()) && eligible(params, {&params, &grads, &momentum_bufs});
}

bool adam_qualifies(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                    const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                    const std::vector<Tensor>& max_exp_avg_sq, const std::vector<int64_t>& steps,
                    const AdamHyper& h) {
  return grads.size() == params.size() && exp_avg.size() == params.size() &&
         exp_avg_sq.size() == params.size() &&
         steps.size() == params.size() && (!h.amsgrad || max_exp_avg_sq.size() == params.size()) &&
         eligible(params, {&params, &grads, &exp_avg, &exp_avg_sq, &max_exp_avg_sq});
}

size_t chunk_count(const std::vector<Tensor>& params) {
  size_t n = 0;
  for (const Tensor& p : params) n += static_cast<size_t>((p.numel() + kChunkElems - 1) / kChunkElems);
  return n;
}

}  // namespace

std::optional<size_t> fused_sgd_table_bytes(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                                            const std::vector<Tensor>& momentum_bufs,
                                            const std::vector<uint8_t>& fresh, const SgdHyper& h) {
  if (!sgd_qualifies(params, grads, momentum_bufs, fresh, h)) return std::nullopt;
  return chunk_count(params) * sizeof(SgdChunk);
}

std::optional<size_t> fused_adam_table_bytes(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                                             const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                                             const std::vector<Tensor>& max_exp_avg_sq,
                                             const std::vector<int64_t>& steps, const AdamHyper& h) {
  if (!adam_qualifies(params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, steps, h)) return std::nullopt;
  return chunk_count(params) * sizeof(AdamChunk);
}

bool CudaBackend::fused_sgd_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                                 const std::vector<Tensor>& momentum_bufs, const std::vector<uint8_t>& fresh,
                                 const SgdHyper& h) {
  const bool use_momentum = h.momentum != 0.0;
  if (!sgd_qualifies(params, grads, momentum_bufs, fresh, h)) return false;
  std::vector<SgdChunk> chunks;
  for (size_t t = 0; t < params.size(); ++t) {
    const int64_t n = params[t].numel();
    for (int64_t off = 0; off < n; off += kChunkElems) {
      SgdChunk c{};
      c.p = params[t].data<float>() + off;
      c.g = grads[t].data<float>() + off;
      c.buf = use_momentum ? momentum_bufs[t].data<float>() + off : nullptr;
      c.n = std::min(kChunkElems, n - off);
      c.fresh = use_momentum && fresh[t] != 0 ? 1 : 0;
      chunks.push_back(c);
    }
  }
  SgdArgs a{};
  a.wd = static_cast<float>(h.weight_decay);
  a.momentum = static_cast<float>(h.momentum);
  a.one_minus_dampening = static_cast<float>(1.0 - h.dampening);
  a.lr = h.lr;
  a.lr_device = h.lr_device;
  a.use_wd = h.weight_decay != 0.0;
  a.use_momentum = use_momentum;
  a.nesterov = h.nesterov;
  a.maximize = h.maximize;
  a.skip_if = h.skip_if;
  launch(params[0], chunks, sgd_kernel, a, "fused_sgd_step");
  return true;
}

bool CudaBackend::fused_adam_step(const std::vector<Tensor>& params, const std::vector<Tensor>& grads,
                                  const std::vector<Tensor>& exp_avg, const std::vector<Tensor>& exp_avg_sq,
                                  const std::vector<Tensor>& max_exp_avg_sq, const std::vector<int64_t>& steps,
                                  const AdamHyper& h) {
  if (!adam_qualifies(params, grads, exp_avg, exp_avg_sq, max_exp_avg_sq, steps, h)) return false;
  std::vector<AdamChunk> chunks;
  for (size_t t = 0; t < params.size(); ++t) {
    int64_t* count = h.step_device != nullptr ? h.step_device[t] : nullptr;
    MINIDL_CHECK(count != nullptr || steps[t] >= 1, "fused_adam_step (cuda): step ", steps[t], " of parameter ", t,
                 " must be >= 1 (the count including this step)");
    const int64_t n = params[t].numel();
    for (int64_t off = 0; off < n; off += kChunkElems) {
      AdamChunk c{};
      c.p = params[t].data<float>() + off;
      c.g = grads[t].data<float>() + off;
      c.m = exp_avg[t].data<float>() + off;
      c.v = exp_avg_sq[t].data<float>() + off;
      c.vmax = h.amsgrad ? max_exp_avg_sq[t].data<float>() + off : nullptr;
      c.n = std::min(kChunkElems, n - off);
      c.step = steps[t];
      c.count = count;
      c.first = off == 0 ? 1 : 0;
      chunks.push_back(c);
    }
  }
  const AdamArgs a{.wd = static_cast<float>(h.weight_decay),
                   .beta1 = static_cast<float>(h.beta1),
                   .one_minus_beta1 = static_cast<float>(1.0 - h.beta1),
                   .beta2 = static_cast<float>(h.beta2),
                   .one_minus_beta2 = static_cast<float>(1.0 - h.beta2),
                   .lr = h.lr,
                   .weight_decay = h.weight_decay,
                   .beta1_d = h.beta1,
                   .beta2_d = h.beta2,
                   .eps = h.eps,
                   .lr_device = h.lr_device,
                   .use_wd = h.weight_decay != 0.0,
                   .decoupled = h.decoupled,
                   .amsgrad = h.amsgrad,
                   .maximize = h.maximize,
                   .keras_eps = h.keras_eps,
                   .skip_if = h.skip_if};
  if (h.step_device != nullptr) {
    launch(params[0], chunks, adam_kernel, a, "fused_adam_step", adam_advance_kernel, "fused_adam_advance");
  } else {
    launch(params[0], chunks, adam_kernel, a, "fused_adam_step");
  }
  return true;
}

}  // namespace minidl::cuda
