# The emulated device's own tests: small kernels with planted bugs (a divergent __syncthreads, a
# bad shuffle mask, a launch the hardware rejects, a race) that the emulator must report, and the
# warp collectives' exact semantics. Compiled like kernels/cuda/*.cu in minidl_emu (device_api.h
# force-included). Label cuda-emu. emu_prof: the counters of cuda_emu/profiler.h on planted kernels.
if(MINIDL_WITH_EMU)
  file(GLOB _emu_tests CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*_test.cpp)
  list(FILTER _emu_tests EXCLUDE REGEX "_prof_test\\.cpp$")
  add_executable(emu_device ${_emu_tests})
  set_source_files_properties(${_emu_tests} PROPERTIES COMPILE_OPTIONS "${MINIDL_EMU_KERNEL_OPTIONS}")
  target_link_libraries(emu_device PRIVATE minidl_emu GTest::gtest_main minidl_warnings)
  gtest_discover_tests(emu_device TEST_PREFIX "emu_device." PROPERTIES LABELS "cuda-emu" DISCOVERY_TIMEOUT 120)

  # The counters' planted kernels (*_prof_test.cpp), built like minidl_emu_prof's kernels and
  # linked against it: global loads and stores are instrumented there only.
  file(GLOB _emu_prof_tests CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*_prof_test.cpp)
  add_executable(emu_prof ${_emu_prof_tests})
  set_source_files_properties(${_emu_prof_tests} PROPERTIES COMPILE_OPTIONS "${MINIDL_EMU_PROF_KERNEL_OPTIONS}")
  target_link_libraries(emu_prof PRIVATE minidl_emu_prof GTest::gtest_main minidl_warnings)
  gtest_discover_tests(emu_prof TEST_PREFIX "emu_prof." PROPERTIES LABELS "cuda-emu" DISCOVERY_TIMEOUT 120)
endif()

# The race check of docs/cuda/emulator.md in every run: the kernel and optimizer suites again with the
# fibers between barriers in another (seeded) order; deterministic kernels must not notice. These
# runs also use the immediate stream mode (work runs when queued), the other valid stream schedule
# (every other cuda-emu test defers stream work to the synchronization points).
# The whole-network steps (the ResNet-18 graph step, the chained and bf16 ResNet steps, the dry run
# against the measured step, the autotuning budget: a handful of tests, most of the suites' CPU time)
# run once, in the first schedule; the per-op parity cases and the small CNN's graph steps, which
# run the same kernels, cover the second.
set(_whole_network "GraphStep.ResNet*:*ResNet*:MetaDeviceCuda.DryRunEqualsTheMeasuredStep*:ConvStatsParity.A*Step*:\
ConvStatsParity.ACheckpointed*:Parity.AutotuneWorkspaceStaysInsideTheBudget")
foreach(_suite kernels_cuda_emu optim_cuda_emu)
  if(TARGET ${_suite})
    add_test(NAME ${_suite}.second_schedule COMMAND ${_suite} --gtest_brief=1 --gtest_filter=-${_whole_network})
    set_tests_properties(${_suite}.second_schedule PROPERTIES ENVIRONMENT "MINIDL_EMU_SCHEDULE=7;MINIDL_EMU_DEFER_STREAMS=0"
                         LABELS "cuda-emu")
  endif()
endforeach()
