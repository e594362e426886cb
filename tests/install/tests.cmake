# The find_package(minidl) check, as a user sees it: install this build tree into a scratch
# prefix, build the small consumer project in consumer/ against it and run it. Included by
# tests/CMakeLists.txt; one ctest test driven by run_consumer.cmake (no rebuild of minidl).
set(_minidl_install_work ${CMAKE_CURRENT_BINARY_DIR}/install_check)
add_test(NAME install.find_package
  COMMAND ${CMAKE_COMMAND}
    -DMINIDL_BUILD_DIR=${CMAKE_BINARY_DIR}
    -DWORK_DIR=${_minidl_install_work}
    -DCONSUMER_DIR=${CMAKE_CURRENT_LIST_DIR}/consumer
    -DCONFIG=$<CONFIG>
    -DGENERATOR=${CMAKE_GENERATOR}
    -DCXX_COMPILER=${CMAKE_CXX_COMPILER}
    -DMAKE_PROGRAM=${CMAKE_MAKE_PROGRAM}
    -P ${CMAKE_CURRENT_LIST_DIR}/run_consumer.cmake)
set_tests_properties(install.find_package PROPERTIES
  LABELS cpu
  TIMEOUT 300)
unset(_minidl_install_work)
