// Every byte of tensor memory goes through an Allocator, so the statistics below are exact and a
// memory budget can make any machine behave like a smaller one (the maximum-batch experiments
// rely on this). Names follow PyTorch's torch.cuda.memory_stats().
#pragma once
#include <cstddef>
#include <cstdint>
#include <mutex>

#include "core/device.h"

namespace minidl {

struct MemoryStats {
  int64_t allocated_bytes = 0;        // bytes held by live tensors (as requested)
  int64_t peak_allocated_bytes = 0;
  int64_t reserved_bytes = 0;         // bytes obtained from the system (rounded blocks + cache)
  int64_t peak_reserved_bytes = 0;
  int64_t num_allocs = 0;             // successful allocations since start
  int64_t num_frees = 0;
  int64_t num_ooms = 0;               // OutOfMemoryError thrown
  int64_t budget_bytes = 0;           // 0: no budget
};

class Allocator {
 public:
  virtual ~Allocator() = default;
  // Throws OutOfMemoryError when the request would push reserved bytes past the budget.
  virtual void* allocate(size_t nbytes) = 0;
  virtual void deallocate(void* ptr, size_t nbytes) = 0;
  virtual MemoryStats stats() const = 0;
  virtual void reset_peak_stats() = 0;
  virtual void set_budget(size_t bytes) = 0;   // 0 removes the budget
  virtual void empty_cache() {}
  virtual Device device() const = 0;
};

// The host allocator: 64-byte aligned blocks, no cache (reserved = sum of rounded block sizes).
// Built for the meta device (Device::meta(CPU)) it keeps the same books, budget and errors but
// hands out address ranges with no memory behind them: the dry run's allocator is this class,
// not a copy of its rules.
class CpuAllocator final : public Allocator {
 public:
  static constexpr size_t kAlignment = 64;
  explicit CpuAllocator(Device device = Device::cpu()) : device_(device), backed_(!device.is_meta()) {}
  void* allocate(size_t nbytes) override;
  void deallocate(void* ptr, size_t nbytes) override;
  MemoryStats stats() const override;
  void reset_peak_stats() override;
  void set_budget(size_t bytes) override;
  Device device() const override { return device_; }
  static size_t rounded(size_t nbytes) { return (nbytes + kAlignment - 1) / kAlignment * kAlignment; }

 private:
  // The system side: aligned_alloc/free, or for the meta device an address range (never reused,
  // never mapped, so a kernel that reads meta memory faults at once).
  void* raw_alloc(size_t block);
  void raw_free(void* p);

  Device device_;
  bool backed_ = true;
  mutable std::mutex mu_;
  MemoryStats s_;
  uintptr_t next_address_ = uintptr_t{1} << 44;
};

CpuAllocator& cpu_allocator();
// The allocator of a device; for CUDA it comes from the CUDA backend (throws without one).
Allocator& allocator_for(Device d);

// Convenience front-ends used by the experiments and tests.
MemoryStats memory_stats(Device d = Device::cpu());
void reset_peak_stats(Device d = Device::cpu());
void set_memory_budget(Device d, size_t bytes);
void empty_cache(Device d = Device::cpu());
// Parses "11GiB", "512MiB", "1.5GB", "1000000" (bytes); throws on anything else.
size_t parse_bytes(const std::string& s);

}  // namespace minidl
