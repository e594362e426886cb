// The autocast state, the front-ends' cast helpers and the per-step cache of low-precision weight
// copies.
// The cache is process-wide (one optimizer step invalidates it for every thread) and guarded by a
// mutex; the enable flag is thread-local like grad mode.
#include "core/autocast.h"

#include <mutex>
#include <unordered_map>

#include "core/autograd.h"

namespace minidl {
namespace {

thread_local bool g_enabled = false;
thread_local DType g_dtype = DType::f16;

struct CacheEntry {
  std::weak_ptr<TensorImpl> master;   // the entry is stale once the master is gone or replaced
  const Storage* storage = nullptr;
  Tensor low;                         // detached low-precision copy
};

struct Cache {
  std::mutex mu;
  std::unordered_map<const TensorImpl*, CacheEntry> entries;
  AutocastCacheStats stats;
};

Cache& cache() {
  static Cache* c = new Cache();  // never destroyed: tensors may be released during static teardown
  return *c;
}

// The low copy of master, made at most once per cache generation.
Tensor cached_low(const Tensor& master, DType low) {
  Cache& c = cache();
  const TensorImpl* key = master.impl_ptr().get();
  {
    std::lock_guard<std::mutex> lock(c.mu);
    auto it = c.entries.find(key);
    if (it != c.entries.end() && it->second.master.lock() == master.impl_ptr() &&
        it->second.storage == master.storage().get() && it->second.low.dtype() == low) {
      ++c.stats.hits;
      return it->second.low;
    }
  }
  Tensor copy;
  {
    NoGradGuard no_grad;
    copy = master.detach().to(low);
  }
  std::lock_guard<std::mutex> lock(c.mu);
  auto& e = c.entries[key];
  if (e.low.defined()) c.stats.bytes -= static_cast<int64_t>(e.low.nbytes());
  e = CacheEntry{master.impl_ptr(), master.storage().get(), copy};
  ++c.stats.misses;
  c.stats.bytes += static_cast<int64_t>(copy.nbytes());
  c.stats.entries = static_cast<int64_t>(c.entries.size());
  return copy;
}

}  // namespace

bool autocast_enabled() { return g_enabled; }
DType autocast_dtype() { return g_dtype; }

AutocastGuard::AutocastGuard(DType dtype, bool enabled) : prev_enabled_(g_enabled), prev_dtype_(g_dtype) {
  MINIDL_CHECK(is_float16(dtype), "AutocastGuard: the low-precision dtype must be f16 or bf16, got ",
               dtype_name(dtype));
  g_enabled = enabled;
  if (enabled) g_dtype = dtype;
}

AutocastGuard::~AutocastGuard() {
  g_enabled = prev_enabled_;
  g_dtype = prev_dtype_;
}

Tensor autocast_to_low(const Tensor& t) {
  if (!g_enabled || !t.defined() || t.dtype() != DType::f32) return t;
  const DType low = g_dtype;
  if (!(t.is_leaf() && t.requires_grad() && grad_enabled())) return t.to(low);
  // A fresh handle over the cached bytes per use: its node is released with this use's graph.
  Tensor out = cached_low(t, low).detach();
  record("autocast_to_f16", {t}, {out}, [from = t.dtype()](const std::vector<Tensor>& g) {
    return std::vector<Tensor>{g[0].defined() ? g[0].to(from) : Tensor()};
  });
  return out;
}

Tensor autocast_to_f32(const Tensor& t) {
  if (!g_enabled || !t.defined() || !is_float16(t.dtype())) return t;
  return t.to(DType::f32);
}

void autocast_promote(Tensor& a, Tensor& b) {
  if (!g_enabled || !a.defined() || !b.defined() || a.dtype() == b.dtype()) return;
  if (!is_floating(a.dtype()) || !is_floating(b.dtype())) return;
  const DType wide = dtype_size(a.dtype()) >= dtype_size(b.dtype()) ? a.dtype() : b.dtype();
  a = a.to(wide);
  b = b.to(wide);
}

void autocast_clear_cache() {
  Cache& c = cache();
  std::unordered_map<const TensorImpl*, CacheEntry> old;
  {
    std::lock_guard<std::mutex> lock(c.mu);
    old.swap(c.entries);
    c.stats.entries = 0;
    c.stats.bytes = 0;
  }
  // `old` frees the copies here, outside the lock.
}

AutocastCacheStats autocast_cache_stats() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  return c.stats;
}

void reset_autocast_cache_stats() {
  Cache& c = cache();
  std::lock_guard<std::mutex> lock(c.mu);
  c.stats.hits = 0;
  c.stats.misses = 0;
}

}  // namespace minidl
