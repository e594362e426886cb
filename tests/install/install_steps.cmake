# What run_consumer.cmake and run_embedding.cmake share: the check of their -D arguments
# (REQUIRED_ARGS), a fresh install prefix and build folder under WORK_DIR, the build
# configuration's arguments, and step(), which runs one command, prints its output, leaves it in
# step_output and stops the test with the command's name when it fails.
foreach(v IN LISTS REQUIRED_ARGS ITEMS MINIDL_BUILD_DIR WORK_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "${CMAKE_SCRIPT_MODE_FILE}: -D${v}=... is required")
  endif()
endforeach()
set(prefix ${WORK_DIR}/prefix)
set(build ${WORK_DIR}/build)
file(REMOVE_RECURSE ${prefix} ${build})

# CONFIG is $<CONFIG>: empty for a single-config build without a build type; --config must then
# be left out, or the install script would skip the library.
set(config_args "")
set(build_type Release)
if(CONFIG)
  set(config_args --config ${CONFIG})
  set(build_type ${CONFIG})
endif()
set(make_args "")
if(MAKE_PROGRAM)
  set(make_args -DCMAKE_MAKE_PROGRAM=${MAKE_PROGRAM})
endif()

function(step name)
  message(STATUS "${STEP_PREFIX}: ${name}: ${ARGN}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message("${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${STEP_PREFIX}: ${name} failed (${rc})")
  endif()
  set(step_output "${out}" PARENT_SCOPE)
endfunction()
