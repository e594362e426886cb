#!/usr/bin/env bash
# A GPU session in one device call: a lent GPU comes with 15 minutes of device time in all (starts,
# idle time and transfers included), so everything is built and staged on the build machine and
# this script runs the checks in priority order under one deadline (about 8 minutes), cutting from
# the bottom what does not fit:
#   1 tests      every `cuda` test executable (kernels_cuda, optim_cuda, nn_cuda, e2e_cuda)
#   2 step       ResNet-50 224 px batch 128 training steps, minidl beside PyTorch at its best
#                (channels_last, autocast + GradScaler, cudnn.benchmark, fused SGD): AMP, then TF32
#   3 sanitizer  compute-sanitizer memcheck on kernels_cuda
#   4 model      each kernel of the step-time model, modelled against measured (when staged)
#   4b profile   PyTorch's AMP step under torch.profiler, by kernel category, beside minidl's
#   5 bench      the short benchmarks: copy bandwidth, elementwise and reductions as a share of it
#   6 maxbatch   the largest AMP batch under an 11 GiB budget, minidl and PyTorch
# The report (lab/results/bench/gpu_check_<date>_<commit>.md) and a state tarball are rewritten after
# every phase and copied to $OUT, so a call cut at any point returns what it measured, and a second,
# shorter call (--resume) runs only the phases the first did not finish (the plan: lab/README.md,
# "A GPU session: the plan").
#
#   tools/gpu_check.sh --stage [DIR] [OPTIONS]
#                                       build machine: tools/gpu_stage.sh (DIR/stage.tar.xz, default
#                                       build-gpu-stage; also the studies stage and the photos;
#                                       OPTIONS go to gpu_stage.sh: --only tests, --photos SRC)
#   tools/gpu_check.sh [--rehearse] [--resume STATE] [DIR]
#                                       GPU machine: the check with DIR's stage (default
#                                       build-gpu-stage). --resume STATE: gpu_check_state.tar.gz of an
#                                       earlier call (carried in .gpu-results/): its finished phases
#                                       are kept, the others run. --rehearse: no GPU, the same
#                                       plumbing on the CPU (tests CPU against CPU, tiny step runs).
# Environment:
#   GPU_CHECK_DEADLINE   seconds for everything, report included (default 450; --rehearse 240)
#   GPU_CHECK_PHASES     the phases, in priority order (default tests,step,sanitizer,model,profile,bench,maxbatch)
#   GPU_CHECK_CAP_<PHASE> a phase's own cap in seconds (defaults: TESTS 60, STEP 190, SANITIZER 75,
#                        MODEL 45, PROFILE 45, BENCH 40, MAXBATCH 170); a phase gets min(cap, time left)
#   GPU_CHECK_STEP_SECONDS  timed seconds per step run (default 15; --rehearse 2)
#   GPU_CHECK_STEP_RUNS  step runs in order (default "minidl:amp:nhwc:graphs pytorch:amp:graphs pytorch:amp
#                        minidl:amp:nhwc minidl:amp minidl:tf32 pytorch:tf32"; FRAMEWORK:PRECISION[:OPTION...], options in this order
#                        nhwc (minidl), graphs (both), hostscaler (minidl), bN (batch N, default 128))
#   GPU_CHECK_STEP_MIN   seconds a step run needs at least to be started (default 20)
#   GPU_CHECK_MODEL_CONFIGS  the model phase's configurations (default resnet50-amp-nhwc,resnet50-amp;
#                        minidl-gpumodel --help)
#   GPU_CHECK_MODEL_BATCHES  the model phase's batches, one run each (default 256)
#   GPU_CHECK_SANITIZER_FILTER, GPU_CHECK_BENCH_FILTER: see tools/gpu_phases.sh
# Exit status: 0 all ran and passed, 1 a failure, 2 no usable GPU, 3 setup (stage, libraries),
# 4 nothing failed but a phase was cut or not reached (run the --resume call).
set -uo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT" || exit 3
GPU_ENV_PROG=gpu_check
# shellcheck source=tools/gpu_env.sh
source "$ROOT/tools/gpu_env.sh"

if [[ "${1:-}" == "--stage" ]]; then
  shift
  stage_dir=build-gpu-stage
  if [[ $# -gt 0 && "$1" != -* ]]; then stage_dir=$1; shift; fi
  exec bash "$ROOT/tools/gpu_stage.sh" --tests-dir "$stage_dir" "$@"
fi
ARGS="$*"
REHEARSE=0; RESUME=""; DIR=""
while [[ $# -gt 0 ]]; do
  case "$1" in
    --rehearse) REHEARSE=1; shift ;;
    --resume) RESUME="${2:?--resume needs the gpu_check_state.tar.gz of an earlier call}"; shift 2 ;;
    -h|--help) awk 'NR > 1 && !/^#/ {exit} NR > 1 {sub(/^# ?/, ""); print}' "${BASH_SOURCE[0]}"; exit 0 ;;
    -*) die 3 "unknown option '$1' (see --help)" ;;
    *) DIR="$1"; shift ;;
  esac
done
DEADLINE="${GPU_CHECK_DEADLINE:-$([[ $REHEARSE == 1 ]] && echo 240 || echo 450)}"
PHASES="${GPU_CHECK_PHASES:-tests,step,sanitizer,model,profile,bench,maxbatch}"
START=$SECONDS
left() { echo $((DEADLINE - (SECONDS - START))); }
REPORT_RESERVE=10   # seconds kept for the last report
PHASE_MIN=15        # a phase is not started with less than this

# shellcheck source=tools/gpu_phases.sh
source "$ROOT/tools/gpu_phases.sh"
for p in ${PHASES//,/ }; do
  declare -F "phase_$p" >/dev/null || die 3 "GPU_CHECK_PHASES: '$p' is not one of tests, step, sanitizer, model, profile, bench, maxbatch"
done

# SIGTERM (the device tool's own limit): stop the running program, write the report, exit 4.
# shellcheck disable=SC2317  # reached through the trap
on_term() {
  trap '' TERM
  gpu_env_stop_child 5
  [[ ${REPORT_READY:-0} == 1 ]] && write_report "stopped by SIGTERM at $((SECONDS - START)) s" && say "report: $REPORT"
  die 4 "stopped by SIGTERM after $((SECONDS - START)) s"
}
trap on_term TERM

gpu_env_detect_gpu || exit 2
say "GPU: $GPU_LINE; deadline ${DEADLINE} s; phases $PHASES"

# ---------------------------------------------------------------- the stage
DIR="${DIR:-build-gpu-stage}"
[[ -f "$DIR/stage.tar.xz" ]] || die 3 "$DIR/stage.tar.xz not found: stage it on the build machine with 'tools/gpu_check.sh --stage' and carry $DIR"
WORK="$(mktemp -d /tmp/gpu_check.XXXXXX)"
gpu_env_unpack "$DIR/stage.tar.xz" "$WORK" || die 3 "cannot unpack $DIR/stage.tar.xz (needs xz or python3 with lzma)"
BIN="$WORK/bin"
COMMIT="$(head -1 "$WORK/COMMIT" 2>/dev/null || echo unknown)"
say "executables from $DIR (commit $COMMIT), unpacked in $WORK after $((SECONDS - START)) s"
gpu_env_lib_path "$WORK/lib"
MISSING="$(gpu_env_missing_libs "$BIN"/*)"
if [[ -n "$MISSING" ]]; then
  die 3 "libraries not found with LD_LIBRARY_PATH=$LD_LIBRARY_PATH:
$MISSING
(cuDNN 9 / cuBLAS 13 / cudart 13 are expected from the machine's PyTorch or CUDA toolkit; the others from the stage)"
fi
CUDA_LIBS="$(gpu_env_cuda_libs "$BIN/kernels_cuda")"
say "$CUDA_LIBS"
gpu_env_torch_python
say "PyTorch: $TORCH_LINE"
[[ $REHEARSE == 1 ]] && export MINIDL_PARITY_SELF_TEST=1

LOGDIR="$WORK/logs"; SEC="$WORK/sections"; mkdir -p "$LOGDIR" "$SEC"
STATE="$SEC/state"   # one line per finished phase: "phase status seconds call"
CALL=1
if [[ -n "$RESUME" ]]; then
  [[ -f "$RESUME" ]] || die 3 "--resume $RESUME: no such file (the gpu_check_state.tar.gz an earlier call returned)"
  tar -C "$SEC" -xzf "$RESUME" || die 3 "--resume $RESUME: cannot unpack"
  CALL=$(( $(awk '{print $4}' "$STATE" 2>/dev/null | sort -n | tail -1) + 1 ))
  [[ -f "$SEC/commit" && "$(cat "$SEC/commit")" != "$COMMIT" ]] \
    && die 3 "--resume $RESUME: it holds results of commit $(cat "$SEC/commit"), this stage is $COMMIT"
  say "resuming: phases already done: $(awk '{printf "%s(%s) ", $1, $2}' "$STATE" 2>/dev/null)"
fi
echo "$COMMIT" >"$SEC/commit"
DATE="$(date -u +%Y-%m-%d)"
mkdir -p lab/results/bench
REPORT="lab/results/bench/gpu_check_${DATE}_${COMMIT%%[ +]*}$([[ $REHEARSE == 1 ]] && echo _rehearsal).md"
STATUS=0; CUT=""

# A phase is done when its latest line is not "cut" (a cut phase runs again in the --resume call).
done_phase() { awk -v p="$1" '$1 == p {last = $2} END {exit !(last != "" && last != "cut")}' "$STATE" 2>/dev/null; }

# Rewritten after every phase, so a run stopped at any point has a report.
write_report() {
  {
    echo "# GPU check, $DATE"
    echo
    [[ $REHEARSE == 1 ]] && echo "**CPU rehearsal (--rehearse): no GPU was used; these are not GPU results.**" && echo
    echo "- command: \`tools/gpu_check.sh $ARGS\` (call $CALL; deadline ${DEADLINE} s; report written at $((SECONDS - START)) s: $1)"
    echo "- commit: $COMMIT"
    echo "- date: $(date -u '+%Y-%m-%d %H:%M UTC')"
    gpu_env_machine_md
    echo "- libraries: $CUDA_LIBS"
    echo "- PyTorch: $TORCH_LINE"
    echo "- phases (priority order): $PHASES"
    echo
    echo "| phase | status | seconds | call |"
    echo "| --- | --- | ---: | ---: |"
    local p
    for p in ${PHASES//,/ }; do
      if grep -q "^$p " "$STATE" 2>/dev/null; then
        awk -v p="$p" '$1 == p {line = sprintf("| %s | %s | %s | %s |", $1, $2, $3, $4)} END {print line}' "$STATE"
      else echo "| $p | not run yet | | |"; fi
    done
    for p in ${PHASES//,/ }; do
      echo
      if [[ -f "$SEC/$p.md" ]]; then cat "$SEC/$p.md"; else echo "## $p"; echo; echo "not run yet"; fi
    done
  } >"$REPORT"
  tar -C "$SEC" -czf "$WORK/gpu_check_state.tar.gz" . 2>/dev/null
  if [[ -n "${OUT:-}" && -d "${OUT:-}" ]]; then
    cp "$REPORT" "$OUT/$(basename "$REPORT" | tr -c 'A-Za-z0-9._\n-' '-')" 2>/dev/null
    cp "$WORK/gpu_check_state.tar.gz" "$OUT/" 2>/dev/null
    tar -C "$LOGDIR" -czf "$OUT/gpu_check_logs.tar.gz" . 2>/dev/null
  fi
  return 0
}
write_report "starting"
REPORT_READY=1

# ---------------------------------------------------------------- the phases, in priority order
for p in ${PHASES//,/ }; do
  if done_phase "$p"; then say "$p: done in an earlier call"; continue; fi
  cap_var="GPU_CHECK_CAP_${p^^}"
  budget=$(gpu_env_min "${!cap_var:-$(phase_default_cap "$p")}" $(($(left) - REPORT_RESERVE)))
  if (( budget < PHASE_MIN )); then
    say "$p: not started (${budget} s left)"; CUT+=" $p"; echo "$p cut 0 $CALL" >>"$STATE"; continue
  fi
  say "$p: at most ${budget} s"
  t0=$SECONDS
  PHASE_RC=0
  "phase_$p" "$budget"
  case $PHASE_RC in
    0) status=passed ;;
    1) status=failed; STATUS=1 ;;
    4) status=cut; CUT+=" $p" ;;
    5) status=skipped ;;
    *) status="exit $PHASE_RC"; STATUS=1 ;;
  esac
  echo "$p $status $((SECONDS - t0)) $CALL" >>"$STATE"
  say "$p: $status after $((SECONDS - t0)) s"
  write_report "after $p"
done

write_report "finished$([[ -n "$CUT" ]] && echo "; cut or not reached:$CUT")"
say "report: $REPORT (logs and state: $WORK$([[ -n "${OUT:-}" ]] && echo "; copied to \$OUT"))"
# The device tool returns only the output's tail: the report's summary comes last.
echo
sed -n '1,/^## /p' "$REPORT" | sed '$d'
for p in ${PHASES//,/ }; do [[ -f "$SEC/$p.md" ]] && head -c 1500 "$SEC/$p.md" && echo; done
if [[ $STATUS -ne 0 ]]; then exit 1; fi
[[ -n "$CUT" ]] && exit 4
exit 0
