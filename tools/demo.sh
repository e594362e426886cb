#!/usr/bin/env bash
# The README's main-job command: installs what is missing, configures the `build` folder once
# (Release, MINIDL_CUDA=AUTO), builds `minidl-sweep` and runs the Keras batch-size study scaled
# down (`--study keras-batch --quick`: 42 short runs on the built-in synthetic images, under a
# minute on 2 CPU cores), then prints where the table, the summary and the plot are. Extra
# arguments go to minidl-sweep (e.g. `--out DIR`, or `--study lr-scaling`); a rerun resumes.
set -euo pipefail
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)

# The plot needs gnuplot: installed along when we may install packages, otherwise the sweep
# says that it skipped the plot and keeps the CSV.
if ! command -v gnuplot > /dev/null 2>&1; then
  if [[ $(id -u) == 0 ]]; then
    export MINIDL_EXTRA_PACKAGES="${MINIDL_EXTRA_PACKAGES:-} gnuplot-nox"
  else
    echo "demo: gnuplot is not installed (sudo apt-get install gnuplot-nox): the plot will be skipped" >&2
  fi
fi
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
cmake --build "$build" --target minidl-sweep -j "$(nproc)" >&2

# Without --study in the arguments, the Keras study; results under ./results/ unless --out says.
args=("$@")
has_study=0
for a in "${args[@]}"; do [[ $a == --study || $a == --study=* ]] && has_study=1; done
if [[ $has_study == 0 ]]; then
  args=(--study keras-batch --quick "${args[@]}")
fi
exec "$build/bin/minidl-sweep" --progress-every 0 "${args[@]}"
