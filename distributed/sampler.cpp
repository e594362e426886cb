// Shards of the per-epoch order, which is data::Loader's own shuffle (data::epoch_order), so a
// sharded run and a one-process run agree on which samples an epoch holds.
#include "distributed/sampler.h"

#include <utility>

#include "core/error.h"
#include "data/loader.h"

namespace minidl::distributed {

std::vector<int64_t> DistributedSampler::epoch_order(int64_t n, bool shuffle, uint64_t seed, int64_t epoch) {
  return data::epoch_order(n, shuffle, seed, epoch);
}

DistributedSampler::DistributedSampler(int64_t dataset_size, int rank, int world_size, SamplerOptions options)
    : n_(dataset_size), rank_(rank), world_(world_size), o_(options) {
  MINIDL_CHECK(world_ >= 1 && rank_ >= 0 && rank_ < world_, "DistributedSampler: rank ", rank_,
               " is outside the world of ", world_);
  MINIDL_CHECK(n_ >= 0, "DistributedSampler: dataset size ", n_, " is negative");
  MINIDL_CHECK(o_.tail != Tail::Drop || n_ >= world_, "DistributedSampler: dropping the tail of ", n_,
               " samples over ", world_, " ranks leaves none; use Tail::Pad or fewer ranks");
  MINIDL_CHECK(o_.tail != Tail::Pad || n_ > 0, "DistributedSampler: cannot pad an empty dataset");
}

int64_t DistributedSampler::num_samples() const {
  switch (o_.tail) {
    case Tail::Pad: return (n_ + world_ - 1) / world_;
    case Tail::Drop: return n_ / world_;
    case Tail::Uneven: return n_ / world_ + (rank_ < n_ % world_ ? 1 : 0);
  }
  return 0;
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  std::vector<int64_t> order = epoch_order(n_, o_.shuffle, o_.seed, epoch);
  if (o_.tail == Tail::Pad) {
    const int64_t total = num_samples() * world_;
    for (int64_t i = n_; i < total; ++i) order.push_back(order[static_cast<size_t>(i % n_)]);
  } else if (o_.tail == Tail::Drop) {
    order.resize(static_cast<size_t>(num_samples() * world_));
  }
  std::vector<int64_t> mine;
  mine.reserve(static_cast<size_t>(num_samples()));
  for (size_t i = static_cast<size_t>(rank_); i < order.size(); i += static_cast<size_t>(world_)) {
    mine.push_back(order[i]);
  }
  return mine;
}

std::shared_ptr<data::Dataset> shard(std::shared_ptr<const data::Dataset> dataset, const DistributedSampler& sampler,
                                     int64_t epoch) {
  MINIDL_CHECK(dataset != nullptr, "distributed::shard: null dataset");
  MINIDL_CHECK(dataset->size() == sampler.dataset_size(), "distributed::shard: the sampler was made for ",
               sampler.dataset_size(), " samples but the dataset has ", dataset->size());
  return data::subset(std::move(dataset), sampler.indices(epoch));
}

double reduce_mean(ProcessGroup& group, double sum, double count) {
  Tensor t = from_vector({sum, count}, {2}, {.dtype = DType::f64});
  group.allreduce(t, ReduceOp::Sum);
  const auto v = t.to_vector();
  return v[1] > 0.0 ? v[0] / v[1] : 0.0;
}

}  // namespace minidl::distributed
