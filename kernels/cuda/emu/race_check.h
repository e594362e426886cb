// The cross-stream race check of the emulated device: what the counters' recorder hands it.
#pragma once
#include <cstddef>

#include "kernels/cuda/emu/access_recorder.h"

namespace minidl::cuda::emu {

// True while a piece of stream work runs with the check on: its accesses are wanted.
bool race_check_wants_accesses();
// The running piece of work touches [p, p + n) of device memory.
void race_note(const void* p, size_t n, AccessKind kind);

}  // namespace minidl::cuda::emu
