#!/usr/bin/env bash
# One command for a machine with an NVIDIA GPU: runs the CUDA parity suite (the `cuda` ctest label:
# every *_cuda test executable), runs it again under compute-sanitizer memcheck, runs the short GPU
# benchmarks and writes bench/results/gpu_check_<date>_<commit>.md (GPU, driver, commit, date,
# pass/fail counts, benchmark table). A device call lasts at most 600 s, so the whole check runs
# under one deadline that budgets the phases, and the report is rewritten (and copied to $OUT)
# after every phase: a run cut short still returns what it measured. It uses a build made
# elsewhere (a GPU machine often lacks Eigen, GoogleTest, Google Benchmark) and finds the
# machine's cuDNN/cuBLAS/cudart (e.g. inside its PyTorch wheels) through tools/gpu_env.sh.
#
#   tools/gpu_check.sh --stage [DIR]   on the build machine (no GPU needed): tools/gpu_stage.sh,
#                                      which builds and stages the test executables into DIR (default
#                                      build-gpu-stage), the experiment programs into build-gpu-studies
#                                      and the photos into .data/catsdogs, and prints each call's carry size.
#   tools/gpu_check.sh [--rehearse] [DIR]
#                                      on the GPU machine: check with DIR (default: the first of
#                                      build-gpu-stage, build-gpu, build-cuda that has the executables;
#                                      else it tries to build build-gpu itself, inside the deadline).
#   --rehearse                         on a machine without a GPU: the same plumbing with the parity
#                                      suite run CPU against CPU (MINIDL_PARITY_SELF_TEST=1); the
#                                      sanitizer and benchmarks then fail or skip, which is expected.
# Environment:
#   GPU_CHECK_DEADLINE (seconds, default 540; 90 with --rehearse): everything, report included, ends
#     by then. Phases get at most: tests GPU_CHECK_TEST_TIMEOUT (default 420) and never the last
#     30% + 25% of the deadline while the sanitizer / benchmarks still have to run; sanitizer
#     GPU_CHECK_SANITIZER_TIMEOUT (300) and never the last 25%; benchmarks GPU_CHECK_BENCH_TIMEOUT
#     (360) or what is left. Time a phase does not use goes to the next.
#   GPU_CHECK_SKIP_SANITIZER=1, GPU_CHECK_SKIP_BENCH=1: skip a phase (its share goes to the others).
#   The step-time model's calibration (between the sanitizer and the benchmarks): minidl-gpumodel-cuda
#     times every launch of the modelled step and prints it beside the newest
#     bench/results/gpu_model_*.tsv; GPU_CHECK_MODEL_TIMEOUT (default 90, at most 15% of the
#     deadline), GPU_CHECK_MODEL_CONFIGS (default resnet50-amp), GPU_CHECK_SKIP_MODEL=1.
#   GPU_CHECK_BENCH_FILTER (regex, default .), GPU_CHECK_SANITIZER_FILTER (gtest filter for
#     kernels_cuda under memcheck; default: all but the two cuDNN autotune cases).
#   OUT (set by the device tool): the report and gpu_check_logs.tar.gz (every log) are copied there,
#     after every phase and on SIGTERM (which also stops the running program).
# Exit status: 0 all passed, 1 a test, sanitizer or benchmark failure, 2 no usable GPU, 3 setup
# problem, 4 nothing failed but the deadline cut a phase short (the report says which).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 3
GPU_ENV_PROG=gpu_check
# shellcheck source=tools/gpu_env.sh
source "$ROOT/tools/gpu_env.sh"

if [[ "${1:-}" == "--stage" ]]; then
  exec bash "$ROOT/tools/gpu_stage.sh" --tests-dir "${2:-build-gpu-stage}"
fi
REHEARSE=0
ARGS="$*"
if [[ "${1:-}" == "--rehearse" ]]; then REHEARSE=1; shift; fi
DEADLINE="${GPU_CHECK_DEADLINE:-$([[ $REHEARSE == 1 ]] && echo 90 || echo 540)}"
START=$SECONDS
left() { echo $((DEADLINE - (SECONDS - START))); }
# SIGTERM (the device tool's own limit): stop the running step, write the report, exit 4.
# shellcheck disable=SC2317  # reached through the trap
on_term() {
  trap '' TERM
  gpu_env_stop_child 5
  [[ ${REPORT_READY:-0} == 1 ]] && write_report "stopped by SIGTERM at $((SECONDS - START)) s" && say "report: $REPORT"
  die 4 "stopped by SIGTERM after $((SECONDS - START)) s"
}
trap on_term TERM

gpu_env_detect_gpu || exit 2
say "GPU: $GPU_LINE; deadline ${DEADLINE} s"

# ---------------------------------------------------------------- the executables
DIR="${1:-}"
if [[ -z "$DIR" ]]; then
  for d in build-gpu-stage build-gpu build-cuda; do
    if [[ -x "$d/bin/kernels_cuda" ]]; then DIR="$d"; break; fi
  done
fi
if [[ -z "$DIR" ]]; then
  say "no staged or built CUDA executables found; trying to build build-gpu here (inside the deadline)"
  mkdir -p build-gpu
  if command -v cmake >/dev/null && cmake -S . -B build-gpu -DMINIDL_CUDA=ON -DMINIDL_NATIVE=OFF >build-gpu/gpu_check.configure.log 2>&1 \
     && gpu_env_run_until TERM "$(($(left) - 60))" 10 build-gpu/gpu_check.build.log \
          cmake --build build-gpu -j"$(nproc)" --target kernels_cuda optim_cuda minidl_bench_cuda; then
    DIR=build-gpu
  else
    die 3 "could not build here (see build-gpu/gpu_check.configure.log and gpu_check.build.log: the GPU machine may lack Eigen, GoogleTest or Google Benchmark). Stage a build on the build machine with 'tools/gpu_check.sh --stage' and carry build-gpu-stage."
  fi
fi
[[ -x "$DIR/bin/kernels_cuda" ]] || die 3 "$DIR/bin/kernels_cuda not found; stage it with 'tools/gpu_check.sh --stage' and carry $DIR"
DIR="$(cd "$DIR" && pwd)"
COMMIT="$(head -1 "$DIR/COMMIT" 2>/dev/null || true)"
[[ -n "$COMMIT" ]] || COMMIT="$(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
say "executables from $DIR (commit $COMMIT)"

# ---------------------------------------------------------------- libraries
gpu_env_lib_path "$DIR/lib"
MISSING="$(gpu_env_missing_libs "$DIR"/bin/*)"
if [[ -n "$MISSING" ]]; then
  die 3 "libraries not found with LD_LIBRARY_PATH=$LD_LIBRARY_PATH:
$MISSING
(cuDNN 9 / cuBLAS 13 / cudart 13 are expected from the machine's PyTorch or CUDA toolkit; the others from $DIR/lib, made by --stage)"
fi
CUDA_LIBS="$(gpu_env_cuda_libs "$DIR/bin/kernels_cuda")"
say "$CUDA_LIBS"
[[ $REHEARSE == 1 ]] && export MINIDL_PARITY_SELF_TEST=1

LOGDIR="$(mktemp -d /tmp/gpu_check.XXXXXX)"
DATE="$(date -u +%Y-%m-%d)"
mkdir -p bench/results
REPORT="bench/results/gpu_check_${DATE}_${COMMIT%% *}$([[ $REHEARSE == 1 ]] && echo _rehearsal).md"
STATUS=0   # 1 once something failed
CUT=""     # the phases the deadline cut short

SAN_ON=1; [[ "${GPU_CHECK_SKIP_SANITIZER:-0}" == 1 ]] && SAN_ON=0
BENCH_ON=1; [[ "${GPU_CHECK_SKIP_BENCH:-0}" == 1 || ! -x "$DIR/bin/minidl_bench_cuda" ]] && BENCH_ON=0
SAN_SHARE=$((SAN_ON * DEADLINE * 30 / 100)); BENCH_SHARE=$((BENCH_ON * DEADLINE * 25 / 100))
# The step-time model's calibration (docs/cuda.md, "The step-time model"), before the benchmarks.
MODEL_ON=1; [[ "${GPU_CHECK_SKIP_MODEL:-0}" == 1 || ! -x "$DIR/bin/minidl-gpumodel-cuda" ]] && MODEL_ON=0
MODEL_SHARE=$((MODEL_ON * $(gpu_env_min "${GPU_CHECK_MODEL_TIMEOUT:-90}" $((DEADLINE * 15 / 100)))))
MODEL_MD="not run yet"; [[ $MODEL_ON == 0 ]] && MODEL_MD="skipped (GPU_CHECK_SKIP_MODEL=1 or no minidl-gpumodel-cuda)"
REPORT_RESERVE=10

TESTS_STATE="not run yet"; TESTS_MD=""; TOTAL_PASS=0; TOTAL_FAIL=0; TOTAL_SKIP=0
SAN_MD="not run yet"; [[ $SAN_ON == 0 ]] && SAN_MD="skipped (GPU_CHECK_SKIP_SANITIZER=1)"
BENCH_MD="not run yet"; [[ $BENCH_ON == 0 ]] && BENCH_MD="skipped (GPU_CHECK_SKIP_BENCH=1 or no minidl_bench_cuda)"

# Rewritten after every phase, so a run stopped at any point has a report.
write_report() {
  {
    echo "# GPU check, $DATE"
    echo
    [[ $REHEARSE == 1 ]] && echo "**CPU rehearsal (--rehearse): no GPU was used; these are not GPU results.**" && echo
    echo "- command: \`tools/gpu_check.sh $ARGS\` (deadline ${DEADLINE} s; report written at $((SECONDS - START)) s: $1)"
    echo "- commit: $COMMIT (executables from \`$(basename "$DIR")\`)"
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    gpu_env_machine_md
    echo "- libraries: $CUDA_LIBS"
    echo
    echo "## Tests (the \`cuda\` label: every *_cuda executable)"
    echo
    echo "$TOTAL_PASS passed, $TOTAL_FAIL failed, $TOTAL_SKIP skipped ($TESTS_STATE)."
    if [[ -n "$TESTS_MD" ]]; then
      echo
      echo "| executable | passed | failed | skipped | exit | seconds |"
      echo "| --- | ---: | ---: | ---: | ---: | ---: |"
      printf '%s' "$TESTS_MD"
    fi
    if [[ $TOTAL_FAIL -gt 0 ]]; then
      echo
      echo '```'
      grep -hE '^\[  FAILED  \].*\([0-9]+ ms\)$|Failure$|normalised error|Error|error:' "$LOGDIR"/*_cuda.log 2>/dev/null | head -60
      echo '```'
    fi
    echo
    echo "## compute-sanitizer memcheck"
    echo
    echo "$SAN_MD"
    echo
    echo "## The step-time model against this GPU (per kernel: modelled, then measured with CUDA events)"
    echo
    echo "$MODEL_MD"
    echo
    echo "## Benchmarks (CUDA events, after warm-up; GB/s counts bytes read + written)"
    echo
    echo "$BENCH_MD"
  } >"$REPORT"
  if [[ -n "${OUT:-}" && -d "${OUT:-}" ]]; then
    cp "$REPORT" "$OUT/$(basename "$REPORT" | tr -c 'A-Za-z0-9._\n-' '-')" 2>/dev/null
    tar -C "$LOGDIR" -czf "$OUT/gpu_check_logs.tar.gz" . 2>/dev/null
  fi
}
write_report "starting"
REPORT_READY=1

# ---------------------------------------------------------------- tests
# Counted from the per-test lines, so a run cut by its timeout still counts what it finished.
count() { grep -cE "$1" "$2" 2>/dev/null || true; }
EXES=()
for exe in "$DIR"/bin/*_cuda; do [[ "$(basename "$exe")" != minidl_bench_cuda ]] && EXES+=("$exe"); done
TESTS_END=$((SECONDS + $(gpu_env_min "${GPU_CHECK_TEST_TIMEOUT:-420}" $(($(left) - REPORT_RESERVE - SAN_SHARE - MODEL_SHARE - BENCH_SHARE)))))
TESTS_STATE="running"
for i in "${!EXES[@]}"; do
  exe="${EXES[$i]}"; name="$(basename "$exe")"
  later=$(( ${#EXES[@]} - i - 1 ))
  # Leave each later executable 20 s at least, or its even share when less is left.
  budget=$(( TESTS_END - SECONDS - 20 * later ))
  (( budget < (TESTS_END - SECONDS) / (later + 1) )) && budget=$(( (TESTS_END - SECONDS) / (later + 1) ))
  say "running $name (at most ${budget} s)"
  t0=$SECONDS
  gpu_env_run_until TERM "$budget" 10 "$LOGDIR/$name.log" "$exe" --gtest_color=no
  rc=$?
  pass="$(count '^\[       OK \]' "$LOGDIR/$name.log")"
  fail="$(count '^\[  FAILED  \] .*\([0-9]+ ms\)$' "$LOGDIR/$name.log")"
  skip="$(count '^\[  SKIPPED \] .*\([0-9]+ ms\)$' "$LOGDIR/$name.log")"
  if [[ $REHEARSE == 0 ]] && grep -q "no CUDA device" "$LOGDIR/$name.log" && [[ "$pass" -le 1 ]]; then
    tail -5 "$LOGDIR/$name.log"
    TESTS_STATE="stopped: nvidia-smi sees a GPU but minidl does not"
    write_report "$TESTS_STATE"
    die 2 "nvidia-smi sees a GPU but minidl does not (its CUDA cases skipped: see $name.log); check the driver/runtime versions"
  fi
  note=$rc
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    if (( budget > 0 )); then note="$rc (cut at ${budget} s by the deadline)"; else note="not run: no time left"; fi
    [[ "$CUT" == *tests* ]] || CUT+=" tests"
    say "$name: $note"
    # the test that was running when it was cut
    grep -E '^\[ RUN      \]' "$LOGDIR/$name.log" | tail -1
  elif [[ $rc -ne 0 ]]; then
    STATUS=1
  fi
  TOTAL_PASS=$((TOTAL_PASS + pass)); TOTAL_FAIL=$((TOTAL_FAIL + fail)); TOTAL_SKIP=$((TOTAL_SKIP + skip))
  TESTS_MD+="| $name | $pass | $fail | $skip | $note | $((SECONDS - t0)) |"$'\n'
  grep -E '^\[  FAILED  \].*\([0-9]+ ms\)$|Failure$' "$LOGDIR/$name.log" | head -40
done
[[ $TOTAL_FAIL -gt 0 ]] && STATUS=1
TESTS_STATE="$([[ "$CUT" == *tests* ]] && echo "cut by the deadline" || echo "complete")"
say "tests: $TOTAL_PASS passed, $TOTAL_FAIL failed, $TOTAL_SKIP skipped ($TESTS_STATE)"
write_report "after the tests"

# ---------------------------------------------------------------- compute-sanitizer memcheck
if [[ $SAN_ON == 1 ]]; then
  SAN="$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda*/bin/compute-sanitizer /opt/nvidia/*/compute-sanitizer 2>/dev/null | head -1)"
  if [[ -z "$SAN" ]]; then
    SAN_MD="not run: compute-sanitizer not found (PATH, /usr/local/cuda*/bin)"
    say "$SAN_MD"
  else
    SAN_END=$((START + DEADLINE - REPORT_RESERVE - MODEL_SHARE - BENCH_SHARE))
    # cuDNN autotuning under memcheck takes minutes; the autotune cases are left to the plain run.
    FILTER="${GPU_CHECK_SANITIZER_FILTER:-*-Parity.Conv2dAutotuneNhwcAndTf32:Parity.AutotuneWorkspaceStaysInsideTheBudget}"
    budget=$(gpu_env_min "${GPU_CHECK_SANITIZER_TIMEOUT:-300}" $((SAN_END - SECONDS)))
    say "compute-sanitizer memcheck on kernels_cuda ($FILTER), at most ${budget} s"
    t0=$SECONDS
    gpu_env_run_until TERM "$budget" 10 "$LOGDIR/sanitizer.log" \
      "$SAN" --tool memcheck --leak-check no --error-exitcode 99 "$DIR/bin/kernels_cuda" --gtest_color=no --gtest_filter="$FILTER"
    rc=$?
    # The fused optimizer kernels live in optim_cuda; check them too (a failure there wins if the first was clean).
    if [[ $rc -eq 0 && -x "$DIR/bin/optim_cuda" ]]; then
      budget=$(gpu_env_min $(("${GPU_CHECK_SANITIZER_TIMEOUT:-300}" - (SECONDS - t0))) $((SAN_END - SECONDS)))
      say "compute-sanitizer memcheck on optim_cuda, at most ${budget} s"
      gpu_env_run_until TERM "$budget" 10 "$LOGDIR/sanitizer_optim.log" \
        "$SAN" --tool memcheck --leak-check no --error-exitcode 99 "$DIR/bin/optim_cuda" --gtest_color=no
      rc=$?
      cat "$LOGDIR/sanitizer_optim.log" >>"$LOGDIR/sanitizer.log"
    fi
    errs="$(grep -oE 'ERROR SUMMARY: [0-9]+' "$LOGDIR/sanitizer.log" | tail -1)"
    tests="$(count '^\[       OK \]' "$LOGDIR/sanitizer.log") tests passed under memcheck"
    case $rc in
      0) SAN_MD="clean (${errs:-no summary}; $tests), filter \`$FILTER\`" ;;
      124|137) SAN_MD="cut by the deadline after $((SECONDS - t0)) s (${errs:-no summary so far}; $tests; last: $(grep -E '^\[ RUN      \]' "$LOGDIR/sanitizer.log" | tail -1))"
               CUT+=" sanitizer"; grep -q 'ERROR SUMMARY: [1-9]' "$LOGDIR/sanitizer.log" && STATUS=1 ;;
      99) SAN_MD="memcheck errors: ${errs}"; STATUS=1; grep -m 20 -E '=========' "$LOGDIR/sanitizer.log" ;;
      *) SAN_MD="exit $rc (${errs:-no summary}; $tests); test failures under the sanitizer"; STATUS=1 ;;
    esac
    say "sanitizer: $SAN_MD"
  fi
  write_report "after the sanitizer"
fi

# ---------------------------------------------------------------- the step-time model, calibrated
if [[ $MODEL_ON == 1 ]]; then
  TSV="$(find bench/results -maxdepth 1 -name 'gpu_model_*.tsv' 2>/dev/null | sort | tail -1)"
  budget=$(gpu_env_min "${GPU_CHECK_MODEL_TIMEOUT:-90}" $(($(left) - REPORT_RESERVE - BENCH_SHARE)))
  say "the step-time model against this GPU (${GPU_CHECK_MODEL_CONFIGS:-resnet50-amp}, modelled: ${TSV:-none}), at most ${budget} s"
  t0=$SECONDS
  gpu_env_run_until TERM "$budget" 10 "$LOGDIR/model.log" "$DIR/bin/minidl-gpumodel-cuda" --measure \
    --configs "${GPU_CHECK_MODEL_CONFIGS:-resnet50-amp}" ${TSV:+--modelled "$TSV"} --out "$LOGDIR/model.md"
  rc=$?
  case $rc in
    0) MODEL_MD="modelled: \`${TSV:-none}\`"$'\n\n'"$(cat "$LOGDIR/model.md")" ;;
    124|137) MODEL_MD="cut by the deadline after $((SECONDS - t0)) s: $(tail -2 "$LOGDIR/model.log" | tr '\n' ' ')"; CUT+=" model" ;;
    *) MODEL_MD="exit $rc: $(tail -3 "$LOGDIR/model.log" | tr '\n' ' ')"; STATUS=1 ;;
  esac
  say "model: exit $rc after $((SECONDS - t0)) s"
  write_report "after the model calibration"
fi

# ---------------------------------------------------------------- benchmarks
if [[ $BENCH_ON == 1 ]]; then
  budget=$(gpu_env_min "${GPU_CHECK_BENCH_TIMEOUT:-360}" $(($(left) - REPORT_RESERVE)))
  say "benchmarks, at most ${budget} s"
  gpu_env_run_until TERM "$budget" 10 "$LOGDIR/bench.log" "$DIR/bin/minidl_bench_cuda" \
    --benchmark_filter="${GPU_CHECK_BENCH_FILTER:-.}" --benchmark_out="$LOGDIR/bench.json" --benchmark_out_format=json
  rc=$?
  if [[ $rc -eq 124 || $rc -eq 137 ]]; then
    CUT+=" benchmarks"; say "benchmarks cut by the deadline after ${budget} s"
  elif [[ $rc -ne 0 ]]; then
    say "benchmarks exited $rc (see bench.log)"; tail -5 "$LOGDIR/bench.log"; STATUS=1
  fi
  # A cut run leaves the JSON unfinished (unreadable): then the console lines are the table.
  if [[ -s "$LOGDIR/bench.json" ]] && command -v python3 >/dev/null && BENCH_MD="$(python3 - "$LOGDIR/bench.json" 2>/dev/null <<'PY'
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
)"; then
    :
  elif grep -qE '^[A-Za-z0-9_/:.]+ +[0-9.]+ [mun]?s ' "$LOGDIR/bench.log"; then
    BENCH_MD="$([[ $rc -eq 124 || $rc -eq 137 ]] && echo "cut by the deadline after ${budget} s; the console lines so far:" || echo "exit $rc; no JSON; the console lines:")"$'\n\n```\n'"$(grep -E '^(Benchmark|-{10}|[A-Za-z0-9_/:.]+ +[0-9.]+ [mun]?s )' "$LOGDIR/bench.log")"$'\n```'
  else
    BENCH_MD="no results (exit $rc): $(tail -3 "$LOGDIR/bench.log" | tr '\n' ' ')"
  fi
  write_report "after the benchmarks"
fi

write_report "finished$([[ -n "$CUT" ]] && echo ", cut by the deadline:$CUT")"
say "report: $REPORT (logs: $LOGDIR$([[ -n "${OUT:-}" ]] && echo "; copied to \$OUT with gpu_check_logs.tar.gz"))"
# The device tool returns only the output's tail: the report without the benchmark table comes last.
echo
sed '/^## Benchmarks/,$d' "$REPORT"
echo "## Benchmarks"
echo
head -8 <<<"$BENCH_MD"
rows=$(grep -c '^| [^-]' <<<"$BENCH_MD")
(( rows > 7 )) && echo "... $((rows - 1)) benchmark rows in all: see the report"
if [[ $STATUS -ne 0 ]]; then exit 1; fi
[[ -n "$CUT" ]] && exit 4
exit 0
