// The distributed sampler: every rank reads a disjoint shard of the same per-epoch shuffle, so
// one epoch over all ranks sees each sample once (up to the tail rule), and the validation metric
// reduced across ranks, as PyTorch's DistributedSampler and an all-reduced metric do.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "data/dataset.h"
#include "distributed/process_group.h"

namespace minidl::distributed {

// What happens to the last n % world samples of the epoch's order.
enum class Tail {
  Pad,     // repeat samples from the start of the order until every rank has ceil(n / world)
           // (PyTorch's drop_last=False): a few samples count twice per epoch; for training
  Drop,    // leave them out this epoch, every rank gets floor(n / world) (drop_last=True); the
           // shuffle changes them every epoch
  Uneven,  // no padding, no loss: shards differ by at most one sample; for evaluation, where every
           // sample must count exactly once (ranks then run different numbers of batches, so the
           // loop must not synchronise per batch: reduce the metric once at the end)
};

struct SamplerOptions {
  bool shuffle = true;
  uint64_t seed = 0;
  Tail tail = Tail::Pad;
};

class DistributedSampler {
 public:
  DistributedSampler(int64_t dataset_size, int rank, int world_size, SamplerOptions options = {});
  // This rank's sample indices for `epoch`: order[rank], order[rank + world], ... of the padded or
  // trimmed epoch order. The same (seed, epoch) gives the same order on every rank and for every
  // world size; with world 1 and Tail::Pad it is the order data::Loader shuffles into.
  std::vector<int64_t> indices(int64_t epoch) const;
  int64_t num_samples() const;  // this rank's shard length (the same on every rank unless Uneven)
  int64_t dataset_size() const { return n_; }

  // The permutation of [0, n) for (seed, epoch): the loader's own shuffle (data/loader.cpp).
  static std::vector<int64_t> epoch_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch);

 private:
  int64_t n_;
  int rank_;
  int world_;
  SamplerOptions o_;
};

// The dataset restricted to this rank's shard for `epoch` (feed it to a data::Loader with
// shuffle off: the sampler already shuffled).
std::shared_ptr<data::Dataset> shard(std::shared_ptr<const data::Dataset> dataset, const DistributedSampler& sampler,
                                     int64_t epoch);

// A metric over all ranks: the sum of `sum` divided by the sum of `count` (e.g. correct
// predictions and samples of each rank's shard); 0 when no rank saw a sample.
double reduce_mean(ProcessGroup& group, double sum, double count);

}  // namespace minidl::distributed
