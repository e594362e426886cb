#!/usr/bin/env bash
# The README's test command (and CI's, via .ci/run): installs what is missing, configures the
# `build` folder once (Release, MINIDL_CUDA=AUTO), builds incrementally and runs ctest.
# Extra arguments go to ctest, e.g. `bash tools/test.sh -L cpu`. Exits with ctest's status.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."

bash tools/install_deps.sh

build=${MINIDL_BUILD_DIR:-build}
jobs=$(nproc)
# Configure only when the build folder has no build system yet, or when the caller asks for a
# setting (MINIDL_CUDA=AUTO|ON|OFF, MINIDL_CMAKE_ARGS="-D..."); later runs just rebuild, and CMake
# re-runs itself when a CMakeLists.txt or a globbed folder changes.
if [[ ! -f $build/CMakeCache.txt || ! ( -f $build/Makefile || -f $build/build.ninja ) ||
      -n ${MINIDL_CUDA:-} || -n ${MINIDL_CMAKE_ARGS:-} ]]; then
  # shellcheck disable=SC2086  # MINIDL_CMAKE_ARGS is a space-separated list of arguments
  cmake -S . -B "$build" -DCMAKE_BUILD_TYPE=Release -DMINIDL_CUDA="${MINIDL_CUDA:-AUTO}" ${MINIDL_CMAKE_ARGS:-}
fi
cmake --build "$build" -j "$jobs"

# ctest runs test processes side by side; libgomp's default (active) waiting makes an OpenMP
# thread spin on a core for ~0.2 s after each parallel region, so two OpenMP tests at once took
# each other's cores (experiments_slow's BatchScheduleStudy: 33 s alone, 493 s beside another).
# Passive waiting sleeps instead; a caller's own OMP_WAIT_POLICY is kept.
export OMP_WAIT_POLICY=${OMP_WAIT_POLICY:-passive}
status=0
ctest --test-dir "$build" --output-on-failure -j "$jobs" "$@" || status=$?
# Why tests were skipped (GTEST_SKIP's message, which ctest prints only under -V), one line per
# reason with the number of tests it skipped.
log=$build/Testing/Temporary/LastTest.log
if [[ -f $log ]]; then
  awk 'reason_next { reasons[$0]++; reason_next = 0 }
       /: Skipped$/ { reason_next = 1 }
       END { for (r in reasons) printf "skipped: %d test(s): %s\n", reasons[r], r }' "$log" | sort
fi
exit "$status"
