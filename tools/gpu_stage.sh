#!/usr/bin/env bash
# The build-machine half of a GPU session (what `tools/gpu_check.sh --stage` runs): a GPU machine
# has no Eigen, GoogleTest, Google Benchmark or libjpeg-turbo, and each device call carries at most
# 64 MiB, so everything it runs is built here, portable (-DMINIDL_NATIVE=OFF), and packed to travel:
#
#   build-gpu-stage/    (tests DIR)  stage.tar.xz: the `cuda` test executables (kernels_cuda, optim_cuda,
#                       nn_cuda, e2e_cuda) and minidl_bench_cuda unstripped (memcheck reports name
#                       functions), minidl_bench_step, minidl-maxbatch and
#                       minidl-gpumodel-cuda (the step-time model's calibration) stripped, their non-CUDA
#                       libraries and COMMIT (xz -9: seven static executables of 7-8 MB each, mostly
#                       the same cubins, pack into a few MB) + COMMIT -> tools/gpu_check.sh
#   build-gpu-studies/  studies.tar.xz: minidl-sweep, -train, -maxbatch, -memest stripped + libraries
#                       (xz -9: the photos leave no room for them uncompressed) + COMMIT -> tools/gpu_studies.sh
#   .data/catsdogs/     the photos (copied from ../shared/data/catsdogs; git-ignored, never committed)
#
# Usage: tools/gpu_stage.sh [--tests-dir DIR] [--only PARTS] [--photos SRC]
#   --tests-dir DIR   where the test stage goes (default build-gpu-stage)
#   --only PARTS      comma-separated subset of tests,studies,photos (default: all three)
#   --photos SRC      the photo folder to copy (default ../shared/data/catsdogs beside the repo)
# Environment: GPU_CHECK_JOBS (build jobs, default 2), GPU_STAGE_BUILD (build folder, default build-gpu).
# It ends with the size of what each device call carries, against the 64 MiB limit.
# Exit status: 0 staged, 3 a configure, build or copy failed (the message names the log).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 3

GPU_ENV_PROG=gpu_stage
# shellcheck source=tools/gpu_env.sh
source "$ROOT/tools/gpu_env.sh"   # say, die

TESTS_DIR="build-gpu-stage"
STUDIES_DIR="build-gpu-studies"
PHOTOS_SRC="$ROOT/../shared/data/catsdogs"
PHOTOS_DST=".data/catsdogs"
PARTS="tests,studies,photos"
BUILD="${GPU_STAGE_BUILD:-build-gpu}"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --tests-dir) TESTS_DIR="${2:?--tests-dir needs a folder}"; shift 2 ;;
    --only) PARTS="${2:?--only needs tests, studies and/or photos}"; shift 2 ;;
    --photos) PHOTOS_SRC="${2:?--photos needs a folder}"; shift 2 ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) die 3 "unknown argument '$1' (see --help)" ;;
  esac
done
want() { [[ ",$PARTS," == *",$1,"* ]]; }
for p in ${PARTS//,/ }; do
  [[ "$p" == tests || "$p" == studies || "$p" == photos ]] || die 3 "--only: '$p' is not tests, studies or photos"
done

COMMIT="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
git diff --quiet HEAD 2>/dev/null || COMMIT="$COMMIT+dirty"   # uncommitted changes were built in

# Copies the non-CUDA runtime libraries of the given executables into a lib folder; CUDA, cuBLAS
# and cuDNN come from the GPU machine (its PyTorch wheels or toolkit).
stage_libs() {
  local lib=$1 exe name path
  shift
  for exe in "$@"; do
    ldd "$exe" | awk '/=>/ {print $1, $3}' | while read -r name path; do
      case "$name" in
        libgomp*|libbenchmark*|libgtest*|libgmock*|libturbojpeg*|libjpeg*) cp -L "$path" "$lib/$name" ;;
      esac
    done
  done
}

# ---------------------------------------------------------------- build
targets=()
# The one-call GPU check (tools/gpu_check.sh): the tests, the benchmarks, the step and max-batch
# programs; GPU_STAGE_EXTRA_TARGETS adds more (each lands in bin/, stripped).
TEST_EXES=(kernels_cuda optim_cuda nn_cuda e2e_cuda minidl_bench_cuda)
TOOL_EXES=(minidl_bench_step minidl-maxbatch minidl-gpumodel-cuda ${GPU_STAGE_EXTRA_TARGETS:-})
want tests && targets+=("${TEST_EXES[@]}" "${TOOL_EXES[@]}")
want studies && targets+=(minidl-sweep minidl-train minidl-maxbatch minidl-memest)
if [[ ${#targets[@]} -gt 0 ]]; then
  mkdir -p "$BUILD" || die 3 "cannot create $BUILD"
  # Configured every time: the harness compiles the commit id in at configure time.
  say "configuring a portable CUDA build in $BUILD"
  cmake -S . -B "$BUILD" -DMINIDL_CUDA=ON -DMINIDL_NATIVE=OFF -DCMAKE_BUILD_TYPE=Release >"$BUILD/gpu_stage.configure.log" 2>&1 \
    || die 3 "configure failed; see $BUILD/gpu_stage.configure.log"
  say "building ${targets[*]} (slow on few cores: about 8 minutes from scratch on 2)"
  cmake --build "$BUILD" -j"${GPU_CHECK_JOBS:-2}" --target "${targets[@]}" >"$BUILD/gpu_stage.build.log" 2>&1 \
    || die 3 "build failed; see $BUILD/gpu_stage.build.log"
fi

# ---------------------------------------------------------------- tests stage (one xz tarball)
if want tests; then
  tmp="$(mktemp -d /tmp/gpu_stage.XXXXXX)" || die 3 "mktemp failed"
  mkdir -p "$tmp/bin" "$tmp/lib"
  for t in "${TEST_EXES[@]}"; do
    cp "$BUILD/bin/$t" "$tmp/bin/" || die 3 "$BUILD/bin/$t is missing; see $BUILD/gpu_stage.build.log"
  done
  for t in "${TOOL_EXES[@]}"; do
    strip -o "$tmp/bin/$t" "$BUILD/bin/$t" || die 3 "$BUILD/bin/$t is missing or cannot be stripped; see $BUILD/gpu_stage.build.log"
  done
  stage_libs "$tmp/lib" "$tmp"/bin/*
  echo "$COMMIT" >"$tmp/COMMIT"
  # The model table the GPU calibrates (tools/gpu_phases.sh, phase 4): the last committed
  # lab/results/bench/gpu_model_*.tsv by the commit that added it (a new, uncommitted one counts as
  # the last; --follow looks past their move into lab/): a later commit that edits or moves every
  # table (a09f11e added a header line to each) must not make them all "last" and leave the choice to
  # the names' order, which is how the first GPU run (bbe331e) calibrated the pre-fusion 60d57e3
  # table. The phase measures eager steps, so tables of the graph mode (_graph in their names) are not
  # candidates, nor the older one-layout channels-last tables (_nhwc); a table may hold several
  # configurations (its rows are keyed by configuration, batch and image). MODEL_TSV is the H100's;
  # MODEL_TSV_H200 the H200's (_h200 in the name: minidl-gpumodel --gpu h200), which the phase takes
  # on an H200.
  last_table() {   # $1: h100 or h200
    local f
    for f in lab/results/bench/gpu_model_*.tsv; do
      [[ $f == *_graph* || $f == *_nhwc* ]] && continue
      if [[ $f == *_h200* ]]; then [[ $1 == h200 ]] || continue; else [[ $1 == h100 ]] || continue; fi
      [[ -f $f ]] && echo "$(git log --follow --diff-filter=A -1 --format=%ct -- "$f" 2>/dev/null | grep . || date +%s) $f"
    done | sort -n | tail -1 | cut -d' ' -f2-
  }
  last_table h100 >"$tmp/MODEL_TSV"
  last_table h200 >"$tmp/MODEL_TSV_H200"
  rm -rf "$TESTS_DIR" && mkdir -p "$TESTS_DIR" || die 3 "cannot create $TESTS_DIR"
  say "compressing the check stage (xz -9)"
  tar -C "$tmp" -cf - COMMIT MODEL_TSV MODEL_TSV_H200 bin lib | xz -9 -T2 >"$TESTS_DIR/stage.tar.xz" || die 3 "packing the check stage failed"
  echo "$COMMIT" >"$TESTS_DIR/COMMIT"
  say "check stage: $TESTS_DIR/stage.tar.xz ($(du -sh "$TESTS_DIR/stage.tar.xz" | cut -f1); unpacked $(du -sh "$tmp" | cut -f1)); on the GPU machine: tools/gpu_check.sh $TESTS_DIR"
  rm -rf "$tmp"
fi

# ---------------------------------------------------------------- studies stage (stripped, one xz tarball)
if want studies; then
  tmp="$(mktemp -d /tmp/gpu_stage.XXXXXX)" || die 3 "mktemp failed"
  mkdir -p "$tmp/bin" "$tmp/lib"
  for p in minidl-sweep minidl-train minidl-maxbatch minidl-memest; do
    [[ -x "$BUILD/bin/$p" ]] || die 3 "$BUILD/bin/$p is missing; see $BUILD/gpu_stage.build.log"
    strip -o "$tmp/bin/$p" "$BUILD/bin/$p" || die 3 "strip $p failed"
  done
  stage_libs "$tmp/lib" "$tmp"/bin/*
  echo "$COMMIT" >"$tmp/COMMIT"
  rm -rf "$STUDIES_DIR" && mkdir -p "$STUDIES_DIR" || die 3 "cannot create $STUDIES_DIR"
  say "compressing the studies stage (xz -9)"
  tar -C "$tmp" -cf - COMMIT bin lib | xz -9 -T1 >"$STUDIES_DIR/studies.tar.xz" || die 3 "packing the studies stage failed"
  echo "$COMMIT" >"$STUDIES_DIR/COMMIT"
  say "studies stage: $STUDIES_DIR/studies.tar.xz ($(du -sh "$STUDIES_DIR/studies.tar.xz" | cut -f1); unpacked $(du -sh "$tmp" | cut -f1))"
  # The newest glibc / libstdc++ symbol versions they need: the GPU machine's must be at least these.
  say "needs $(objdump -T "$tmp"/bin/* 2>/dev/null | grep -oE 'GLIBC_[0-9.]+' | sort -uV | tail -1) and $(objdump -T "$tmp"/bin/* 2>/dev/null | grep -oE 'GLIBCXX_[0-9.]+' | sort -uV | tail -1)"
  rm -rf "$tmp"
fi

# ---------------------------------------------------------------- photos
if want photos; then
  [[ -d "$PHOTOS_SRC/cat" && -d "$PHOTOS_SRC/dog" ]] \
    || die 3 "no photos at $PHOTOS_SRC (expected cat/ and dog/ folders of JPEGs); give the folder with --photos DIR"
  src_bytes="$(du -sb "$PHOTOS_SRC/cat" "$PHOTOS_SRC/dog" | awk '{s += $1} END {print s}')"
  dst_bytes="$( (du -sb "$PHOTOS_DST/cat" "$PHOTOS_DST/dog" 2>/dev/null || true) | awk '{s += $1} END {print s + 0}')"
  if [[ "$src_bytes" != "$dst_bytes" ]]; then
    rm -rf "$PHOTOS_DST" && mkdir -p "$PHOTOS_DST/cat" "$PHOTOS_DST/dog" || die 3 "cannot create $PHOTOS_DST"
    for c in cat dog; do
      find "$PHOTOS_SRC/$c" -maxdepth 1 -type f -exec cp -t "$PHOTOS_DST/$c" {} + || die 3 "copying $PHOTOS_SRC/$c failed"
    done
  fi
  git check-ignore -q "$PHOTOS_DST" || die 3 "$PHOTOS_DST is not git-ignored: the photos must never be committed (.gitignore: /.data/)"
  say "photos: $PHOTOS_DST ($(find "$PHOTOS_DST/cat" -type f | wc -l) cat, $(find "$PHOTOS_DST/dog" -type f | wc -l) dog, $(du -sh "$PHOTOS_DST" | cut -f1))"
fi

# ---------------------------------------------------------------- what each call carries
# The device tool sends the tracked and the untracked-not-ignored files, plus the carried paths.
mib() { awk -v b="$1" 'BEGIN {printf "%.1f", b / 1048576}'; }
bytes_of() { if [[ -e "$1" ]]; then du -sb "$1" | cut -f1; else echo 0; fi; }
tree="$(git ls-files -z -co --exclude-standard | xargs -0 stat -c %s 2>/dev/null | awk '{s += $1} END {print s + 0}')"
t_stage="$(bytes_of "$TESTS_DIR")"; s_stage="$(bytes_of "$STUDIES_DIR")"; photos="$(bytes_of "$PHOTOS_DST")"
prev="$(bytes_of .gpu-results)"
call1=$((tree + t_stage)); call2=$((tree + s_stage + photos + prev))
say "carry sizes (limit 64 MiB a call): working tree $(mib "$tree") MiB"
say "  gpu_check call:   [\"$TESTS_DIR\"]  $(mib "$call1") MiB"
say "  studies calls:    [\".data\", \"$STUDIES_DIR\", \".gpu-results\"]  $(mib "$call2") MiB (.gpu-results now $(mib "$prev") MiB)"
(( call1 > 60 * 1048576 || call2 > 60 * 1048576 )) && say "WARNING: a call is within 4 MiB of the 64 MiB limit or over it"
say "staged commit $COMMIT"
exit 0
