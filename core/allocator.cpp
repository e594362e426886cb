// The host allocator and the device-independent memory front-ends. The budget check happens
// before the system allocation, so a budgeted run fails the same way on any machine.
#include "core/allocator.h"

#include <cctype>
#include <cmath>
#include <cstdlib>
#include <new>
#include <string>

#include "core/backend.h"
#include "core/error.h"

namespace minidl {

void* CpuAllocator::allocate(size_t nbytes) {
  if (nbytes == 0) return nullptr;
  const size_t block = rounded(nbytes);
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (s_.budget_bytes > 0 && s_.reserved_bytes + static_cast<int64_t>(block) > s_.budget_bytes) {
      ++s_.num_ooms;
      const size_t in_use = static_cast<size_t>(s_.reserved_bytes), budget = static_cast<size_t>(s_.budget_bytes);
      throw OutOfMemoryError("out of memory on " + device_.str() + ": tried to allocate " + format_bytes(nbytes) + " with " +
                                 format_bytes(in_use) + " in use and a memory budget of " + format_bytes(budget) +
                                 ". Use a smaller batch, gradient accumulation or recomputation, or raise the budget.",
                             nbytes, in_use, budget);
    }
    s_.reserved_bytes += static_cast<int64_t>(block);
    s_.allocated_bytes += static_cast<int64_t>(nbytes);
  }
  void* p = raw_alloc(block);
  std::lock_guard<std::mutex> lock(mu_);
  if (p == nullptr) {
    s_.reserved_bytes -= static_cast<int64_t>(block);
    s_.allocated_bytes -= static_cast<int64_t>(nbytes);
    ++s_.num_ooms;
    throw OutOfMemoryError("out of memory on " + device_.str() + ": the system refused " + format_bytes(nbytes), nbytes,
                           static_cast<size_t>(s_.reserved_bytes), static_cast<size_t>(s_.budget_bytes));
  }
  ++s_.num_allocs;
  s_.peak_reserved_bytes = std::max(s_.peak_reserved_bytes, s_.reserved_bytes);
  s_.peak_allocated_bytes = std::max(s_.peak_allocated_bytes, s_.allocated_bytes);
  return p;
}

void* CpuAllocator::raw_alloc(size_t block) {
  if (backed_) return std::aligned_alloc(kAlignment, block);
  std::lock_guard<std::mutex> lock(mu_);
  void* p = reinterpret_cast<void*>(next_address_);
  next_address_ += block;
  return p;
}

void CpuAllocator::raw_free(void* p) {
  if (backed_) std::free(p);
}

void CpuAllocator::deallocate(void* ptr, size_t nbytes) {
  if (ptr == nullptr) return;
  raw_free(ptr);
  std::lock_guard<std::mutex> lock(mu_);
  s_.reserved_bytes -= static_cast<int64_t>(rounded(nbytes));
  s_.allocated_bytes -= static_cast<int64_t>(nbytes);
  ++s_.num_frees;
}

MemoryStats CpuAllocator::stats() const {
  std::lock_guard<std::mutex> lock(mu_);
  return s_;
}

void CpuAllocator::reset_peak_stats() {
  std::lock_guard<std::mutex> lock(mu_);
  s_.peak_allocated_bytes = s_.allocated_bytes;
  s_.peak_reserved_bytes = s_.reserved_bytes;
}

void CpuAllocator::set_budget(size_t bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  s_.budget_bytes = static_cast<int64_t>(bytes);
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
void empty_cache(Device d) { allocator_for(d).empty_cache(); }

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
