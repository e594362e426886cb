# Drives the find_package(minidl) check (cmake -P, from tests.cmake): install the build tree into
# a fresh prefix, configure and build consumer/ with CMAKE_PREFIX_PATH pointing there, run it.
# Each step stops the test with the failing command's output.
cmake_minimum_required(VERSION 3.25)
foreach(v MINIDL_BUILD_DIR WORK_DIR CONSUMER_DIR GENERATOR CXX_COMPILER)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "run_consumer.cmake: -D${v}=... is required")
  endif()
endforeach()
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
set(prefix ${WORK_DIR}/prefix)
set(build ${WORK_DIR}/build)
file(REMOVE_RECURSE ${prefix} ${build})

function(step name)
  message(STATUS "install check: ${name}: ${ARGN}")
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  message("${out}")
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "install check: ${name} failed (${rc})")
  endif()
endfunction()

# Only the library's component: the check must not depend on the programs being built.
step(install ${CMAKE_COMMAND} --install ${MINIDL_BUILD_DIR} --prefix ${prefix} --component minidl ${config_args})
step(configure ${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${build} -G ${GENERATOR} ${make_args}
     -DCMAKE_BUILD_TYPE=${build_type} -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_PREFIX_PATH=${prefix})
step(build ${CMAKE_COMMAND} --build ${build} --parallel 2 ${config_args})
find_program(exe minidl_consumer PATHS ${build} ${build}/${CONFIG} NO_DEFAULT_PATH REQUIRED)
step(run ${exe})
