// DataParallel: bucket layout, the per-parameter "gradient ready" hook that starts a bucket's
// allreduce during backward, and the wait that writes the averaged gradients back before the step.
#include "distributed/data_parallel.h"

#include <algorithm>

#include "core/autograd.h"
#include "core/error.h"

namespace minidl::distributed {

DataParallel::DataParallel(nn::Module& module, ProcessGroup& group, DataParallelOptions options)
    : module_(module), group_(group), o_(options) {
  MINIDL_CHECK(o_.bucket_cap_mib > 0.0, "DataParallel: bucket_cap_mib must be > 0 (PyTorch's default is 25), got ",
               o_.bucket_cap_mib);
  for (const Tensor& p : module_.parameters()) {
    if (p.requires_grad()) params_.push_back(p);
  }
  MINIDL_CHECK(!params_.empty(), "DataParallel: the ", module_.type_name(), " has no parameter that requires grad");
  int64_t numel = 0;
  for (const Tensor& p : params_) numel += p.numel();
  group_.check_same("the number of parameters that require grad", static_cast<int64_t>(params_.size()));
  group_.check_same("the number of parameter elements", numel);
  broadcast_state();

  // Buckets in reverse parameter order: backward finishes the last layers first.
  const auto cap = static_cast<size_t>(o_.bucket_cap_mib * 1024.0 * 1024.0);
  bucket_of_.assign(params_.size(), 0);
  size_t bytes = 0;
  for (size_t k = params_.size(); k-- > 0;) {
    const Tensor& p = params_[k];
    const bool fits = !buckets_.empty() && bytes + p.nbytes() <= cap &&
                      params_[buckets_.back().params.front()].dtype() == p.dtype() &&
                      params_[buckets_.back().params.front()].device() == p.device();
    if (!fits) {
      buckets_.emplace_back();
      bytes = 0;
    }
    Bucket& b = buckets_.back();
    b.offsets.push_back(b.params.empty() ? 0 : b.offsets.back() + params_[b.params.back()].numel());
    b.params.push_back(k);
    bucket_of_[k] = buckets_.size() - 1;
    bytes += p.nbytes();
  }
  for (Bucket& b : buckets_) {
    const Tensor& last = params_[b.params.back()];
    b.flat = zeros({b.offsets.back() + last.numel()}, last.options());
    bucket_params_.push_back(b.params);
  }
  ready_.assign(params_.size(), 0);
  reset_round();
  for (size_t k = 0; k < params_.size(); ++k) {
    hook_ids_.push_back(params_[k].register_post_accumulate_grad_hook([this, k](const Tensor&) { mark_ready(k); }));
  }
}

DataParallel::~DataParallel() {
  for (size_t k = 0; k < params_.size(); ++k) params_[k].remove_post_accumulate_grad_hook(hook_ids_[k]);
}

void DataParallel::broadcast_state() {
  NoGradGuard no_grad;
  for (const Tensor& p : params_) group_.broadcast(p, 0);
  for (const Tensor& b : module_.buffers()) group_.broadcast(b, 0);
}

void DataParallel::sync_buffers() {
  if (o_.broadcast_buffers && module_.is_training() && group_.world_size() > 1) {
    NoGradGuard no_grad;
    for (const Tensor& b : module_.buffers()) group_.broadcast(b, 0);
  }
}

Tensor DataParallel::operator()(const Tensor& x) {
  sync_buffers();
  return module_(x);
}

void DataParallel::reset_round() {
  std::fill(ready_.begin(), ready_.end(), 0);
  for (Bucket& b : buckets_) {
    b.pending = b.params.size();
    b.work.reset();
  }
  next_launch_ = 0;
  round_active_ = false;
}

void DataParallel::mark_ready(size_t k) {
  if (!sync_enabled_) return;
  MINIDL_CHECK(!ready_[k], "DataParallel (rank ", group_.rank(), "): parameter ", k, " ", params_[k].meta(),
               " got a second gradient in one synchronised step: a backward ran again before the gradients were ",
               "averaged. Run the accumulation micro-batches that do not step inside no_sync(), or call ",
               "finish_gradient_sync() before the next backward");
  round_active_ = true;
  ready_[k] = 1;
  --buckets_[bucket_of_[k]].pending;
  if (o_.overlap) {
    launch_ready_in_order();
    progress();
  }
}

void DataParallel::launch_ready_in_order() {
  while (next_launch_ < buckets_.size() && buckets_[next_launch_].pending == 0) launch(next_launch_++);
}

void DataParallel::launch(size_t bi) {
  Bucket& b = buckets_[bi];
  NoGradGuard no_grad;
  for (size_t j = 0; j < b.params.size(); ++j) {
    const Tensor& p = params_[b.params[j]];
    Tensor slot = b.flat.slice(0, b.offsets[j], b.offsets[j] + p.numel());
    const Tensor g = p.grad();
    if (g.defined()) {
      slot.copy_(g.reshape({-1}));
    } else {
      slot.zero_();  // no gradient on this rank: it contributes 0 to the average
    }
  }
  b.work = group_.allreduce_async(b.flat, ReduceOp::Mean);
}

void DataParallel::progress() {
  for (size_t bi = 0; bi < next_launch_; ++bi) {
    if (buckets_[bi].work && !buckets_[bi].work->test()) break;  // MPI progresses inside these calls
  }
}

void DataParallel::after_backward(bool will_step) {
  if (will_step) finish_gradient_sync();
  sync_enabled_ = true;
}

void DataParallel::finish_gradient_sync() {
  if (!sync_enabled_ || !round_active_) return;
  while (next_launch_ < buckets_.size()) launch(next_launch_++);
  NoGradGuard no_grad;
  for (Bucket& b : buckets_) {
    b.work->wait();
    for (size_t j = 0; j < b.params.size(); ++j) {
      Tensor& p = params_[b.params[j]];
      const Tensor avg = b.flat.slice(0, b.offsets[j], b.offsets[j] + p.numel()).view(p.shape());
      if (p.grad().defined()) {
        p.grad().copy_(avg);
      } else {
        p.set_grad(avg.clone());
      }
    }
  }
  reset_round();
}

}  // namespace minidl::distributed
