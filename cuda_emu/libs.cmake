# The emulated device's cuBLAS and cuDNN stand-ins (minidl_emu_libs): host C++ that defines the
# libraries' own entry points, so a host build of the backend links against them instead of
# libcublas / libcudnn. Only the real headers are needed (for the types and signatures); nothing
# from CUDA is linked, and the real nvcc build never sees this target.
# Output: MINIDL_WITH_EMU_LIBS, and the target minidl_emu_libs when ON.
set(MINIDL_WITH_EMU_LIBS OFF)
find_path(MINIDL_EMU_CUDA_INCLUDE cublas_v2.h HINTS /usr/local/cuda/include /usr/include)
find_path(MINIDL_EMU_CUDNN_INCLUDE cudnn.h HINTS ${MINIDL_EMU_CUDA_INCLUDE} /usr/local/cuda/include /usr/include)
set(_minidl_emu_why "")
if(NOT MINIDL_EMU_CUDA_INCLUDE OR NOT EXISTS ${MINIDL_EMU_CUDA_INCLUDE}/cuda_runtime_api.h)
  set(_minidl_emu_why "the CUDA toolkit headers (cublas_v2.h, cuda_runtime_api.h) were not found")
elseif(NOT MINIDL_EMU_CUDNN_INCLUDE)
  set(_minidl_emu_why "cudnn.h was not found")
else()
  # The stand-ins follow cuBLAS 13's compute types and cuDNN 9's status sub-codes.
  file(STRINGS ${MINIDL_EMU_CUDA_INCLUDE}/cublas_api.h _cublas_major REGEX "#define CUBLAS_VER_MAJOR ")
  string(REGEX MATCH "[0-9]+" _cublas_major "${_cublas_major}")
  set(_cudnn_version_h ${MINIDL_EMU_CUDNN_INCLUDE}/cudnn_version.h)
  if(NOT EXISTS ${_cudnn_version_h})
    set(_cudnn_version_h ${MINIDL_EMU_CUDNN_INCLUDE}/cudnn.h)
  endif()
  file(STRINGS ${_cudnn_version_h} _cudnn_major REGEX "#define CUDNN_MAJOR ")
  string(REGEX MATCH "[0-9]+" _cudnn_major "${_cudnn_major}")
  if(NOT _cublas_major OR _cublas_major LESS 13)
    set(_minidl_emu_why "cuBLAS ${_cublas_major} is older than 13")
  elseif(NOT _cudnn_major OR _cudnn_major LESS 9)
    set(_minidl_emu_why "cuDNN ${_cudnn_major} is older than 9")
  endif()
endif()

# cudnn-frontend (cmake/cudnn_frontend.cmake): the backend's convolutions include it, and the tests of
# the graph-API stand-ins drive it. A CUDA build has required it already; a headers-only build uses it
# when it is there.
if(NOT MINIDL_WITH_CUDA)
  find_path(MINIDL_CUDNN_FRONTEND_INCLUDE cudnn_frontend.h
    HINTS ${PROJECT_SOURCE_DIR}/.tools/cudnn_frontend/include NO_DEFAULT_PATH)
endif()
if(_minidl_emu_why STREQUAL "")
  add_library(minidl_emu_libs STATIC
    ${CMAKE_CURRENT_LIST_DIR}/emu_libs.cpp
    ${CMAKE_CURRENT_LIST_DIR}/call_log.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cublas_emu.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cudnn_emu.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cudnn_algos.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cudnn_backend_emu.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cudnn_backend_graph.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cudnn_backend_engines.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cudnn_backend_fused.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cudnn_backend_fused_graph.cpp
    ${CMAKE_CURRENT_LIST_DIR}/cudnn_backend_fused_exec.cpp
    ${CMAKE_CURRENT_LIST_DIR}/conv_reference.cpp)
  target_include_directories(minidl_emu_libs PUBLIC $<BUILD_INTERFACE:${PROJECT_SOURCE_DIR}>)
  target_include_directories(minidl_emu_libs SYSTEM PUBLIC ${MINIDL_EMU_CUDA_INCLUDE} ${MINIDL_EMU_CUDNN_INCLUDE})
  if(MINIDL_CUDNN_FRONTEND_INCLUDE)
    target_include_directories(minidl_emu_libs SYSTEM PUBLIC ${MINIDL_CUDNN_FRONTEND_INCLUDE})
    target_compile_definitions(minidl_emu_libs PUBLIC MINIDL_EMU_WITH_CUDNN_FRONTEND=1)
  endif()
  target_link_libraries(minidl_emu_libs PRIVATE minidl_warnings)
  target_compile_features(minidl_emu_libs PUBLIC cxx_std_20)
  set(MINIDL_WITH_EMU_LIBS ON)
  message(STATUS "minidl: emulated cuBLAS/cuDNN stand-ins ON (headers in ${MINIDL_EMU_CUDA_INCLUDE})")
else()
  message(STATUS "minidl: emulated cuBLAS/cuDNN stand-ins OFF: ${_minidl_emu_why}")
endif()
