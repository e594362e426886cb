// The cache of cuDNN plans that both convolution paths (conv_graph.cu, conv_legacy.cu) and the
// fused conv + batch-norm graphs (conv_stats.cu) keep, one per key (a shape and the switches its
// plan depends on). Plain C++, so that it is tested on the CPU (tests/kernels/plan_cache_test.cpp).
//
// Why least-recently-used: a long batch-size search (minidl-maxbatch's trials, a sweep's rows in
// one process) plans every layer at every size it tries, so the cache needs a bound. It used to
// start again from empty past the bound, and when that happened during a CUDA-graph warm-up step,
// the plans the step had just made were gone before its capture, which cannot make plans: the
// capture failed with "has no cuDNN plan yet" (the techniques study on an H200, batch 81 and 83 of
// the recomputation rows). Evicting the least recently used key keeps every key of the last step:
// one step uses far fewer keys than the bound.
#pragma once
#include <cstddef>
#include <list>
#include <map>
#include <mutex>
#include <utility>

namespace minidl::cuda {

// Shared by every thread: looked up on every call, made once on a key's first. A value made twice
// by racing threads keeps the first. With a bound, a value leaves the cache only after `max_keys`
// other keys were used since it was last used, so a caller copies the value it found or made at
// once (a shared_ptr) or, without a bound, may hold a reference until clear().
template <class Key, class Value>
class PlanCache {
 public:
  // The value under `key` (now the most recently used), or nullptr.
  const Value* find(const Key& key) {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = map_.find(key);
    if (it == map_.end()) return nullptr;
    touch(it);
    return &it->second.value;
  }
  // Keeps `value` under `key` (unless a value is there already) and returns the one kept; with
  // `max_keys` > 0 (0: no bound), the least recently used keys leave first to keep at most that many.
  const Value& insert(const Key& key, Value value, size_t max_keys = 0) {
    std::lock_guard<std::mutex> lock(mu_);
    if (auto it = map_.find(key); it != map_.end()) {
      touch(it);
      return it->second.value;
    }
    while (max_keys > 0 && map_.size() >= max_keys) {
      map_.erase(order_.back());
      order_.pop_back();
    }
    order_.push_front(key);
    return map_.try_emplace(key, Entry{std::move(value), order_.begin()}).first->second.value;
  }
  size_t size() {
    std::lock_guard<std::mutex> lock(mu_);
    return map_.size();
  }
  void clear() {
    std::lock_guard<std::mutex> lock(mu_);
    map_.clear();
    order_.clear();
  }

 private:
  struct Entry {
    Value value;
    typename std::list<Key>::iterator use;   // its place in order_
  };
  void touch(typename std::map<Key, Entry>::iterator it) { order_.splice(order_.begin(), order_, it->second.use); }

  std::mutex mu_;
  std::map<Key, Entry> map_;
  std::list<Key> order_;   // most recently used first
};

}  // namespace minidl::cuda
