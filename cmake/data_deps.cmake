# The image libraries of data/: libjpeg-turbo's TurboJPEG API decodes JPEG, stb_image the other
# formats and stb_image_resize resizes (header-only, compiled into data/stb_impl.cpp). Linked
# PRIVATE into minidl by its full path, so the exported static library carries it for consumers.
find_package(PkgConfig QUIET)
if(PkgConfig_FOUND)
  pkg_check_modules(MINIDL_PC_TURBOJPEG QUIET libturbojpeg)
endif()
find_library(MINIDL_TURBOJPEG_LIBRARY NAMES turbojpeg HINTS ${MINIDL_PC_TURBOJPEG_LIBRARY_DIRS})
find_path(MINIDL_TURBOJPEG_INCLUDE turbojpeg.h HINTS ${MINIDL_PC_TURBOJPEG_INCLUDE_DIRS})
find_path(MINIDL_STB_INCLUDE stb_image.h PATH_SUFFIXES stb HINTS /usr/include/stb)
if(NOT MINIDL_TURBOJPEG_LIBRARY OR NOT MINIDL_TURBOJPEG_INCLUDE)
  message(FATAL_ERROR "minidl's data layer needs libjpeg-turbo's TurboJPEG API: apt install libturbojpeg0-dev "
                      "(or set MINIDL_TURBOJPEG_LIBRARY and MINIDL_TURBOJPEG_INCLUDE)")
endif()
if(NOT MINIDL_STB_INCLUDE OR NOT EXISTS "${MINIDL_STB_INCLUDE}/stb_image_resize.h")
  message(FATAL_ERROR "minidl's data layer needs stb_image.h and stb_image_resize.h: apt install libstb-dev "
                      "(or set MINIDL_STB_INCLUDE to the folder holding them)")
endif()

function(minidl_link_data_deps target)
  # SYSTEM: the third-party headers are not held to minidl's -Werror.
  target_include_directories(${target} SYSTEM PRIVATE ${MINIDL_TURBOJPEG_INCLUDE} ${MINIDL_STB_INCLUDE})
  target_link_libraries(${target} PRIVATE ${MINIDL_TURBOJPEG_LIBRARY})
endfunction()
