# The nvcc build's static resource usage per kernel (registers, spill stores and loads, stack,
# static shared memory, barriers), as ptxas reports it for sm_90, captured while `minidl_cuda`'s CUDA
# sources compile: a compiler launcher (cmake/ptxas_resources.sh) adds --resource-usage and writes
# the report beside the build, one file per source in MINIDL_KERNEL_RESOURCES_DIR. The H100
# step-time model (perfmodel) reads that folder for each kernel's theoretical occupancy. No
# GPU is needed, and no second compile: the objects are the library's own.
# Output: MINIDL_KERNEL_RESOURCES_DIR (empty when the CUDA backend is off).
set(MINIDL_KERNEL_RESOURCES_DIR "")
if(MINIDL_WITH_CUDA)
  set(MINIDL_KERNEL_RESOURCES_DIR ${CMAKE_BINARY_DIR}/kernel_resources)
  set_property(TARGET minidl_cuda PROPERTY CUDA_COMPILER_LAUNCHER
    ${PROJECT_SOURCE_DIR}/cmake/ptxas_resources.sh ${MINIDL_KERNEL_RESOURCES_DIR} ${CMAKE_CUDA_COMPILER_LAUNCHER})
endif()
