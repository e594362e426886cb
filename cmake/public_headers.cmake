# The public headers under the `minidl/` prefix, the same in the build tree and when installed:
# build/include/minidl/<layer>/<header>.h are copies of core/, nn/, optim/, data/, distributed/, train/
# and kernels/cpu/cpu_backend.h (with the override list it includes) whose includes of each other read "minidl/<layer>/..." (the
# sources keep their in-tree names), plus the umbrella include/minidl/minidl.h. A consumer writes
# #include <minidl/core/tensor.h> against either; cmake/prefix_headers.cmake does the copying.
# Output: MINIDL_PUBLIC_INCLUDE_DIR, the target minidl_public_headers.
set(MINIDL_PUBLIC_INCLUDE_DIR ${CMAKE_BINARY_DIR}/include)
set(MINIDL_PUBLIC_LAYERS core nn optim data distributed train)
set(_public_rel "")
foreach(_layer IN LISTS MINIDL_PUBLIC_LAYERS)
  file(GLOB _h CONFIGURE_DEPENDS RELATIVE ${PROJECT_SOURCE_DIR} ${PROJECT_SOURCE_DIR}/${_layer}/*.h)
  list(APPEND _public_rel ${_h})
endforeach()
list(REMOVE_ITEM _public_rel data/stb_wrap.h train/run_parts.h)   # internal: their folder's .cpp files only
list(APPEND _public_rel kernels/cpu/cpu_backend.h kernels/common/backend_overrides.h)   # the latter: the former's list of kernels
set(_public_src "")
set(_public_out ${MINIDL_PUBLIC_INCLUDE_DIR}/minidl/minidl.h)
foreach(_rel IN LISTS _public_rel)
  list(APPEND _public_src ${PROJECT_SOURCE_DIR}/${_rel})
  list(APPEND _public_out ${MINIDL_PUBLIC_INCLUDE_DIR}/minidl/${_rel})
endforeach()
string(JOIN "|" _layers_regex ${MINIDL_PUBLIC_LAYERS} kernels)
add_custom_command(OUTPUT ${_public_out}
  COMMAND ${CMAKE_COMMAND} -DSRC=${PROJECT_SOURCE_DIR} -DDST=${MINIDL_PUBLIC_INCLUDE_DIR}/minidl
          "-DFILES=${_public_rel}" "-DLAYERS=${_layers_regex}" -P ${PROJECT_SOURCE_DIR}/cmake/prefix_headers.cmake
  COMMAND ${CMAKE_COMMAND} -E copy_if_different ${PROJECT_SOURCE_DIR}/include/minidl/minidl.h
          ${MINIDL_PUBLIC_INCLUDE_DIR}/minidl/minidl.h
  DEPENDS ${_public_src} ${PROJECT_SOURCE_DIR}/include/minidl/minidl.h ${PROJECT_SOURCE_DIR}/cmake/prefix_headers.cmake
  COMMENT "minidl: public headers under build/include/minidl"
  VERBATIM)
add_custom_target(minidl_public_headers DEPENDS ${_public_out})
unset(_public_rel)
unset(_public_src)
unset(_public_out)
unset(_layers_regex)
unset(_h)
