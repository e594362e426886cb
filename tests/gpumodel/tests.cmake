# The H100 step-time model's own tests (perfmodel): the occupancy calculator (against CUDA's
# calculator header when the toolkit is there), ptxas report parsing, the cost model and the
# extrapolation on synthetic steps (label cpu); and, on the emulated device with its counters, the
# extrapolation of a real small-CNN step to a held-out size (label cuda-emu).
if(TARGET minidl_gpumodel)   # MINIDL_BUILD_PERFMODEL
  set(_gpumodel_cpu_tests
    ${CMAKE_CURRENT_LIST_DIR}/occupancy_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kernel_resources_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cost_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/extrapolate_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/calibrate_test.cpp)
  minidl_add_test_exe(gpumodel "cpu" ${_gpumodel_cpu_tests})
  target_link_libraries(gpumodel PRIVATE minidl_gpumodel)
  target_compile_definitions(gpumodel PRIVATE MINIDL_KERNEL_RESOURCES_DIR="${MINIDL_KERNEL_RESOURCES_DIR}")
  if(MINIDL_WITH_CUDA AND EXISTS ${CUDAToolkit_INCLUDE_DIRS}/cuda_occupancy.h)
    target_include_directories(gpumodel SYSTEM PRIVATE ${CUDAToolkit_INCLUDE_DIRS})
    target_compile_definitions(gpumodel PRIVATE MINIDL_HAVE_CUDA_OCCUPANCY_H=1)
  endif()
  # On the emulated device with its counters (minidl_gpumodel_emu, defined in perfmodel).
  if(TARGET minidl_emu_prof)
    add_executable(gpumodel_emu ${CMAKE_CURRENT_LIST_DIR}/gpumodel_emu_test.cpp)
    target_link_libraries(gpumodel_emu PRIVATE minidl_gpumodel_emu GTest::gtest_main minidl_warnings)
    gtest_discover_tests(gpumodel_emu TEST_PREFIX "gpumodel_emu." PROPERTIES LABELS "cuda-emu" DISCOVERY_TIMEOUT 120)
  endif()
endif()
