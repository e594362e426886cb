// The cross-stream race check of the emulated device (docs/cuda/emulator.md, "Sticky faults and cross-stream races"): every
// piece of stream work carries a vector clock (its stream's work so far, joined with what it was
// made to wait for: events, the legacy default stream's implicit barriers, the host's
// synchronizations) and the device bytes it read, wrote and updated atomically. Two pieces of work
// on different streams that touch the same bytes, one of them writing, with neither clock covering
// the other, race: whichever runs second throws minidl::Error naming both streams, both pieces of
// work and the allocation, which the stream executor turns into a device fault (streams.cpp).
// The clocks follow the program's order, not the emulator's: a race shows even when the deferred
// or immediate schedule happened to run the two in a safe order.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "core/non_copyable.h"
#include "cuda_emu/access_recorder.h"

namespace minidl::cuda::emu {

// On by default; MINIDL_EMU_RACE_CHECK=0 or set_race_check(false) turns it off.
void set_race_check(bool on);
bool race_check();

// True while a piece of stream work runs with the check on: its accesses are wanted.
bool race_check_wants_accesses();
// The running piece of work touches [p, p + n) of device memory.
void race_note(const void* p, size_t n, AccessKind kind);

// ---- streams.cpp and runtime.cpp (the stream and event calls)
struct Clock;
using ClockPtr = std::shared_ptr<const Clock>;
struct RaceOp;
using RaceOpPtr = std::shared_ptr<RaceOp>;

void race_register_stream(const void* s, bool blocking);
void race_forget_stream(const void* s);
// The next piece of work on `s` (`label` names it in reports); null when the check is off.
RaceOpPtr race_issue(const void* s, std::string label);
ClockPtr race_stream_clock(const void* s);                 // cudaEventRecord: the stream's work so far
void race_stream_waits(const void* s, const ClockPtr& c);  // cudaStreamWaitEvent
void race_host_waits(const ClockPtr& c);                   // cudaEventSynchronize
void race_host_waits_stream(const void* s);                // cudaStreamSynchronize and friends
void race_host_waits_all();                                // cudaDeviceSynchronize and friends
void race_drop_pending();                                  // a device fault: queued work never runs

// Runs one piece of work's accesses into `op`; finish() checks them (and throws on a race).
class RaceScope : NonCopyable {
 public:
  explicit RaceScope(RaceOpPtr op);
  ~RaceScope();
  void finish();

 private:
  RaceOpPtr op_;
};

}  // namespace minidl::cuda::emu
