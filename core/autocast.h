// Autocast: a thread-local scope in which the op front-ends pick the precision of each op, the way
// torch.autocast does. Convolutions, GEMMs and linear layers run in the scope's low-precision
// dtype, f16 or bf16 (f32 accumulation inside the kernels), losses, softmax and sums in f32, batch
// norm in its input's dtype with f32 statistics; everything else runs in the dtype it is given:
// one op list for both dtypes, as PyTorch's CUDA autocast has. Master weights stay f32: the low
// copy of a weight is made once per optimizer step (the cache below) and its gradient flows back
// to the f32 master as f32. bf16 keeps f32's range, so it needs no gradient scaler (GradScaler is
// f16's).
#pragma once
#include <cstdint>

#include "core/tensor.h"

namespace minidl {

bool autocast_enabled();   // thread-local, off by default
DType autocast_dtype();    // the low-precision dtype of the innermost active scope (f16 or bf16)

// Turns autocast on (or, with enabled = false, off) until destroyed; scopes nest.
class AutocastGuard {
 public:
  explicit AutocastGuard(DType dtype = DType::f16, bool enabled = true);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool prev_enabled_;
  DType prev_dtype_;
};

// The casts the front-ends apply; both return t unchanged outside autocast or when there is
// nothing to cast. autocast_to_low: f32 -> the autocast dtype (differentiable; the gradient comes
// back as f32). autocast_to_f32: f16 or bf16 -> f32 (differentiable).
Tensor autocast_to_low(const Tensor& t);
Tensor autocast_to_f32(const Tensor& t);
// Binary elementwise ops under autocast: operands of different floating dtypes both go to the
// wider one (f16 with f32 gives f32), as PyTorch's type promotion.
void autocast_promote(Tensor& a, Tensor& b);

// The weight cache. Under autocast with grad mode on, the f16 copy of an f32 leaf that requires
// grad (a parameter) is made once and reused by every later cast of that leaf, in any autocast
// scope, until the cache is cleared: optim::Optimizer::step() clears it after updating the
// weights and Optimizer::zero_grad() when a step or window starts (also after a skipped step), so
// with gradient accumulation the k micro-batches of a window share one copy per weight. Each use
// gets its own autograd node over the shared f16 bytes, so releasing one micro-batch's graph never
// frees the copy. Whoever changes weights between zero_grad() and step() (editing parameters by
// hand mid-window) calls autocast_clear_cache().
void autocast_clear_cache();
struct AutocastCacheStats {
  int64_t hits = 0;      // casts served from the cache since the last reset
  int64_t misses = 0;    // casts that made a new copy
  int64_t entries = 0;   // copies held now
  int64_t bytes = 0;     // their size
};
AutocastCacheStats autocast_cache_stats();
void reset_autocast_cache_stats();

}  // namespace minidl
