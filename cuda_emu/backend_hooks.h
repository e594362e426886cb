// What the backend's emulated-build branches call (#ifdef MINIDL_CUDA_EMU in
// kernels/cuda/device/launch.cuh, device/shared.cuh and context.cu): the grid runner, the call log,
// the runtime's device-memory marking and the checked shared memory. emu.cmake force-includes this
// header after device_api.h when it compiles the backend's .cu files, so the backend's sources name
// no file of the emulator: the emulator builds the backend, never the other way round.
#pragma once

#include "cuda_emu/call_log.h"
#include "cuda_emu/runner.h"
#include "cuda_emu/runtime_state.h"
#include "cuda_emu/shared_memory.h"
