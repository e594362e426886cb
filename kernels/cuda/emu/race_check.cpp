// The cross-stream race check (race_check.h): not wired to the streams yet.
#include "kernels/cuda/emu/race_check.h"

namespace minidl::cuda::emu {

bool race_check_wants_accesses() { return false; }
void race_note(const void*, size_t, AccessKind) {}

}  // namespace minidl::cuda::emu
