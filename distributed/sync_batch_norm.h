// Synchronised batch norm: the batch statistics of every BatchNorm2d computed over the global batch
// (all ranks), as PyTorch's SyncBatchNorm, for models whose per-device batch is too small for good
// statistics. The default stays per-rank batch norm, as in DistributedDataParallel.
#pragma once
#include <cstdint>

#include "core/tensor.h"
#include "distributed/process_group.h"
#include "nn/module.h"

namespace minidl::distributed {

// `t` summed over every rank of `group`, as a differentiable op: its backward sums the incoming
// gradients over the ranks the same way (every rank's result depends on every rank's input).
// Every rank must call it, in the same order, in forward and (through backward) in backward.
Tensor allreduce_sum(ProcessGroup& group, const Tensor& t);

// Makes every BatchNorm2d in `module` synchronised over `group` (PyTorch's convert_sync_batchnorm;
// here the layers stay the same objects). Returns how many it converted. `group` must outlive them.
int64_t convert_sync_batch_norm(nn::Module& module, ProcessGroup& group);

}  // namespace minidl::distributed
