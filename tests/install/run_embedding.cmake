# Drives install.embedding (cmake -P, from tests.cmake): docs/embedding.md's program as a user
# builds it. Installs this build tree's library component into a fresh prefix (no rebuild of
# minidl), builds embedding/ against it with find_package, runs it on an image folder, and checks
# that the CPU-only program links no CUDA or MPI library (ldd) and that the program printed in
# docs/embedding.md is this one, word for word.
cmake_minimum_required(VERSION 3.25)
set(REQUIRED_ARGS EXAMPLE_DIR DOC FOLDER)
set(STEP_PREFIX "embedding check")
include(${CMAKE_CURRENT_LIST_DIR}/install_steps.cmake)
set(run ${WORK_DIR}/run)
file(REMOVE_RECURSE ${run})
file(MAKE_DIRECTORY ${run})

# The documentation shows the program that is tested.
file(READ ${EXAMPLE_DIR}/train_folder.cpp program)
file(READ ${DOC} doc)
string(FIND "${doc}" "${program}" at)
if(at EQUAL -1)
  message(FATAL_ERROR "embedding check: docs/embedding.md does not hold tests/install/embedding/train_folder.cpp "
                      "verbatim: copy the file into its code block")
endif()
if(NOT IS_DIRECTORY ${FOLDER})
  message(FATAL_ERROR "embedding check: no image folder at ${FOLDER} (the repository expects ../shared/data beside it)")
endif()

step(install ${CMAKE_COMMAND} --install ${MINIDL_BUILD_DIR} --prefix ${prefix} --component minidl ${config_args})
step(configure ${CMAKE_COMMAND} -S ${EXAMPLE_DIR} -B ${build} -G ${GENERATOR} ${make_args}
     -DCMAKE_BUILD_TYPE=${build_type} -DCMAKE_CXX_COMPILER=${CXX_COMPILER} -DCMAKE_PREFIX_PATH=${prefix})
# A CPU-only consumer's configure must not look for CUDA or MPI at all.
if(step_output MATCHES "CUDAToolkit|Found MPI|cuDNN|NCCL")
  message(FATAL_ERROR "embedding check: the CPU-only configure looked for CUDA or MPI")
endif()
step(build ${CMAKE_COMMAND} --build ${build} --parallel 2 ${config_args})
find_program(exe train_folder PATHS ${build} ${build}/${CONFIG} NO_DEFAULT_PATH REQUIRED)
step(run ${exe} ${FOLDER} ${run})
if(NOT step_output MATCHES "embedding example: OK")
  message(FATAL_ERROR "embedding check: the program did not print its OK line")
endif()
step(ldd ldd ${exe})
if(step_output MATCHES "(libcudart|libcublas|libcudnn|libnccl|libmpi)[^ ]*")
  message(FATAL_ERROR "embedding check: the CPU-only program links ${CMAKE_MATCH_0}")
endif()
