// The calls GCC's -fsanitize=thread puts at every load and store of the profiling build of the
// kernels (minidl_emu_prof), defined here instead of by the ThreadSanitizer runtime, which is never
// linked: each reports the access, with the instruction's address, to access_recorder.h. Atomics
// and the rest of the runtime's ABI just do what they name (the kernels' own atomics are
// device_api.h's, which are not instrumented and report themselves).
#include <cstddef>
#include <cstdint>

#include "cuda_emu/access_recorder.h"

namespace minidl::cuda::emu {
namespace {
[[maybe_unused]] const bool g_marked = (mark_global_accesses_instrumented(), true);
}  // namespace
}  // namespace minidl::cuda::emu

namespace emu = minidl::cuda::emu;

#define MINIDL_PC __builtin_return_address(0)

extern "C" {

void __tsan_init() {}
void __tsan_func_entry(void*) {}
void __tsan_func_exit() {}
void __tsan_vptr_update(void**, void*) {}
void __tsan_vptr_read(void**) {}

#define MINIDL_TSAN_ACCESS(n)                                                                            \
  void __tsan_read##n(void* p) { emu::record_global(p, n, emu::AccessKind::Load, MINIDL_PC); }           \
  void __tsan_write##n(void* p) { emu::record_global(p, n, emu::AccessKind::Store, MINIDL_PC); }         \
  void __tsan_unaligned_read##n(void* p) { emu::record_global(p, n, emu::AccessKind::Load, MINIDL_PC); } \
  void __tsan_unaligned_write##n(void* p) { emu::record_global(p, n, emu::AccessKind::Store, MINIDL_PC); } \
  void __tsan_volatile_read##n(void* p) { emu::record_global(p, n, emu::AccessKind::Load, MINIDL_PC); }   \
  void __tsan_volatile_write##n(void* p) { emu::record_global(p, n, emu::AccessKind::Store, MINIDL_PC); }
MINIDL_TSAN_ACCESS(1)
MINIDL_TSAN_ACCESS(2)
MINIDL_TSAN_ACCESS(4)
MINIDL_TSAN_ACCESS(8)
MINIDL_TSAN_ACCESS(16)
#undef MINIDL_TSAN_ACCESS

// Aggregate copies (a 16-byte Vec, a float4 built from a struct) arrive as ranges.
void __tsan_read_range(void* p, unsigned long n) { emu::record_global(p, n, emu::AccessKind::Load, MINIDL_PC); }
void __tsan_write_range(void* p, unsigned long n) { emu::record_global(p, n, emu::AccessKind::Store, MINIDL_PC); }

// ---- atomics (morder is ignored: every operation is sequentially consistent, which is stronger)

void __tsan_atomic_thread_fence(int) { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
void __tsan_atomic_signal_fence(int) { __atomic_signal_fence(__ATOMIC_SEQ_CST); }

#define MINIDL_TSAN_RMW(bits, T, op)                                             \
  T __tsan_atomic##bits##_##op(volatile T* a, T v, int) {                      \
    return __atomic_##op(a, v, __ATOMIC_SEQ_CST);                              \
  }
#define MINIDL_TSAN_ATOMICS(bits, T)                                                                       \
  T __tsan_atomic##bits##_load(const volatile T* a, int) { return __atomic_load_n(a, __ATOMIC_SEQ_CST); } \
  void __tsan_atomic##bits##_store(volatile T* a, T v, int) { __atomic_store_n(a, v, __ATOMIC_SEQ_CST); } \
  T __tsan_atomic##bits##_exchange(volatile T* a, T v, int) { return __atomic_exchange_n(a, v, __ATOMIC_SEQ_CST); } \
  MINIDL_TSAN_RMW(bits, T, fetch_add)                                                                      \
  MINIDL_TSAN_RMW(bits, T, fetch_sub)                                                                      \
  MINIDL_TSAN_RMW(bits, T, fetch_and)                                                                      \
  MINIDL_TSAN_RMW(bits, T, fetch_or)                                                                       \
  MINIDL_TSAN_RMW(bits, T, fetch_xor)                                                                      \
  MINIDL_TSAN_RMW(bits, T, fetch_nand)                                                                     \
  int __tsan_atomic##bits##_compare_exchange_strong(volatile T* a, T* c, T v, int, int) {                  \
    return __atomic_compare_exchange_n(a, c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                \
  }                                                                                                        \
  int __tsan_atomic##bits##_compare_exchange_weak(volatile T* a, T* c, T v, int, int) {                    \
    return __atomic_compare_exchange_n(a, c, v, true, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                 \
  }                                                                                                        \
  T __tsan_atomic##bits##_compare_exchange_val(volatile T* a, T c, T v, int, int) {                        \
    __atomic_compare_exchange_n(a, &c, v, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST);                      \
    return c;                                                                                              \
  }
MINIDL_TSAN_ATOMICS(8, uint8_t)
MINIDL_TSAN_ATOMICS(16, uint16_t)
MINIDL_TSAN_ATOMICS(32, uint32_t)
MINIDL_TSAN_ATOMICS(64, uint64_t)
#undef MINIDL_TSAN_ATOMICS
#undef MINIDL_TSAN_RMW

}  // extern "C"
