# distributed/'s tests. One GoogleTest executable: the plain suite runs it as a world of one (label cpu),
# and, with MPI, ctest runs its collective, data-parallel and sampler cases again as 2 ranks under
# mpirun (labels cpu and mpi), plus the failing-rank probe. CI runs as root: mpirun needs
# --allow-run-as-root (and the OMPI_ALLOW_RUN_AS_ROOT* variables for older launchers).
# Every *_test.cpp of the folder, as the other suites take theirs (compare_weights.cpp and
# fail_probe.cpp are programs of their own).
file(GLOB _distributed_tests CONFIGURE_DEPENDS ${CMAKE_CURRENT_LIST_DIR}/*_test.cpp)
add_executable(distributed_test ${_distributed_tests})
target_link_libraries(distributed_test PRIVATE minidl_distributed minidl_test_support minidl_warnings)
gtest_discover_tests(distributed_test TEST_PREFIX "distributed." PROPERTIES LABELS "cpu" DISCOVERY_TIMEOUT 120)

if(MINIDL_WITH_MPI)
  set(_mpi_env
    OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
    # Containers often forbid the cross-memory-attach copy Open MPI's shared-memory path uses.
    OMPI_MCA_btl_vader_single_copy_mechanism=none
    # Two ranks share CI's few cores: a rank waiting in a collective yields instead of spinning,
    # and each rank computes on one thread (synchronised batch norm's many small collectives ran
    # 5x slower without these on a loaded 2-core machine).
    OMPI_MCA_mpi_yield_when_idle=1 OMP_NUM_THREADS=1)
  foreach(_suite DistCollectives DistDataParallel DistSampler DistSyncBatchNorm)
    add_test(NAME distributed.mpi2.${_suite}
      COMMAND ${MPIEXEC_EXECUTABLE} --oversubscribe --allow-run-as-root --bind-to none -np 2
              $<TARGET_FILE:distributed_test> --gtest_filter=${_suite}.*)
    set_tests_properties(distributed.mpi2.${_suite} PROPERTIES
      LABELS "cpu;mpi" TIMEOUT 120 PROCESSORS 2 ENVIRONMENT "${_mpi_env}")
  endforeach()

  add_executable(distributed_fail_probe ${CMAKE_CURRENT_LIST_DIR}/fail_probe.cpp)
  target_link_libraries(distributed_fail_probe PRIVATE minidl_distributed minidl_warnings)
  add_test(NAME distributed.mpi2.failing_rank_ends_the_job
    COMMAND ${CMAKE_COMMAND} -DMPIEXEC=${MPIEXEC_EXECUTABLE} -DPROBE=$<TARGET_FILE:distributed_fail_probe>
            -DNP=2 -DTIMEOUT=60 -P ${CMAKE_CURRENT_LIST_DIR}/run_fail_probe.cmake)
  set_tests_properties(distributed.mpi2.failing_rank_ends_the_job PROPERTIES
    LABELS "cpu;mpi" TIMEOUT 90 PROCESSORS 2 ENVIRONMENT "${_mpi_env}")

  # The experiment programs under mpirun (tests/distributed/programs_test.sh): parity with one process,
  # rank 0 alone writing, a failing and a killed rank ending the job, resume, maxbatch agreement,
  # a sweep's folder and columns.
  add_executable(distributed_compare_weights ${CMAKE_CURRENT_LIST_DIR}/compare_weights.cpp)
  target_link_libraries(distributed_compare_weights PRIVATE minidl minidl_warnings)
  foreach(_case parity rank0_output failing_rank killed_rank resume maxbatch agreed_stop sweep unreadable
                sweep_failing_run)
    add_test(NAME distributed.mpi2.programs.${_case}
      COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/programs_test.sh ${_case} ${MPIEXEC_EXECUTABLE}
              $<TARGET_FILE_DIR:minidl-train> $<TARGET_FILE:distributed_compare_weights>)
    set_tests_properties(distributed.mpi2.programs.${_case} PROPERTIES
      LABELS "cpu;mpi" TIMEOUT 120 PROCESSORS 2 ENVIRONMENT "${_mpi_env}")
  endforeach()
  unset(_mpi_env)
endif()
