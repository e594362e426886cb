# Finds the engines distributed/ runs on: MPI (Open MPI from Debian) for launching ranks and for CPU
# tensors, and NCCL for CUDA tensors (CUDA builds only). Both are optional: without MPI the process
# group is a world of one, without NCCL CUDA tensors are refused; the configure output says which.
# Output: MINIDL_WITH_MPI, MINIDL_WITH_NCCL and, with NCCL, the imported target minidl_nccl.
set(MINIDL_MPI "AUTO" CACHE STRING "Build distributed/'s MPI backend: AUTO (when MPI is found), ON or OFF")
set_property(CACHE MINIDL_MPI PROPERTY STRINGS AUTO ON OFF)
set(MINIDL_NCCL_ROOT "" CACHE PATH
    "Where NCCL's include/ and lib/ are, when not in the CUDA toolkit or /usr (e.g. the nvidia-nccl-cu13 wheel's nvidia/nccl folder)")

set(MINIDL_WITH_MPI OFF)
string(TOUPPER "${MINIDL_MPI}" _minidl_mpi_mode)
if(NOT _minidl_mpi_mode STREQUAL "OFF")
  # The C API through the CXX component (the project enables no C compiler), without MPI's
  # deprecated C++ bindings.
  set(MPI_CXX_SKIP_MPICXX TRUE)
  find_package(MPI COMPONENTS CXX QUIET)
  if(MPI_CXX_FOUND)
    set(MINIDL_WITH_MPI ON)
    message(STATUS "minidl: distributed MPI backend ON (MPI ${MPI_CXX_VERSION}, ${MPIEXEC_EXECUTABLE})")
  elseif(_minidl_mpi_mode STREQUAL "ON")
    message(FATAL_ERROR "minidl: MINIDL_MPI=ON but MPI was not found: apt-get install libopenmpi-dev openmpi-bin "
                        "(tools/install_deps.sh does it) or configure with -DMINIDL_MPI=OFF")
  else()
    message(STATUS "minidl: distributed MPI backend OFF: MPI not found (install libopenmpi-dev); "
                   "process groups are then a world of one")
  endif()
endif()

set(MINIDL_WITH_NCCL OFF)
if(MINIDL_WITH_CUDA)
  set(_nccl_hints ${MINIDL_NCCL_ROOT} $ENV{NCCL_ROOT} ${CUDAToolkit_LIBRARY_ROOT} /usr/local/cuda /usr)
  find_path(MINIDL_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} PATHS ${_nccl_hints} PATH_SUFFIXES include)
  find_library(MINIDL_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} PATHS ${_nccl_hints}
               PATH_SUFFIXES lib lib64 lib/x86_64-linux-gnu)
  if(MINIDL_NCCL_INCLUDE AND MINIDL_NCCL_LIBRARY)
    add_library(minidl_nccl UNKNOWN IMPORTED)
    set_target_properties(minidl_nccl PROPERTIES
      IMPORTED_LOCATION ${MINIDL_NCCL_LIBRARY}
      INTERFACE_INCLUDE_DIRECTORIES ${MINIDL_NCCL_INCLUDE})
    set(MINIDL_WITH_NCCL ON)
    message(STATUS "minidl: distributed NCCL backend ON (${MINIDL_NCCL_LIBRARY})")
  else()
    message(STATUS "minidl: distributed NCCL backend OFF: nccl.h or libnccl not found (set MINIDL_NCCL_ROOT); "
                   "collectives on CUDA tensors then throw")
  endif()
  unset(_nccl_hints)
else()
  message(STATUS "minidl: distributed NCCL backend OFF: no CUDA backend")
endif()
