# The cuBLAS / cuDNN stand-ins' own tests: host code only, no minidl and no GPU, so they run in
# every build that has the CUDA headers. Labelled cpu (the default CI run) and cuda-emu-libs.
if(TARGET minidl_emu_libs)
  file(GLOB _emu_libs_tests CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*.cpp)
  add_executable(emu_libs ${_emu_libs_tests})
  target_link_libraries(emu_libs PRIVATE minidl_emu_libs GTest::gtest_main minidl_warnings)
  gtest_discover_tests(emu_libs TEST_PREFIX "emu_libs." DISCOVERY_TIMEOUT 120)
  # gtest_discover_tests (CMake 3.25) writes a list-valued LABELS unquoted, so only its first
  # element survives; set both labels on the discovered tests from a file ctest reads after them.
  file(WRITE ${CMAKE_CURRENT_BINARY_DIR}/emu_libs_labels.cmake
       "set_tests_properties(\${emu_libs_TESTS} PROPERTIES LABELS \"cpu;cuda-emu-libs\")\n")
  set_property(DIRECTORY APPEND PROPERTY TEST_INCLUDE_FILES ${CMAKE_CURRENT_BINARY_DIR}/emu_libs_labels.cmake)
endif()

# With the real CUDA build: every cuBLAS / cuDNN symbol libminidl_cuda needs is one the stand-ins define.
if(TARGET minidl_emu_libs AND MINIDL_WITH_CUDA)
  add_test(NAME emu_libs.CoversEveryBackendCall
           COMMAND ${CMAKE_COMMAND} -DNM=${CMAKE_NM} -DBACKEND=$<TARGET_FILE:minidl_cuda>
                   -DEMU=$<TARGET_FILE:minidl_emu_libs> -P ${CMAKE_CURRENT_LIST_DIR}/check_symbols.cmake)
  set_tests_properties(emu_libs.CoversEveryBackendCall PROPERTIES LABELS "cpu;cuda-emu-libs")
endif()
