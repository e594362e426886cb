#!/usr/bin/env bash
# The README's main-job command: installs what is missing, configures the `build` folder once
# (Release, MINIDL_CUDA=AUTO), builds only the `minidl-demo` program and runs it with the given
# arguments (`bash tools/demo.sh --help` lists them). It runs in the caller's folder.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

bash "$root/tools/install_deps.sh"

build=${MINIDL_BUILD_DIR:-build}
[[ $build == /* ]] || build=$root/$build
# Same rule as tools/test.sh: configure when there is no build system yet or a setting is asked for.
if [[ ! -f $build/CMakeCache.txt || ! ( -f $build/Makefile || -f $build/build.ninja ) ||
      -n ${MINIDL_CUDA:-} || -n ${MINIDL_CMAKE_ARGS:-} ]]; then
  # shellcheck disable=SC2086  # MINIDL_CMAKE_ARGS is a space-separated list of arguments
  cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DMINIDL_CUDA="${MINIDL_CUDA:-AUTO}" ${MINIDL_CMAKE_ARGS:-} >&2
fi
# Make only resolves a target after a regeneration when asked first; Ninja always does it itself.
if [[ -f $build/Makefile ]]; then
  cmake --build "$build" --target cmake_check_build_system >&2
fi
cmake --build "$build" --target minidl-demo -j "$(nproc)" >&2

exec "$build/bin/minidl-demo" "$@"
