# Issue 30's fault matrix (tests/experiments/faults_test.sh): kill -9 in the middle of writing
# --save-weights and a sweep's results, a full disk, a read-only --out, SIGTERM. Each case runs the
# built programs in a fresh temporary folder; none needs privileges (they also pass as root).
foreach(_case save_weights_kill results_kill full_disk readonly_out sigterm)
  add_test(NAME experiments.faults.${_case}
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/faults_test.sh ${_case} $<TARGET_FILE_DIR:minidl-train>)
  set_tests_properties(experiments.faults.${_case} PROPERTIES LABELS "cpu" TIMEOUT 120)
endforeach()
