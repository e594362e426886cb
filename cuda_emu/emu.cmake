# The emulated CUDA device (docs/cuda/emulator.md): minidl_emu is minidl with kernels/cuda/*.cu compiled by
# the host compiler against the emulation layer (device_api.h and backend_hooks.h, force-included)
# instead of nvcc,
# the emulated runtime and kernel runner of this folder, and the cuBLAS / cuDNN stand-ins. Only
# test executables link it; the real library never contains any of this. minidl_emu_prof is the
# same device with the kernels built for the counters of global memory (profiler.h).
# Output: MINIDL_WITH_EMU, and the targets minidl_emu and minidl_emu_prof when ON.
set(MINIDL_WITH_EMU OFF)
option(MINIDL_EMU_ASAN "Build the emulated device and its tests with AddressSanitizer (device memory no tensor owns is poisoned)" ON)
if(MINIDL_WITH_CUDA AND MINIDL_WITH_EMU_LIBS)
  find_package(Boost 1.74 CONFIG QUIET COMPONENTS context)   # Debian: libboost-context-dev
  if(NOT Boost_FOUND)
    message(STATUS "minidl: emulated CUDA device OFF: Boost.Context was not found (apt-get install libboost-context-dev)")
  else()
    # Each .cu is compiled through a one-line .cpp that includes it (a source file has one language).
    # `_dir` holds them; the profiling build (below) compiles the same .cu files a second time.
    function(minidl_emu_kernel_sources _dir _out)
      set(_sources "")
      foreach(_cu IN LISTS MINIDL_CUDA_SOURCES)
        get_filename_component(_name ${_cu} NAME_WE)
        set(_cpp ${CMAKE_BINARY_DIR}/${_dir}/${_name}.cpp)
        file(CONFIGURE OUTPUT ${_cpp} CONTENT "// Generated: ${_cu} for the emulated device.\n#include \"${_cu}\"\n")
        list(APPEND _sources ${_cpp})
      endforeach()
      set(${_out} ${_sources} PARENT_SCOPE)
    endfunction()
    minidl_emu_kernel_sources(emu_src _emu_sources)
    # -ffp-contract=off: __fadd_rn / __fmul_rn round each operation, as they do on the GPU.
    # -Wno-sign-compare: threadIdx.x is unsigned; nvcc does not warn about comparing it with an int.
    # -fsanitize=alignment: a misaligned typed access in a kernel (a float4, half2 or 16-byte Vec
    # load from an address the type's alignment does not divide, which faults on a GPU) stops the
    # program with UBSan's report naming the source line, the address and the type.
    set(_emu_language "-include;${CMAKE_CURRENT_LIST_DIR}/device_api.h;-include;${CMAKE_CURRENT_LIST_DIR}/backend_hooks.h;-ffp-contract=off;-Wno-sign-compare;-fsanitize=alignment;-fno-sanitize-recover=alignment")
    # -O2 for the tests' kernels (after the build type's flags, so it wins over Release's -O3): a
    # quarter less compile time for these, the largest files of the build (elementwise and reduce:
    # every dtype times every op), for emulated runs about 5% slower.
    set(MINIDL_EMU_KERNEL_OPTIONS "${_emu_language};-O2")
    if(MINIDL_EMU_ASAN)
      # Kernels, runtime and runner instrumented; minidl's C++ objects stay as they are (ASan's
      # interceptors still check their memcpy/memset).
      list(APPEND MINIDL_EMU_KERNEL_OPTIONS -fsanitize=address -fno-omit-frame-pointer)
    endif()
    set_source_files_properties(${_emu_sources} PROPERTIES COMPILE_OPTIONS "${MINIDL_EMU_KERNEL_OPTIONS}")

    # The emulated device itself (runner, runtime, streams, shared memory, counters, race check),
    # compiled once for minidl_emu and minidl_emu_prof.
    add_library(minidl_emu_core OBJECT
      ${CMAKE_CURRENT_LIST_DIR}/runner.cpp
      ${CMAKE_CURRENT_LIST_DIR}/collectives.cpp
      ${CMAKE_CURRENT_LIST_DIR}/runtime.cpp
      ${CMAKE_CURRENT_LIST_DIR}/runtime_errors.cpp
      ${CMAKE_CURRENT_LIST_DIR}/runtime_streams.cpp
      ${CMAKE_CURRENT_LIST_DIR}/vmm.cpp
      ${CMAKE_CURRENT_LIST_DIR}/graphs.cpp
      ${CMAKE_CURRENT_LIST_DIR}/kernel_attributes.cpp
      ${CMAKE_CURRENT_LIST_DIR}/streams.cpp
      ${CMAKE_CURRENT_LIST_DIR}/shared_arena.cpp
      ${CMAKE_CURRENT_LIST_DIR}/profiler.cpp
      ${CMAKE_CURRENT_LIST_DIR}/race_check.cpp)
    target_include_directories(minidl_emu_core PUBLIC ${PROJECT_SOURCE_DIR})
    target_compile_definitions(minidl_emu_core PUBLIC MINIDL_WITH_CUDA=1 MINIDL_CUDA_EMU=1)
    target_compile_features(minidl_emu_core PUBLIC cxx_std_20)
    target_link_libraries(minidl_emu_core PRIVATE minidl_emu_libs minidl_warnings Boost::context)
    if(MINIDL_EMU_ASAN)
      # vmm.cpp too: an unmapped page's poisoning is cleared there, so a later mapping starts clean.
      set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/runtime.cpp ${CMAKE_CURRENT_LIST_DIR}/vmm.cpp
        PROPERTIES COMPILE_OPTIONS "-fsanitize=address;-fno-omit-frame-pointer")
      # The runner and the collectives run between every two turns of every waiting thread: their
      # heap and globals stay checked, but not their own stack frames (redzones and use-after-scope
      # poisoning on each call were a sixth of a fiber-heavy emulated step). The kernels, whose
      # local arrays are what a GPU bug overruns, keep every check.
      set_source_files_properties(${CMAKE_CURRENT_LIST_DIR}/runner.cpp ${CMAKE_CURRENT_LIST_DIR}/collectives.cpp
        PROPERTIES COMPILE_OPTIONS
        "-fsanitize=address;-fno-omit-frame-pointer;--param=asan-stack=0;-fno-sanitize-address-use-after-scope")
    endif()

    # minidl_emu (tests) and minidl_emu_prof (counters of global memory) differ only in how the
    # kernels are compiled.
    function(minidl_emu_library _name)
      add_library(${_name} STATIC ${MINIDL_HOST_OBJECTS} $<TARGET_OBJECTS:minidl_emu_core> ${ARGN})
      target_include_directories(${_name} PUBLIC ${PROJECT_SOURCE_DIR})
      target_compile_definitions(${_name} PUBLIC MINIDL_WITH_CUDA=1 MINIDL_CUDA_EMU=1)
      target_compile_features(${_name} PUBLIC cxx_std_20)
      target_link_libraries(${_name}
        PUBLIC Threads::Threads minidl_emu_libs
        PRIVATE Eigen3::Eigen OpenMP::OpenMP_CXX minidl_warnings nlohmann_json::nlohmann_json Boost::context)
      minidl_link_data_deps(${_name})
      target_link_options(${_name} INTERFACE -fsanitize=alignment "LINKER:--undefined=minidl_cuda_entry")
      if(MINIDL_EMU_ASAN)
        target_link_options(${_name} INTERFACE -fsanitize=address)
      endif()
    endfunction()
    minidl_emu_library(minidl_emu ${_emu_sources})

    # The profiling build of the kernels (docs/cuda/counters.md): GCC's ThreadSanitizer
    # instrumentation puts a call before every load and store; tsan_hooks.cpp defines those calls
    # (the TSan runtime is never linked) and reports device-memory accesses to the counters. It
    # cannot be combined with -fsanitize=address, so these kernels are not under ASan (the runtime
    # and runner still are). -fno-optimize-sibling-calls keeps each atomic and shared access a
    # call that returns to its own instruction; -O2 -fno-tree-sra keep nvcc's memory instructions
    # (at -O3 a 16-byte Vec load became four 4-byte loads, and -fsplit-paths copied a store into
    # both arms of a branch, splitting a warp's lanes between two instructions).
    minidl_emu_kernel_sources(emu_prof_src _prof_sources)
    set(MINIDL_EMU_PROF_KERNEL_OPTIONS "${_emu_language};-fsanitize=thread;--param=tsan-instrument-func-entry-exit=0")
    list(APPEND MINIDL_EMU_PROF_KERNEL_OPTIONS -fno-optimize-sibling-calls -O2 -fno-tree-sra)
    set_source_files_properties(${_prof_sources} PROPERTIES COMPILE_OPTIONS "${MINIDL_EMU_PROF_KERNEL_OPTIONS}")
    minidl_emu_library(minidl_emu_prof ${_prof_sources} ${CMAKE_CURRENT_LIST_DIR}/tsan_hooks.cpp)
    set(MINIDL_WITH_EMU ON)
    message(STATUS "minidl: emulated CUDA device ON (minidl_emu, for the cuda-emu tests)")
  endif()
elseif(NOT MINIDL_WITH_CUDA)
  # minidl's C++ objects are shared with minidl_emu and must be the CUDA build's (MINIDL_WITH_CUDA).
  message(STATUS "minidl: emulated CUDA device OFF: it reuses the CUDA build's objects (MINIDL_CUDA is OFF or nvcc was not found)")
else()
  message(STATUS "minidl: emulated CUDA device OFF: the cuBLAS/cuDNN stand-ins are OFF")
endif()
