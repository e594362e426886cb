// The host allocator (with its cache of large blocks, see allocator.h) and the device-independent
// memory front-ends. The budget check happens before the system allocation, so a budgeted run fails
// the same way on any machine.
#include "core/allocator.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <new>
#include <string>
#include <utility>

#include "core/backend.h"
#include "core/error.h"

namespace minidl {

MemoryStats StatsAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return s_;
}

void StatsAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  s_.peak_allocated_bytes = s_.allocated_bytes;
  s_.peak_reserved_bytes = s_.reserved_bytes;
}

void StatsAllocator::set_budget(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  s_.budget_bytes = static_cast<int64_t>(bytes);
}

CpuAllocator::CpuAllocator(Device device) : device_(device), backed_(!device.is_meta()) {
  const char* env = std::getenv("MINIDL_CPU_CACHE");
  cache_enabled_ = env == nullptr || std::string(env) != "0";
}

void CpuAllocator::evict_locked(const int64_t& used, int64_t block, int64_t limit) {
  while (!cache_.empty() && used + block > limit) {
    auto it = std::prev(cache_.end());
    const auto size = static_cast<int64_t>(it->first);
    raw_free(it->second);  // under the lock: no other allocation races the munmap
    cache_.erase(it);
    cached_bytes_ -= size;
    large_reserved_ -= size;
    s_.reserved_bytes -= size;
  }
}

void CpuAllocator::oom_locked(size_t nbytes, const char* why) {
  ++s_.num_ooms;
  const size_t in_use = static_cast<size_t>(s_.reserved_bytes), budget = static_cast<size_t>(s_.budget_bytes);
  if (why != nullptr) {
    throw OutOfMemoryError("out of memory on " + device_.str() + ": " + why + format_bytes(nbytes), nbytes, in_use, budget);
  }
  throw OutOfMemoryError("out of memory on " + device_.str() + ": tried to allocate " + format_bytes(nbytes) + " with " +
                             format_bytes(in_use) + " in use and a memory budget of " + format_bytes(budget) +
                             ". Use a smaller batch, gradient accumulation or recomputation, or raise the budget.",
                         nbytes, in_use, budget);
}

void* CpuAllocator::allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  const size_t block = rounded(nbytes);
  const auto b = static_cast<int64_t>(block);
  const bool cacheable = cache_enabled_ && block >= kCacheMinBytes;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (cacheable) {
      const auto range = cache_.equal_range(block);
      if (range.first != range.second) {
        const auto it = std::prev(range.second);  // the most recently freed block of this size
        void* p = it->second;
        cache_.erase(it);
        cached_bytes_ -= b;
        ++cache_hits_;
        s_.allocated_bytes += static_cast<int64_t>(nbytes);
        ++s_.num_allocs;
        s_.peak_allocated_bytes = std::max(s_.peak_allocated_bytes, s_.allocated_bytes);
        return p;
      }
      if (s_.budget_bytes == 0) {  // the smallest larger block within kFitRatio
        const auto up = cache_.upper_bound(block);
        if (up != cache_.end() && up->first <= kFitRatio * block) {
          const auto it = std::prev(cache_.upper_bound(up->first));  // the most recently freed of that size
          const size_t size = it->first;
          void* p = it->second;
          cache_.erase(it);
          cached_bytes_ -= static_cast<int64_t>(size);
          larger_.emplace(p, size);
          ++cache_hits_;
          high_water_ = std::max(high_water_, large_reserved_ - cached_bytes_);
          s_.allocated_bytes += static_cast<int64_t>(nbytes);
          ++s_.num_allocs;
          s_.peak_allocated_bytes = std::max(s_.peak_allocated_bytes, s_.allocated_bytes);
          return p;
        }
      }
    }
    // A large block that the cache cannot serve: cached blocks of other sizes make room under the
    // cache's limit. Then, for any block, under the budget.
    if (cacheable) evict_locked(large_reserved_, b, std::max(large_limit_locked(), b));
    if (s_.budget_bytes > 0) {
      evict_locked(s_.reserved_bytes, b, s_.budget_bytes);
      if (s_.reserved_bytes + b > s_.budget_bytes) oom_locked(nbytes, nullptr);
    }
    s_.reserved_bytes += b;
    if (cacheable) large_reserved_ += b;
    s_.allocated_bytes += static_cast<int64_t>(nbytes);
  }
  void* p = raw_alloc(block);
  if (p == nullptr) {  // the system is out of memory: give it the cache and try once more
    empty_cache();
    p = raw_alloc(block);
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (p == nullptr) {
    s_.reserved_bytes -= b;
    if (cacheable) large_reserved_ -= b;
    s_.allocated_bytes -= static_cast<int64_t>(nbytes);
    oom_locked(nbytes, "the system refused ");
  }
  ++s_.num_allocs;
  high_water_ = std::max(high_water_, large_reserved_ - cached_bytes_);
  s_.peak_reserved_bytes = std::max(s_.peak_reserved_bytes, s_.reserved_bytes);
  s_.peak_allocated_bytes = std::max(s_.peak_allocated_bytes, s_.allocated_bytes);
  return p;
}

void* CpuAllocator::raw_alloc(size_t block) {
  if (backed_) return std::aligned_alloc(kAlignment, block);
  return reinterpret_cast<void*>(next_address_.fetch_add(block));  // called inside and outside mu_
}

void CpuAllocator::raw_free(void* p) {
  if (backed_) std::free(p);
}

void CpuAllocator::deallocate(void* ptr, size_t nbytes) {
  if (ptr == nullptr) return;
  size_t block = rounded(nbytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!larger_.empty()) {
      const auto it = larger_.find(ptr);
      if (it != larger_.end()) {
        block = it->second;
        larger_.erase(it);
      }
    }
    s_.allocated_bytes -= static_cast<int64_t>(nbytes);
    ++s_.num_frees;
    if (cache_enabled_ && block >= kCacheMinBytes) {
      cache_.emplace(block, ptr);
      cached_bytes_ += static_cast<int64_t>(block);
      return;
    }
    s_.reserved_bytes -= static_cast<int64_t>(block);
  }
  raw_free(ptr);
}

void CpuAllocator::empty_cache() {
  std::vector<void*> blocks;
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [size, p] : cache_) blocks.push_back(p);
    s_.reserved_bytes -= cached_bytes_;
    large_reserved_ -= cached_bytes_;
    cached_bytes_ = 0;
    cache_.clear();
    high_water_ = large_reserved_;  // all live now
  }
  for (void* p : blocks) raw_free(p);
}

int64_t CpuAllocator::cached_bytes() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cached_bytes_;
}

size_t CpuAllocator::block_bytes(const void* p, size_t nbytes) const {
  std::lock_guard<std::mutex> lock(mu_);
  const auto it = larger_.find(p);
  return it != larger_.end() ? it->second : rounded(nbytes);
}

int64_t CpuAllocator::cache_hits() const {
  std::lock_guard<std::mutex> lock(mu_);
  return cache_hits_;
}

CpuAllocator& cpu_allocator() {
  static CpuAllocator* a = new CpuAllocator();  // never destroyed: tensors may outlive statics
  return *a;
}

Allocator& allocator_for(Device d) {
  if (d.is_cpu()) return cpu_allocator();
  return backend(d.type).allocator(d.index);
}

MemoryStats memory_stats(Device d) { return allocator_for(d).stats(); }
void reset_peak_stats(Device d) { allocator_for(d).reset_peak_stats(); }
void set_memory_budget(Device d, size_t bytes) { allocator_for(d).set_budget(bytes); }
thread_local bool TentativeRequests::active_ = false;

void empty_cache(Device d) { allocator_for(d).empty_cache(); }
int add_out_of_memory_handler(Device d, std::function<bool(size_t)> handler) {
  return allocator_for(d).add_out_of_memory_handler(std::move(handler));
}
void remove_out_of_memory_handler(Device d, int id) { allocator_for(d).remove_out_of_memory_handler(id); }
void draw_library_workspaces(Device d) {
  if (!d.is_cpu()) backend(d.type).draw_library_workspaces(d.index);
}
void set_expandable_segments(Device d, bool on) {
  Allocator& a = allocator_for(d);
  const bool released =
      !d.is_cpu() && a.expandable_segments() != on && backend(d.type).release_library_workspaces(d.index);
  bool ok = false;
  try {
    ok = a.set_expandable_segments(on);
  } catch (...) {
    if (released) draw_library_workspaces(d);
    throw;
  }
  if (released) draw_library_workspaces(d);
  MINIDL_CHECK(ok, "expandable segments: the allocator of ", d.str(),
               " cannot map memory page by page (the CPU's has no segments; a GPU's needs a driver with CUDA's "
               "virtual memory management, cuMemCreate and cuMemMap)");
}

size_t parse_bytes(const std::string& s) {
  size_t i = 0;
  while (i < s.size() && (std::isdigit(static_cast<unsigned char>(s[i])) || s[i] == '.')) ++i;
  MINIDL_CHECK(i > 0, "invalid memory size '", s, "': expected a number with an optional unit, e.g. 11GiB, 512MiB");
  const double value = std::stod(s.substr(0, i));
  std::string unit = s.substr(i);
  while (!unit.empty() && unit.front() == ' ') unit.erase(unit.begin());
  double mult = 0;
  if (unit.empty() || unit == "B") mult = 1;
  else if (unit == "KiB" || unit == "K") mult = 1024.0;
  else if (unit == "MiB" || unit == "M") mult = 1024.0 * 1024;
  else if (unit == "GiB" || unit == "G") mult = 1024.0 * 1024 * 1024;
  else if (unit == "KB") mult = 1e3;
  else if (unit == "MB") mult = 1e6;
  else if (unit == "GB") mult = 1e9;
  MINIDL_CHECK(mult > 0, "invalid memory unit '", unit, "' in '", s, "': use B, KiB, MiB, GiB, KB, MB or GB");
  return static_cast<size_t>(std::llround(value * mult));
}

}  // namespace minidl
