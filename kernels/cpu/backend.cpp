// The CPU backend singleton and its allocator (the host allocator from core/).
#include "core/allocator.h"
#include "kernels/cpu/cpu_backend.h"

namespace minidl::cpu {

Allocator& CpuBackend::allocator(int /*device_index*/) { return cpu_allocator(); }

CpuBackend& cpu_backend() {
  static CpuBackend* b = new CpuBackend();  // never destroyed: used by static tensors at exit
  return *b;
}

}  // namespace minidl::cpu
