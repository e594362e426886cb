// Data-parallel training in the shape of PyTorch's DistributedDataParallel: one model replica per
// rank, parameters and buffers broadcast from rank 0, gradients averaged across ranks in buckets
// whose allreduce starts during backward, as soon as the bucket's last gradient is final.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "core/tensor.h"
#include "distributed/process_group.h"
#include "nn/module.h"
#include "optim/accumulation.h"

namespace minidl::distributed {

struct DataParallelOptions {
  // Bucket size: gradients are packed, in reverse parameter order (the order backward finishes
  // them), into buckets of about this many MiB (PyTorch's bucket_cap_mb); a bucket holds one dtype
  // and device and at least one parameter.
  double bucket_cap_mib = 25.0;
  // Start each bucket's allreduce during backward (true) or all of them after it (false: the
  // baseline that the overlap is measured against).
  bool overlap = true;
  // Broadcast the buffers (batch-norm running statistics) from rank 0 before each forward, as
  // PyTorch's broadcast_buffers=True, so every rank evaluates with rank 0's statistics.
  bool broadcast_buffers = true;
};

// The rule for each backward: outside no_sync(), the backward of every parameter that requires
// grad marks it ready; a bucket whose parameters are all ready starts its allreduce (mean) once
// every earlier bucket has started, so all ranks issue the same collectives in the same order.
// finish_gradient_sync() (or after_backward) launches what is left, waits for every bucket and
// writes the averages back into .grad; a parameter that got no gradient on this rank counts as 0.
// Inside no_sync() gradients only accumulate locally: no communication at all; the next synchronised
// backward averages the whole accumulated gradient.
class DataParallel final : public optim::GradientSync {
 public:
  DataParallel(nn::Module& module, ProcessGroup& group, DataParallelOptions options = {});
  ~DataParallel() override;
  DataParallel(const DataParallel&) = delete;
  DataParallel& operator=(const DataParallel&) = delete;

  // The module's forward (buffers broadcast first when the option is on and training).
  Tensor operator()(const Tensor& x);
  nn::Module& module() { return module_; }
  ProcessGroup& group() { return group_; }

  // Backwards run inside the guard's lifetime do not synchronise.
  class NoSyncGuard {
   public:
    explicit NoSyncGuard(DataParallel& dp) : dp_(dp), prev_(dp.sync_enabled_) { dp.sync_enabled_ = false; }
    ~NoSyncGuard() { dp_.sync_enabled_ = prev_; }
    NoSyncGuard(const NoSyncGuard&) = delete;
    NoSyncGuard& operator=(const NoSyncGuard&) = delete;

   private:
    DataParallel& dp_;
    bool prev_;
  };
  NoSyncGuard no_sync() { return NoSyncGuard(*this); }
  bool sync_enabled() const { return sync_enabled_; }

  // Launches every bucket not started yet, waits for all and writes the averages into .grad.
  // Nothing to do inside no_sync() or when no backward ran since the last call.
  void finish_gradient_sync();
  // Parameters and buffers from rank 0 (the constructor does it).
  void broadcast_state();
  // What operator() does before the forward: the buffers from rank 0 when broadcast_buffers is on,
  // the module is training and the world is above 1. For callers that run the module's forward
  // themselves (under autocast, or through a recomputation wrapper).
  void sync_buffers();

  // optim::GradientSync, for AccumulatingTrainer.
  void before_backward(bool will_step) override { sync_enabled_ = will_step; }
  void after_backward(bool will_step) override;
  bool any(bool flag) override { return group_.any(flag); }
  double same(double value) override { return group_.allreduce(value, ReduceOp::Max); }

  // Bucket layout (parameter indices in module_.parameters() order, per bucket, launch order).
  const std::vector<std::vector<size_t>>& buckets() const { return bucket_params_; }

 private:
  struct Bucket {
    std::vector<size_t> params;
    std::vector<int64_t> offsets;  // element offset of each parameter in flat
    Tensor flat;
    size_t pending = 0;            // parameters not ready yet in this backward
    std::unique_ptr<Work> work;
  };
  void mark_ready(size_t param);
  void launch(size_t b);
  void launch_ready_in_order();
  void progress();
  void reset_round();

  nn::Module& module_;
  ProcessGroup& group_;
  DataParallelOptions o_;
  std::vector<Tensor> params_;
  std::vector<uint64_t> hook_ids_;
  std::vector<size_t> bucket_of_;
  std::vector<char> ready_;
  std::vector<Bucket> buckets_;
  std::vector<std::vector<size_t>> bucket_params_;
  size_t next_launch_ = 0;
  bool round_active_ = false;  // a synchronised backward marked something since the last finish
  bool sync_enabled_ = true;
};

}  // namespace minidl::distributed
