// Host-side argument checks and geometry that the CPU and CUDA backends share, so a kernel
// contract (which layouts a kernel takes, what a class target looks like, how a pooling window is
// described) is written once. `backend` is "cpu" or "cuda": every message reads "op (backend): ...".
#pragma once
#include <cstdint>
#include <initializer_list>
#include <utility>

#include "core/tensor.h"

namespace minidl {
struct Pool2dOptions;
}

namespace minidl::common {

// Each defined tensor in ts must be contiguous (undefined ones, e.g. an absent bias, are skipped).
void check_contiguous(const char* backend, const char* op, std::initializer_list<const Tensor*> ts);

// Class-index targets of NLL and cross-entropy: i64 of shape [N].
void check_class_target(const char* backend, const Tensor& target, int64_t N, const char* op);

// Cross-entropy logits: a contiguous [N, C].
void check_logits(const char* backend, const Tensor& logits, const char* op);

// The operands of NLL (core/backend.h): log_probs (glogp) a contiguous [N, C], target i64 [N]; the
// forward's losses and the backward's g [N] of the log_probs' dtype. Returns N.
int64_t check_nll_forward(const char* backend, const Tensor& log_probs, const Tensor& target, const Tensor& losses);
int64_t check_nll_backward(const char* backend, const Tensor& g, const Tensor& target, const Tensor& glogp);

// The operands of fused cross-entropy (core/backend.h): logits a contiguous [N, C], target i64 [N];
// the forward's losses [N] of the logits' dtype and lse a contiguous f64 [N]; the backward's g [N]
// of the logits' dtype, the forward's lse, and glogits contiguous like the logits.
void check_cross_entropy_forward(const char* backend, const Tensor& logits, const Tensor& target, const Tensor& losses,
                                 const Tensor& lse);
void check_cross_entropy_backward(const char* backend, const Tensor& g, const Tensor& logits, const Tensor& target,
                                  const Tensor& lse, const Tensor& glogits);

// The operands of a batched GEMM as a backend reads them: a and b, each made contiguous where
// `copies` (the backend's matmul_operand_copies, which the meta device's model also reads) says
// its strides are not ones the backend's GEMM takes.
std::pair<Tensor, Tensor> gemm_operands(const Tensor& a, const Tensor& b, std::pair<bool, bool> copies);

// Step between the elements of a loss's incoming gradient: 1 when it is contiguous, 0 when it is
// one value broadcast (every stride 0); anything else is refused.
int64_t grad_step(const char* backend, const Tensor& g, const char* op);

// A contiguous tensor viewed as [outer, C, inner] around `dim` (negative counts from the end): the
// softmax runs along C for every (outer, inner) pair. A 0-d tensor is [1, 1, 1].
struct SoftmaxLayout {
  int64_t outer, C, inner;
};
SoftmaxLayout softmax_layout(const char* backend, const Tensor& x, int64_t dim, const char* op);

// x [N, C, ...] viewed as [N, C, S]: batch norm's per-channel layout. channels_last: x is NHWC
// (only where allow_channels_last; otherwise x must be contiguous).
struct ChannelLayout {
  int64_t N, C, S;
  bool channels_last;
};
ChannelLayout channel_layout(const char* backend, const Tensor& x, const char* op, const char* what,
                             bool allow_channels_last);

// A 2-d pooling window over N*C planes; passed by value to CUDA kernels, so it stays plain data.
// nhwc: the operands are channels-last (a kernel that walks memory takes C fastest).
struct PoolGeom {
  int64_t planes, h, w, oh, ow, kh, kw, sh, sw, ph, pw;
  bool include_pad;
  int64_t channels;   // C
  bool nhwc;
};
PoolGeom pool_geom(const char* backend, const Shape& in, const Shape& out, const Pool2dOptions& o, const char* op,
                   bool nhwc = false);

}  // namespace minidl::common
