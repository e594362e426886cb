#!/usr/bin/env bash
# Installs the Debian packages minidl needs, and only the missing ones. It holds THE package list:
# tools/test.sh and tools/demo.sh both call it, so a new dependency is added here and nowhere else.
# Quiet when nothing is missing; as non-root it prints the exact sudo command and fails.
set -euo pipefail

# Build and test dependencies (compiler, CMake, Eigen, GoogleTest, Google Benchmark, JSON,
# libjpeg-turbo and stb for image decoding, CLI11 for the experiment programs' flags, Open MPI for
# distributed/'s data-parallel training and its 2-rank tests, Boost.Context for the emulated CUDA device's
# per-thread fibers, clang and its libFuzzer runtime for the fuzz targets that ctest runs: fuzz/).
MINIDL_PACKAGES=(
  cmake
  g++
  make
  libeigen3-dev
  googletest
  libgtest-dev
  libbenchmark-dev
  nlohmann-json3-dev
  libturbojpeg0-dev
  libstb-dev
  libcli11-dev
  libopenmpi-dev
  openmpi-bin
  libboost-context-dev
  clang
  libclang-rt-dev
  python3
  python3-pip
)
# From PyPI (pure Python, installed into .tools/, which git ignores): lizard, which the function
# length check of the tests (tests/tools/function_length_test.sh) runs.
MINIDL_PYPI_LIZARD=lizard==1.24.3
# cudnn-frontend, the header-only C++ API over cuDNN's graph (backend) API that the CUDA backend's
# convolutions are built on (kernels/cuda/conv*.cu). Its wheel ships the headers under include/; only
# those are unpacked, into .tools/cudnn_frontend/include (cmake/cudnn_frontend.cmake looks there).
MINIDL_PYPI_CUDNN_FRONTEND=nvidia-cudnn-frontend==1.32.0
# Only for regenerating the golden files (tools/make_golden*.py); never for building or testing.
# Pillow: the e2e golden's decoding and resizes, and the article augmentation's golden.
MINIDL_GOLDEN_PACKAGES=(
  python3
  python3-numpy
  python3-pil
  python3-torch
  python3-torchvision
)

usage() {
  cat <<USAGE
usage: bash tools/install_deps.sh [--golden] [--list]
  (no option)  install the missing build and test packages
  --golden     also the Python packages (PyTorch, Pillow) that tools/make_golden*.py need
  --list       print the package list (with --golden: including those) and exit
MINIDL_EXTRA_PACKAGES="a b" adds packages to the list for one run.
USAGE
}

packages=("${MINIDL_PACKAGES[@]}")
list_only=0
for arg in "$@"; do
  case "$arg" in
    --golden) packages+=("${MINIDL_GOLDEN_PACKAGES[@]}") ;;
    --list) list_only=1 ;;
    -h | --help) usage; exit 0 ;;
    *) echo "install_deps: unknown option '$arg'" >&2; usage >&2; exit 2 ;;
  esac
done
# Word splitting is wanted here: the variable is a space-separated list of package names.
# shellcheck disable=SC2206
packages+=(${MINIDL_EXTRA_PACKAGES:-})

if [[ $list_only -eq 1 ]]; then
  printf '%s\n' "${packages[@]}"
  exit 0
fi

if ! command -v dpkg-query >/dev/null 2>&1; then
  echo "install_deps: not a Debian-based system (no dpkg-query); install the equivalents of:" >&2
  echo "  ${packages[*]}" >&2
  echo "install_deps: going on; CMake will name anything still missing." >&2
  exit 0
fi

# lizard into .tools/lizard unless it is there; after the Debian packages (pip comes with them).
install_lizard() {
  local root target
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  target=$root/.tools/lizard
  PYTHONPATH=$target python3 -c 'import lizard' 2> /dev/null && return 0
  echo "install_deps: installing $MINIDL_PYPI_LIZARD from PyPI into .tools/lizard" >&2
  python3 -m pip install --quiet --disable-pip-version-check --no-warn-script-location --target "$target" \
    "$MINIDL_PYPI_LIZARD" 2>&1 | grep -v "Running pip as the 'root' user" >&2 || true
  PYTHONPATH=$target python3 -c 'import lizard' 2> /dev/null ||
    { echo "install_deps: could not install $MINIDL_PYPI_LIZARD (python3 -m pip install --target $target)" >&2; return 1; }
}

# cudnn-frontend's headers into .tools/cudnn_frontend unless they are there. The wheel is
# downloaded, never installed (it also holds a Python module built for one Python version).
install_cudnn_frontend() {
  local root target version tmp
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  target=$root/.tools/cudnn_frontend
  version=${MINIDL_PYPI_CUDNN_FRONTEND#*==}
  [[ -f $target/include/cudnn_frontend.h && $(cat "$target/VERSION" 2> /dev/null) == "$version" ]] && return 0
  echo "install_deps: unpacking the headers of $MINIDL_PYPI_CUDNN_FRONTEND (PyPI) into .tools/cudnn_frontend" >&2
  tmp=$(mktemp -d)
  python3 -m pip download --quiet --disable-pip-version-check --no-deps --only-binary=:all: --python-version 3.11 \
    --platform manylinux_2_28_x86_64 --dest "$tmp" "$MINIDL_PYPI_CUDNN_FRONTEND" 2>&1 |
    grep -v "Running pip as the 'root' user" >&2 || true
  rm -rf "$target"
  python3 - "$tmp" "$target" << 'PY' || { rm -rf "$tmp"; echo "install_deps: could not unpack $MINIDL_PYPI_CUDNN_FRONTEND" >&2; return 1; }
import glob, os, sys, zipfile
wheels = glob.glob(os.path.join(sys.argv[1], "*.whl"))
if not wheels:
    sys.exit("no wheel downloaded")
with zipfile.ZipFile(wheels[0]) as z:
    names = [n for n in z.namelist() if n.startswith("include/")]
    z.extractall(sys.argv[2], names)
PY
  echo "$version" > "$target/VERSION"
  rm -rf "$tmp"
}

missing=()
for p in "${packages[@]}"; do
  status=$(dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null || true)
  [[ $status == ii* ]] || missing+=("$p")
done
if [[ ${#missing[@]} -eq 0 ]]; then
  install_lizard
  install_cudnn_frontend
  exit 0
fi

if [[ $(id -u) -ne 0 ]]; then
  echo "install_deps: missing Debian packages: ${missing[*]}" >&2
  echo "install_deps: run this, then the command again:" >&2
  echo "  sudo apt-get update && sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
  exit 1
fi

echo "install_deps: installing missing Debian packages: ${missing[*]}" >&2
apt-get update
DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${missing[@]}"
install_lizard
install_cudnn_frontend
