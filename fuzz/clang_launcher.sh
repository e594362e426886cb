#!/bin/sh
# The fuzz targets are built inside the ordinary g++ build (fuzz/CMakeLists.txt), compiled and
# linked by clang, which has libFuzzer: CMake calls this as `clang_launcher.sh CLANG BUILD_CXX
# ARGS...` and the build's own compiler is replaced by CLANG. g++ and clang share the C++ ABI on
# Linux, so the g++-built minidl libraries link into them as they are.
clang=$1
shift 2
exec "$clang" "$@"
