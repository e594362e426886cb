// The running block's shared memory on the emulated device (shared_arena.cpp), owned by the kernel
// runner (runner.cpp): the launch's dynamic bytes at offset 0, then the static variables in the
// order threads first reach their declarations, and a per-byte "written" shadow cleared at each
// block's start. The checked views of cuda_emu/shared_memory.h read and write through it.
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace minidl::cuda::emu {

// The 48 KiB of shared memory a block may use without the opt-in attribute (static + dynamic), and
// the most it may opt in to on an H100 (cudaDevAttrMaxSharedMemoryPerBlockOptin: 227 KiB).
constexpr size_t kSharedLimit = 48 * 1024;
constexpr size_t kSharedOptInLimit = 227 * 1024;

class SharedArena {
 public:
  // `limit`: the block's static plus dynamic bytes (kSharedLimit, or kSharedOptInLimit for a kernel
  // whose dynamic limit cudaFuncSetAttribute raised).
  void start_launch(size_t dynamic_bytes, size_t limit);
  void start_block();   // 0xCD bytes, none marked written
  unsigned char* dynamic() { return bytes_.data(); }
  size_t dynamic_size() const { return dynamic_; }
  size_t static_bytes() const { return end_ - dynamic_; }   // placed so far, with alignment padding
  size_t offset_of(const void* p) const {
    return static_cast<size_t>(static_cast<const unsigned char*>(p) - bytes_.data());
  }
  // The arena bytes of the static variable declared at `site`, placed on first use.
  unsigned char* slot(const void* site, size_t bytes, const char* name);
  void read(const void* p, size_t n, const void* base, size_t bytes) const;
  void write(const void* p, size_t n, const void* base, size_t bytes);

 private:
  struct Slot {
    const void* site;
    size_t offset, bytes;
    const char* name;
  };
  std::string name_of(const unsigned char* base) const;
  void check_bounds(const char* access, const void* p, size_t n, const void* base, size_t bytes) const;
  std::vector<unsigned char> bytes_, written_;
  size_t dynamic_ = 0;
  size_t limit_ = kSharedLimit;
  size_t end_ = 0;   // end of the placed static variables (the high-water mark of the arena)
  std::vector<Slot> slots_;
};

// The running block's arena, and a fault of the running kernel (minidl::Error naming the kernel,
// the op, the block and the thread); both from runner.cpp.
SharedArena& running_arena(const char* what);
[[noreturn]] void running_kernel_fault(const std::string& what);

}  // namespace minidl::cuda::emu
