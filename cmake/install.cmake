# Install and export rules, so a user's CMake project can `find_package(minidl [COMPONENTS cuda
# distributed])` and link minidl::core (+ minidl::cuda, minidl::distributed): the libraries, the
# public headers as <minidl/...>, the exported targets and a package config (docs/embedding.md).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)
# Never installed: the emulated CUDA device (cuda_emu/, a test platform: minidl_emu, minidl_emu_prof,
# minidl_emu_libs) and the step-time model (perfmodel/): no target of theirs is named here.

set(MINIDL_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/minidl CACHE STRING
    "Where the minidl package config goes, relative to the install prefix")
mark_as_advanced(MINIDL_INSTALL_CMAKEDIR)

# Everything here is in the install component `minidl`, so `cmake --install build --component
# minidl` (what tests/install does) needs only the libraries built, not the programs. One export
# set per package component, so a CPU-only consumer loads (and links) neither CUDA nor MPI:
#   minidl::core (always), minidl::cuda (COMPONENTS cuda), minidl::distributed (COMPONENTS distributed),
#   minidl::train (COMPONENTS train: the trainer library, which needs neither CUDA nor MPI).
install(TARGETS minidl_core EXPORT minidlCoreTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT minidl
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT minidl
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT minidl)
install(EXPORT minidlCoreTargets NAMESPACE minidl:: DESTINATION ${MINIDL_INSTALL_CMAKEDIR} COMPONENT minidl)
if(MINIDL_WITH_CUDA)
  install(TARGETS minidl_cuda EXPORT minidlCudaTargets
    ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT minidl
    LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT minidl)
  install(EXPORT minidlCudaTargets NAMESPACE minidl:: DESTINATION ${MINIDL_INSTALL_CMAKEDIR} COMPONENT minidl)
endif()
# distributed/'s archive is its own set: both minidl::distributed (with MPI and NCCL) and
# minidl::train (a world of one, neither library) link it.
install(TARGETS minidl_distributed_base EXPORT minidlDistributedBaseTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT minidl)
install(EXPORT minidlDistributedBaseTargets NAMESPACE minidl:: DESTINATION ${MINIDL_INSTALL_CMAKEDIR} COMPONENT minidl)
install(TARGETS minidl_distributed EXPORT minidlDistributedTargets)
install(EXPORT minidlDistributedTargets NAMESPACE minidl:: DESTINATION ${MINIDL_INSTALL_CMAKEDIR} COMPONENT minidl)
install(TARGETS minidl_train EXPORT minidlTrainTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT minidl)
install(EXPORT minidlTrainTargets NAMESPACE minidl:: DESTINATION ${MINIDL_INSTALL_CMAKEDIR} COMPONENT minidl)

# Public headers: the prefixed copies of cmake/public_headers.cmake, as include/minidl/<layer>/...
# and include/minidl/minidl.h. kernels/cuda is internal.
install(DIRECTORY ${MINIDL_PUBLIC_INCLUDE_DIR}/minidl
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR} COMPONENT minidl)

# minidl is a static library, so its PRIVATE dependencies are in the exported link interface
# ($<LINK_ONLY:...>): the config recreates them. These values, recorded now, tell it how.
set(MINIDL_CONFIG_WITH_CUDA ${MINIDL_WITH_CUDA})
set(MINIDL_CONFIG_WITH_MPI ${MINIDL_WITH_MPI})
set(MINIDL_CONFIG_WITH_NCCL ${MINIDL_WITH_NCCL})
set(MINIDL_CONFIG_NCCL_LIBRARY "${MINIDL_NCCL_LIBRARY}")
set(MINIDL_CONFIG_CUDA_ROOT "")
set(MINIDL_CONFIG_CUDNN_LIBRARY "")
set(MINIDL_CONFIG_CUDNN_INCLUDE "")
if(MINIDL_WITH_CUDA)
  get_filename_component(MINIDL_CONFIG_CUDA_ROOT "${CUDAToolkit_BIN_DIR}" DIRECTORY)
  set(MINIDL_CONFIG_CUDNN_LIBRARY "${MINIDL_CUDNN_LIBRARY}")
  set(MINIDL_CONFIG_CUDNN_INCLUDE "${MINIDL_CUDNN_INCLUDE}")
endif()

configure_package_config_file(
  ${CMAKE_CURRENT_LIST_DIR}/minidlConfig.cmake.in
  ${CMAKE_CURRENT_BINARY_DIR}/minidlConfig.cmake
  INSTALL_DESTINATION ${MINIDL_INSTALL_CMAKEDIR})
# 0.x: only the same minor version is promised to be compatible.
write_basic_package_version_file(
  ${CMAKE_CURRENT_BINARY_DIR}/minidlConfigVersion.cmake
  VERSION ${PROJECT_VERSION}
  COMPATIBILITY SameMinorVersion)
install(FILES
  ${CMAKE_CURRENT_BINARY_DIR}/minidlConfig.cmake
  ${CMAKE_CURRENT_BINARY_DIR}/minidlConfigVersion.cmake
  DESTINATION ${MINIDL_INSTALL_CMAKEDIR} COMPONENT minidl)
