# Drives the find_package(minidl) check (cmake -P, from tests.cmake): install the build tree into
# a fresh prefix, configure and build consumer/ with CMAKE_PREFIX_PATH pointing there, run it.
# Each step stops the test with the failing command's output.
cmake_minimum_required(VERSION 3.25)
set(REQUIRED_ARGS CONSUMER_DIR)
set(STEP_PREFIX "install check")
include(${CMAKE_CURRENT_LIST_DIR}/install_steps.cmake)

# Only the library's component: the check must not depend on the programs being built.
step(install ${CMAKE_COMMAND} --install ${MINIDL_BUILD_DIR} --prefix ${prefix} --component minidl ${config_args})
step(configure ${CMAKE_COMMAND} -S ${CONSUMER_DIR} -B ${build} -G ${GENERATOR} ${make_args}
     -DCMAKE_BUILD_TYPE=${build_type} -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_PREFIX_PATH=${prefix})
step(build ${CMAKE_COMMAND} --build ${build} --parallel 2 ${config_args})
find_program(exe minidl_consumer PATHS ${build} ${build}/${CONFIG} NO_DEFAULT_PATH REQUIRED)
step(run ${exe})
