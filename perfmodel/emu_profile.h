// A step's work as the emulated device saw it (emulated builds only): the profiler's counters of
// every kernel launch (cuda_emu/profiler.h) merged in stream order with the cuDNN, cuBLAS
// and runtime calls of the call log (cuda_emu/call_log.h).
#pragma once
#include <cstdint>
#include <functional>

#include "perfmodel/step.h"

namespace minidl::gpumodel {

// Runs `fn` with the counters and the call log on (after the device's queued work is done) and
// returns what it ran, labelled (batch, image).
StepProfile profile_on_emulator(const std::function<void()>& fn, int64_t batch, int64_t image);

}  // namespace minidl::gpumodel
