# Install and export rules, so a user's CMake project can `find_package(minidl)` and link
# `minidl::minidl`: the library, the public headers under include/minidl/ (so that
# `#include "core/tensor.h"` works as in-tree), the exported targets and a package config.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(MINIDL_INSTALL_CMAKEDIR ${CMAKE_INSTALL_LIBDIR}/cmake/minidl CACHE STRING
    "Where the minidl package config goes, relative to the install prefix")
mark_as_advanced(MINIDL_INSTALL_CMAKEDIR)

# Everything here is in the install component `minidl`, so `cmake --install build --component
# minidl` (what tests/install does) needs only the library built, not the programs.
install(TARGETS minidl minidl_dist EXPORT minidlTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT minidl
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR} COMPONENT minidl
  RUNTIME DESTINATION ${CMAKE_INSTALL_BINDIR} COMPONENT minidl)

# Public headers, folder structure kept. The include directory itself (include/minidl) is the
# target's INSTALL_INTERFACE in the top-level CMakeLists.txt. kernels/cuda is internal.
# A folder with no files yet does not exist in a fresh clone (git keeps no empty folders).
foreach(_minidl_dir core nn optim data dist)
  if(IS_DIRECTORY ${CMAKE_CURRENT_SOURCE_DIR}/${_minidl_dir})
    install(DIRECTORY ${_minidl_dir}
      DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/minidl COMPONENT minidl
      FILES_MATCHING PATTERN "*.h")
  endif()
endforeach()
unset(_minidl_dir)
install(FILES kernels/cpu/cpu_backend.h
  DESTINATION ${CMAKE_INSTALL_INCLUDEDIR}/minidl/kernels/cpu COMPONENT minidl)

install(EXPORT minidlTargets
  NAMESPACE minidl::
  DESTINATION ${MINIDL_INSTALL_CMAKEDIR} COMPONENT minidl)

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
