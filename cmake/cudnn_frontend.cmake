# Finds cudnn-frontend, the header-only C++ API over cuDNN's graph (backend) API through which the
# CUDA backend builds its convolutions (one operation graph and execution plan per shape). Pinned:
# tools/install_deps.sh unpacks the headers of the wheel it names into .tools/cudnn_frontend/include;
# -DMINIDL_CUDNN_FRONTEND_INCLUDE=<dir> points at another copy. It needs cuDNN >= 8.5 and C++17.
# Input: _minidl_fe_cudnn_include (the folder of cudnn.h). Output: MINIDL_CUDNN_FRONTEND_INCLUDE, or a
# configure error that names the fix.
include_guard(GLOBAL)
set(MINIDL_CUDNN_FRONTEND_VERSION 1.32.0)   # keep equal to MINIDL_PYPI_CUDNN_FRONTEND in tools/install_deps.sh
find_path(MINIDL_CUDNN_FRONTEND_INCLUDE cudnn_frontend.h
  HINTS ${PROJECT_SOURCE_DIR}/.tools/cudnn_frontend/include NO_DEFAULT_PATH)
find_path(MINIDL_CUDNN_FRONTEND_INCLUDE cudnn_frontend.h)
if(NOT MINIDL_CUDNN_FRONTEND_INCLUDE)
  message(FATAL_ERROR "minidl: cudnn-frontend ${MINIDL_CUDNN_FRONTEND_VERSION} (cudnn_frontend.h) was not found; "
    "the CUDA backend's convolutions are built on it. Run `bash tools/install_deps.sh` (it unpacks the headers into "
    ".tools/cudnn_frontend), pass -DMINIDL_CUDNN_FRONTEND_INCLUDE=<folder of cudnn_frontend.h>, or configure with "
    "-DMINIDL_CUDA=OFF.")
endif()
file(STRINGS ${MINIDL_CUDNN_FRONTEND_INCLUDE}/cudnn_frontend_version.h _fe_version
     REGEX "#define CUDNN_FRONTEND_(MAJOR|MINOR|PATCH)_VERSION ")
string(REGEX REPLACE ".*MAJOR_VERSION ([0-9]+).*MINOR_VERSION ([0-9]+).*PATCH_VERSION ([0-9]+).*" "\\1.\\2.\\3"
       _fe_version "${_fe_version}")
if(NOT _fe_version VERSION_EQUAL MINIDL_CUDNN_FRONTEND_VERSION)
  message(WARNING "minidl: cudnn-frontend in ${MINIDL_CUDNN_FRONTEND_INCLUDE} is ${_fe_version}, minidl is tested "
    "with ${MINIDL_CUDNN_FRONTEND_VERSION} (bash tools/install_deps.sh installs it)")
endif()
# cudnn-frontend's graph API needs cuDNN 8.5 or newer.
set(_fe_cudnn_h ${_minidl_fe_cudnn_include}/cudnn_version.h)
if(NOT EXISTS ${_fe_cudnn_h})
  set(_fe_cudnn_h ${_minidl_fe_cudnn_include}/cudnn.h)
endif()
file(STRINGS ${_fe_cudnn_h} _fe_cudnn REGEX "#define CUDNN_(MAJOR|MINOR) ")
string(REGEX REPLACE ".*CUDNN_MAJOR ([0-9]+).*CUDNN_MINOR ([0-9]+).*" "\\1.\\2" _fe_cudnn "${_fe_cudnn}")
if(_fe_cudnn VERSION_LESS 8.5)
  message(FATAL_ERROR "minidl: cuDNN ${_fe_cudnn} (${_fe_cudnn_h}) is older than 8.5, which cudnn-frontend's graph "
    "API needs. Install cuDNN 9, or configure with -DMINIDL_CUDA=OFF.")
endif()
message(STATUS "minidl: cudnn-frontend ${_fe_version} (${MINIDL_CUDNN_FRONTEND_INCLUDE}) over cuDNN ${_fe_cudnn}")
