# The package checks, as a user sees them: install this build tree's library component into a
# scratch prefix (no rebuild of minidl), build a small project against it with find_package and run
# it. Included by tests/CMakeLists.txt; each is one ctest test driven by a cmake -P script.
function(minidl_install_test name script)
  add_test(NAME ${name}
    COMMAND ${CMAKE_COMMAND}
      -DMINIDL_BUILD_DIR=${CMAKE_BINARY_DIR}
      -DCONFIG=$<CONFIG>
      -DGENERATOR=${CMAKE_GENERATOR}
      -DCXX_COMPILER=${CMAKE_CXX_COMPILER}
      -DMAKE_PROGRAM=${CMAKE_MAKE_PROGRAM}
      ${ARGN}
      -P ${CMAKE_CURRENT_FUNCTION_LIST_DIR}/${script})
  set_tests_properties(${name} PROPERTIES LABELS "cpu;install" TIMEOUT 300)
endfunction()

# consumer/: the smallest program, every installed header compiled on its own, and the
# distributed component (run_consumer.cmake).
minidl_install_test(install.find_package run_consumer.cmake
  -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/install_check
  -DCONSUMER_DIR=${CMAKE_CURRENT_LIST_DIR}/consumer)

# docs/embedding.md's program (run_embedding.cmake): a model, the loader on ../shared/data/catsdogs,
# SGD with a schedule, AMP on the CPU, a checkpoint resumed, memory statistics; ldd must list no
# CUDA or MPI library.
minidl_install_test(install.embedding run_embedding.cmake
  -DWORK_DIR=${CMAKE_CURRENT_BINARY_DIR}/embedding_check
  -DEXAMPLE_DIR=${CMAKE_CURRENT_LIST_DIR}/embedding
  -DDOC=${PROJECT_SOURCE_DIR}/docs/embedding.md
  -DFOLDER=${PROJECT_SOURCE_DIR}/../shared/data/catsdogs)
