# cmake -P helper of cmake/public_headers.cmake: copies each header of FILES (relative to SRC) to
# DST, rewriting `#include "<layer>/...` (LAYERS, a regex alternation) to `#include "minidl/<layer>/...`,
# so the copies include each other through the prefix only. A copy whose text is unchanged is not
# written again (what includes it need not rebuild).
foreach(_rel IN LISTS FILES)
  file(READ ${SRC}/${_rel} _text)
  string(REGEX REPLACE "#include \"(${LAYERS})/" "#include \"minidl/\\1/" _text "${_text}")
  set(_out ${DST}/${_rel})
  set(_old "")
  if(EXISTS ${_out})
    file(READ ${_out} _old)
  endif()
  if(NOT _old STREQUAL _text)
    file(WRITE ${_out} "${_text}")
  endif()
endforeach()
