// Shared memory of the running block on the emulated device (shared_arena.h): placement of the
// static variables within the 48 KiB a block may use, and the checks behind every access of
// cuda_emu/shared_memory.h's views: inside the array, and (a read) of bytes this block wrote.
#include "cuda_emu/shared_arena.h"

#include <algorithm>
#include <sstream>

#include "cuda_emu/access_recorder.h"
#include "cuda_emu/shared_memory.h"

namespace minidl::cuda::emu {

void SharedArena::start_launch(size_t dynamic_bytes, size_t limit) {
  bytes_.assign(limit, 0);
  written_.assign(limit, 0);
  limit_ = limit;
  dynamic_ = dynamic_bytes;
  end_ = dynamic_bytes;
  slots_.clear();
}

void SharedArena::start_block() {
  std::fill_n(bytes_.begin(), end_, static_cast<unsigned char>(0xCD));
  std::fill_n(written_.begin(), end_, static_cast<unsigned char>(0));
}

unsigned char* SharedArena::slot(const void* site, size_t bytes, const char* name) {
  for (const Slot& s : slots_) {
    if (s.site == site) return bytes_.data() + s.offset;
  }
  const size_t offset = (end_ + 15) / 16 * 16;
  if (offset + bytes > limit_) {
    std::ostringstream os;
    os << (limit_ == kSharedLimit ? "static shared memory over the 48 KiB (49152 bytes) a block may use"
                                  : "static and dynamic shared memory over the 232448 bytes (227 KiB) an H100 block "
                                    "may opt in to")
       << ": `" << name << "` (" << bytes << " bytes) after the static";
    for (const Slot& s : slots_) os << " `" << s.name << "` (" << s.bytes << " bytes)";
    os << " and " << dynamic_ << " bytes of dynamic shared memory. Static alone over 48 KiB: ptxas rejects "
       << "the kernel ('uses too much shared data (0x... bytes, 0xc000 max)'); with the dynamic bytes: the launch "
       << "fails (cudaErrorInvalidValue)"
       << (limit_ == kSharedLimit ? " unless cudaFuncSetAttribute raised the kernel's limit" : "");
    running_kernel_fault(os.str());
  }
  slots_.push_back(Slot{site, offset, bytes, name});
  end_ = offset + bytes;
  return bytes_.data() + offset;
}

std::string SharedArena::name_of(const unsigned char* base) const {
  const auto off = static_cast<size_t>(base - bytes_.data());
  for (const Slot& s : slots_) {
    if (s.offset == off) return "`" + std::string(s.name) + "`";
  }
  return "dynamic shared memory";
}

void SharedArena::check_bounds(const char* access, const void* p, size_t n, const void* base, size_t bytes) const {
  const auto* pb = static_cast<const unsigned char*>(p);
  const auto* bb = static_cast<const unsigned char*>(base);
  if (pb < bb || pb + n > bb + bytes) {
    running_kernel_fault(std::string("shared memory ") + access + " out of bounds: " + std::to_string(n) +
                         " bytes at offset " + std::to_string(pb - bb) + " of " + name_of(bb) + " (" +
                         std::to_string(bytes) + " bytes)");
  }
}

void SharedArena::read(const void* p, size_t n, const void* base, size_t bytes) const {
  check_bounds("read", p, n, base, bytes);
  const auto* pb = static_cast<const unsigned char*>(p);
  const auto* bb = static_cast<const unsigned char*>(base);
  const auto at = static_cast<size_t>(pb - bytes_.data());
  for (size_t i = 0; i < n; ++i) {
    if (written_[at + i] != 0) continue;
    running_kernel_fault("shared memory read before any thread of the block wrote it: " + std::to_string(n) +
                         " bytes at offset " + std::to_string(pb - bb) + " of " + name_of(bb) + " (" +
                         std::to_string(bytes) + " bytes; byte " + std::to_string(pb - bb + static_cast<long>(i)) +
                         " was never written in this block)");
  }
}

void SharedArena::write(const void* p, size_t n, const void* base, size_t bytes) {
  check_bounds("write", p, n, base, bytes);
  const auto at = static_cast<size_t>(static_cast<const unsigned char*>(p) - bytes_.data());
  std::fill_n(written_.begin() + static_cast<std::ptrdiff_t>(at), n, static_cast<unsigned char>(1));
}

// ---- cuda_emu/shared_memory.h's entry points, on the running block's arena.

unsigned char* dynamic_shared_bytes() { return running_arena("dynamic_shared()").dynamic(); }
size_t dynamic_shared_size() { return running_arena("dynamic_shared()").dynamic_size(); }
unsigned char* shared_slot(const void* site, size_t bytes, const char* name) {
  return running_arena(name).slot(site, bytes, name);
}
// The address these return to is the access's instruction, for the counters (access_recorder.h).
void shared_read(const void* p, size_t n, const void* base, size_t bytes) {
  SharedArena& a = running_arena("a shared read");
  a.read(p, n, base, bytes);
  if (t_recorder != nullptr) record_shared(a.offset_of(p), n, AccessKind::Load, __builtin_return_address(0));
}
void shared_write(const void* p, size_t n, const void* base, size_t bytes) {
  SharedArena& a = running_arena("a shared write");
  a.write(p, n, base, bytes);
  if (t_recorder != nullptr) record_shared(a.offset_of(p), n, AccessKind::Store, __builtin_return_address(0));
}

}  // namespace minidl::cuda::emu
