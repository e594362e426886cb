#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU: runs the CUDA parity suite (the `cuda` ctest label:
# every *_cuda test executable), runs it again under compute-sanitizer memcheck, runs the short GPU
# benchmarks and writes bench/results/gpu_check_<date>_<commit>.md (GPU, driver, commit, date,
# pass/fail counts, benchmark table). It uses a build made elsewhere when one is there, because a
# GPU machine often lacks the build's dependencies (Eigen, GoogleTest, Google Benchmark), and finds
# the machine's own cuDNN/cuBLAS/cudart (e.g. from its PyTorch install) through LD_LIBRARY_PATH.
#
#   tools/gpu_check.sh --stage [DIR]   on the build machine (no GPU needed): configure a portable
#                                      CUDA build (no -march=native), build the CUDA test and bench
#                                      executables and copy them, their non-CUDA runtime libraries
#                                      and the commit id into DIR (default build-gpu-stage, git-ignored)
#                                      so DIR can be carried to the GPU machine.
#   tools/gpu_check.sh [DIR]           on the GPU machine: check with DIR (default: the first of
#                                      build-gpu-stage, build-gpu, build-cuda that has the executables;
#                                      else it tries to build build-gpu itself).
# Environment: GPU_CHECK_SKIP_SANITIZER=1, GPU_CHECK_SKIP_BENCH=1, GPU_CHECK_BENCH_FILTER (regex),
# GPU_CHECK_SANITIZER_FILTER (gtest filter), GPU_CHECK_TEST_TIMEOUT / _SANITIZER_TIMEOUT /
# _BENCH_TIMEOUT (seconds). When $OUT is set (the device tool), the report and logs are copied there.
# Exit status: 0 all passed, 1 a test or sanitizer failure, 2 no usable GPU, 3 setup problem.
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 3

say() { printf 'gpu_check: %s\n' "$*"; }
die() { local code=$1; shift; printf 'gpu_check: %s\n' "$*" >&2; exit "$code"; }

# ---------------------------------------------------------------- stage (build machine)
if [[ "${1:-}" == "--stage" ]]; then
  STAGE="${2:-build-gpu-stage}"
  BUILD="build-gpu"
  mkdir -p "$BUILD" || die 3 "cannot create $BUILD"
  say "configuring a portable CUDA build in $BUILD"
  cmake -S . -B "$BUILD" -DMINIDL_CUDA=ON -DMINIDL_NATIVE=OFF -DCMAKE_BUILD_TYPE=Release >"$BUILD/gpu_check.configure.log" 2>&1 \
    || die 3 "configure failed; see $BUILD/gpu_check.configure.log"
  say "building kernels_cuda and minidl_bench_cuda (slow on few cores)"
  cmake --build "$BUILD" -j"${GPU_CHECK_JOBS:-2}" --target kernels_cuda minidl_bench_cuda >"$BUILD/gpu_check.build.log" 2>&1 \
    || die 3 "build failed; see $BUILD/gpu_check.build.log"
  rm -rf "$STAGE" && mkdir -p "$STAGE/bin" "$STAGE/lib" || die 3 "cannot create $STAGE"
  for f in "$BUILD"/bin/*_cuda "$BUILD"/bin/minidl_bench_cuda; do [[ -x "$f" ]] && cp "$f" "$STAGE/bin/"; done
  # Runtime libraries a PyTorch image may lack; CUDA, cuBLAS and cuDNN come from the GPU machine.
  for exe in "$STAGE"/bin/*; do
    ldd "$exe" | awk '/=>/ {print $1, $3}' | while read -r name path; do
      case "$name" in
        libgomp*|libbenchmark*|libgtest*|libgmock*|libturbojpeg*|libjpeg*) cp -L "$path" "$STAGE/lib/$name" ;;
      esac
    done
  done
  id="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  git diff --quiet HEAD 2>/dev/null || id="$id+dirty"   # uncommitted changes were built in
  echo "$id" >"$STAGE/COMMIT"
  du -sh "$STAGE"
  say "staged into $STAGE (commit $(head -1 "$STAGE/COMMIT")); carry it and run: tools/gpu_check.sh $STAGE"
  exit 0
fi

# ---------------------------------------------------------------- the GPU
if ! command -v nvidia-smi >/dev/null 2>&1; then
  die 2 "no NVIDIA GPU present: nvidia-smi is not installed on this machine. Run this on a GPU machine (the CPU suite: ctest -L cpu)."
fi
GPU_INFO="$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | head -1)"
if [[ -z "$GPU_INFO" ]] || ! nvidia-smi -L >/dev/null 2>&1; then
  die 2 "no NVIDIA GPU present: nvidia-smi failed (${GPU_INFO:-no output})."
fi
GPU_NAME="$(echo "$GPU_INFO" | cut -d, -f1 | xargs)"
DRIVER="$(echo "$GPU_INFO" | cut -d, -f2 | xargs)"
GPU_MEM="$(echo "$GPU_INFO" | cut -d, -f3 | xargs)"
say "GPU: $GPU_NAME, driver $DRIVER, $GPU_MEM"

# ---------------------------------------------------------------- the executables
DIR="${1:-}"
if [[ -z "$DIR" ]]; then
  for d in build-gpu-stage build-gpu build-cuda; do
    if [[ -x "$d/bin/kernels_cuda" ]]; then DIR="$d"; break; fi
  done
fi
if [[ -z "$DIR" ]]; then
  say "no staged or built CUDA executables found; trying to build build-gpu here"
  mkdir -p build-gpu
  if command -v cmake >/dev/null && cmake -S . -B build-gpu -DMINIDL_CUDA=ON -DMINIDL_NATIVE=OFF >build-gpu/gpu_check.configure.log 2>&1 \
     && cmake --build build-gpu -j"$(nproc)" --target kernels_cuda minidl_bench_cuda >build-gpu/gpu_check.build.log 2>&1; then
    DIR=build-gpu
  else
    die 3 "could not build here (see build-gpu/gpu_check.configure.log and gpu_check.build.log: the GPU machine may lack Eigen, GoogleTest or Google Benchmark). Stage a build on the build machine with 'tools/gpu_check.sh --stage' and carry build-gpu-stage."
  fi
fi
[[ -x "$DIR/bin/kernels_cuda" ]] || die 3 "$DIR/bin/kernels_cuda not found"
DIR="$(cd "$DIR" && pwd)"
COMMIT="$(head -1 "$DIR/COMMIT" 2>/dev/null || true)"
[[ -n "$COMMIT" ]] || COMMIT="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
say "executables from $DIR (commit $COMMIT)"

# ---------------------------------------------------------------- libraries
# The machine's cuDNN/cuBLAS/cudart: PyTorch's pip wheels keep them under site-packages/nvidia/*
# (or nvidia/cu13/lib) and torch/lib; the toolkit under /usr/local/cuda*/lib64.
LIBDIRS=("$DIR/lib")
if command -v python3 >/dev/null; then
  while IFS= read -r d; do [[ -n "$d" ]] && LIBDIRS+=("$d"); done < <(python3 - <<'PY' 2>/dev/null
import glob, os, site, sys
roots = set(site.getsitepackages() + [site.getusersitepackages()])
try:
    import torch
    roots.add(os.path.dirname(os.path.dirname(torch.__file__)))
except Exception:
    pass
seen = []
for r in roots:
    for pat in ("nvidia/*/lib", "nvidia/*/*/lib", "torch/lib"):
        for d in glob.glob(os.path.join(r, pat)):
            if glob.glob(os.path.join(d, "lib*.so*")) and d not in seen:
                seen.append(d)
print("\n".join(seen))
PY
)
fi
for d in /usr/local/cuda/lib64 /usr/local/cuda/lib /usr/local/cuda-*/lib64 /usr/lib/x86_64-linux-gnu; do
  [[ -d "$d" ]] && LIBDIRS+=("$d")
done
LD_LIBRARY_PATH="$(IFS=:; echo "${LIBDIRS[*]}")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export LD_LIBRARY_PATH
MISSING="$(for e in "$DIR"/bin/*; do ldd "$e" 2>/dev/null | grep 'not found'; done | sort -u)"
if [[ -n "$MISSING" ]]; then
  die 3 "libraries not found with LD_LIBRARY_PATH=$LD_LIBRARY_PATH:
$MISSING
(cuDNN 9 / cuBLAS 13 / cudart 13 are expected from the machine's PyTorch or CUDA toolkit; the others from $DIR/lib, made by --stage)"
fi
for l in libcudnn.so.9 libcublas.so.13 libcudart.so.13; do
  say "$l -> $(ldd "$DIR/bin/kernels_cuda" | awk -v l="$l" '$1 == l {print $3}')"
done

LOGDIR="$(mktemp -d /tmp/gpu_check.XXXXXX)"
STATUS=0

# ---------------------------------------------------------------- tests (ctest -L cuda)
TESTS_MD=""
TOTAL_PASS=0; TOTAL_FAIL=0; TOTAL_SKIP=0
CTEST_MD="not run: the build tree is not native to this machine (staged or carried), so the cuda executables run directly below"
if [[ -f "$DIR/CTestTestfile.cmake" ]] && grep -q "$DIR" "$DIR/CTestTestfile.cmake" && command -v ctest >/dev/null; then
  say "ctest -L cuda in $DIR"
  (cd "$DIR" && timeout "${GPU_CHECK_TEST_TIMEOUT:-420}" ctest -L cuda --output-on-failure) >"$LOGDIR/ctest.log" 2>&1
  rc=$?
  CTEST_MD="$(grep -E 'tests passed|tests failed' "$LOGDIR/ctest.log" | tail -1) (exit $rc)"
  [[ $rc -ne 0 ]] && STATUS=1
  say "ctest: $CTEST_MD"
fi
for exe in "$DIR"/bin/*_cuda; do
  [[ "$(basename "$exe")" == minidl_bench_cuda ]] && continue
  name="$(basename "$exe")"
  say "running $name"
  timeout "${GPU_CHECK_TEST_TIMEOUT:-420}" "$exe" --gtest_color=no >"$LOGDIR/$name.log" 2>&1
  rc=$?
  pass="$(grep -oE '^\[  PASSED  \] [0-9]+' "$LOGDIR/$name.log" | grep -oE '[0-9]+$' || echo 0)"
  fail="$(grep -cE '^\[  FAILED  \] [A-Za-z_]+\.' "$LOGDIR/$name.log" || true)"
  skip="$(grep -oE '^\[  SKIPPED \] [0-9]+' "$LOGDIR/$name.log" | grep -oE '[0-9]+$' || echo 0)"
  pass=${pass:-0}; fail=${fail:-0}; skip=${skip:-0}
  if grep -q "no CUDA device" "$LOGDIR/$name.log" && [[ "$pass" -le 1 ]]; then
    tail -5 "$LOGDIR/$name.log"
    die 2 "nvidia-smi sees a GPU but minidl does not (its CUDA cases skipped: see $LOGDIR/$name.log); check the driver/runtime versions"
  fi
  [[ $rc -eq 124 ]] && say "$name timed out" && fail=$((fail + 1))
  [[ $rc -ne 0 ]] && STATUS=1
  TOTAL_PASS=$((TOTAL_PASS + pass)); TOTAL_FAIL=$((TOTAL_FAIL + fail)); TOTAL_SKIP=$((TOTAL_SKIP + skip))
  TESTS_MD+="| $name | $pass | $fail | $skip | $rc |"$'\n'
  grep -E '^\[  FAILED  \]|Failure|error' "$LOGDIR/$name.log" | head -40
done
say "tests: $TOTAL_PASS passed, $TOTAL_FAIL failed, $TOTAL_SKIP skipped"

# ---------------------------------------------------------------- compute-sanitizer memcheck
SAN_MD="skipped (GPU_CHECK_SKIP_SANITIZER=1)"
if [[ "${GPU_CHECK_SKIP_SANITIZER:-0}" != 1 ]]; then
  SAN="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda*/bin/compute-sanitizer /opt/nvidia/*/compute-sanitizer 2>/dev/null | head -1)"
  if [[ -z "$SAN" ]]; then
    SAN_MD="not run: compute-sanitizer not found (PATH, /usr/local/cuda*/bin)"
    say "$SAN_MD"
  else
    # cuDNN autotuning under memcheck takes minutes; the autotune cases are left to the plain run.
    FILTER="${GPU_CHECK_SANITIZER_FILTER:-*-Parity.Conv2dAutotuneNhwcAndTf32:Parity.AutotuneWorkspaceStaysInsideTheBudget}"
    say "compute-sanitizer memcheck on kernels_cuda ($FILTER)"
    timeout "${GPU_CHECK_SANITIZER_TIMEOUT:-300}" "$SAN" --tool memcheck --leak-check no --error-exitcode 99 \
      "$DIR/bin/kernels_cuda" --gtest_color=no --gtest_filter="$FILTER" >"$LOGDIR/sanitizer.log" 2>&1
    rc=$?
    errs="$(grep -oE 'ERROR SUMMARY: [0-9]+' "$LOGDIR/sanitizer.log" | tail -1)"
    case $rc in
      0) SAN_MD="clean (${errs:-no summary}), filter \`$FILTER\`" ;;
      124) SAN_MD="timed out after ${GPU_CHECK_SANITIZER_TIMEOUT:-300} s (${errs:-no summary})"; STATUS=1 ;;
      99) SAN_MD="memcheck errors: ${errs}"; STATUS=1; grep -m 20 -E '=========' "$LOGDIR/sanitizer.log" ;;
      *) SAN_MD="exit $rc (${errs:-no summary}); test failures under the sanitizer"; STATUS=1 ;;
    esac
    say "sanitizer: $SAN_MD"
  fi
fi

# ---------------------------------------------------------------- benchmarks
BENCH_MD="skipped"
if [[ "${GPU_CHECK_SKIP_BENCH:-0}" != 1 && -x "$DIR/bin/minidl_bench_cuda" ]]; then
  say "benchmarks"
  timeout "${GPU_CHECK_BENCH_TIMEOUT:-360}" "$DIR/bin/minidl_bench_cuda" --benchmark_filter="${GPU_CHECK_BENCH_FILTER:-.}" \
    --benchmark_out="$LOGDIR/bench.json" --benchmark_out_format=json >"$LOGDIR/bench.log" 2>&1
  rc=$?
  if [[ $rc -ne 0 ]]; then say "benchmarks exited $rc (see bench.log)"; tail -5 "$LOGDIR/bench.log"; STATUS=1; fi
  if [[ -s "$LOGDIR/bench.json" ]] && command -v python3 >/dev/null; then
    BENCH_MD="$(python3 - "$LOGDIR/bench.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
rows = ["| benchmark | time (ms) | GB/s | vs D2D copy | TFLOP/s | img/s |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
for b in d.get("benchmarks", []):
    if b.get("run_type") == "aggregate":
        continue
    t = b.get("real_time", 0) * {"ns": 1e-6, "us": 1e-3, "ms": 1, "s": 1e3}[b.get("time_unit", "ns")]
    f = lambda k, fmt: (fmt % b[k]) if k in b else ""
    rows.append(f"| {b['name']} | {t:.3f} | {f('GB/s', '%.0f')} | {f('vs_copy', '%.2f')} | {f('TFLOP/s', '%.1f')} | {f('img/s', '%.0f')} |")
print("\n".join(rows))
PY
)"
  else
    BENCH_MD="no results (exit $rc); see bench.log"
  fi
fi

# ---------------------------------------------------------------- report
DATE="$(date -u +%Y-%m-%d)"
mkdir -p bench/results
REPORT="bench/results/gpu_check_${DATE}_${COMMIT%% *}.md"
{
  echo "# GPU check, $DATE"
  echo
  echo "- command: \`tools/gpu_check.sh $*\`"
  echo "- commit: $COMMIT (executables from \`$(basename "$DIR")\`)"
  echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "- GPU: $GPU_NAME, driver $DRIVER, $GPU_MEM"
  echo "- host: $(uname -m), $(nproc) cores"
  echo "- cuDNN: $(ldd "$DIR/bin/kernels_cuda" | awk '$1 == "libcudnn.so.9" {print $3}'), cuBLAS: $(ldd "$DIR/bin/kernels_cuda" | awk '$1 == "libcublas.so.13" {print $3}')"
  echo
  echo "## Tests (the \`cuda\` label: every *_cuda executable)"
  echo
  echo "$TOTAL_PASS passed, $TOTAL_FAIL failed, $TOTAL_SKIP skipped. ctest -L cuda: $CTEST_MD."
  echo
  echo "| executable | passed | failed | skipped | exit |"
  echo "| --- | ---: | ---: | ---: | ---: |"
  printf '%s' "$TESTS_MD"
  if [[ $TOTAL_FAIL -gt 0 ]]; then
    echo
    echo '```'
    grep -hE '^\[  FAILED  \]|Failure$|normalised error|Error|error:' "$LOGDIR"/*_cuda.log | head -60
    echo '```'
  fi
  echo
  echo "## compute-sanitizer memcheck"
  echo
  echo "$SAN_MD"
  echo
  echo "## Benchmarks (CUDA events, after warm-up; GB/s counts bytes read + written)"
  echo
  echo "$BENCH_MD"
} >"$REPORT"
say "report: $REPORT"
if [[ -n "${OUT:-}" && -d "${OUT:-}" ]]; then
  cp "$REPORT" "$OUT/" 2>/dev/null
  cp "$LOGDIR"/kernels_cuda.log "$LOGDIR"/sanitizer.log "$LOGDIR"/bench.json "$LOGDIR"/bench.log "$OUT/" 2>/dev/null
fi
say "logs: $LOGDIR"
exit $STATUS
