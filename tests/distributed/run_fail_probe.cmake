# ctest driver for fail_probe: the job must end within TIMEOUT seconds (a hang fails the test),
# exit non-zero, and print "minidl: rank <last> of <N> failed:" with the cause.
# Inputs: MPIEXEC, PROBE, NP, TIMEOUT.
string(TIMESTAMP t0 "%s")
execute_process(
  COMMAND ${MPIEXEC} --oversubscribe --allow-run-as-root --bind-to none -np ${NP} ${PROBE}
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT ${TIMEOUT})
string(TIMESTAMP t1 "%s")
math(EXPR elapsed "${t1} - ${t0}")
message(STATUS "fail_probe: status '${rc}' after ${elapsed} s\nstdout:\n${out}\nstderr:\n${err}")
if(rc MATCHES "timeout|Process terminated")
  message(FATAL_ERROR "fail_probe: the job did not end within ${TIMEOUT} s (a hang)")
endif()
if(rc EQUAL 0)
  message(FATAL_ERROR "fail_probe: the job exited 0 although a rank failed")
endif()
math(EXPR last "${NP} - 1")
string(FIND "${err}" "minidl: rank ${last} of ${NP} failed:" at)
string(FIND "${err}" "cannot open the data folder /nonexistent/catsdogs" cause)
if(at EQUAL -1 OR cause EQUAL -1)
  message(FATAL_ERROR "fail_probe: stderr does not name rank ${last} and the cause")
endif()
string(FIND "${out}" "unreachable" reached)
if(NOT reached EQUAL -1)
  message(FATAL_ERROR "fail_probe: a rank went past the failed collective")
endif()
